"""The anchors' side of bench/spec_drive.py's draft-model runs: llama-server of ik_llama.cpp
and of mainline llama.cpp on the same target and draft files, without and with the draft
model, asked the same workloads in the same alternating rounds as hearthd.

Why servers: hearthd is a server and reports its decode rate without the prompt; llama-server
reports the same (timings.predicted_per_second, generation only) with draft counts
(timings.draft_n, draft_n_accepted). ik_llama.cpp's llama-speculative cannot be the anchor:
with greedy sampling it drafts token 0 every time (its draft sampler is cloned from the
target's temperature-0 sampler, which leaves the candidates unsorted, and the example takes
the first candidate), so it accepts nothing; doc/benchmarks.md gives the reproduction.

Environment (all optional; without HEARTH_IK_BIN and HEARTH_LLAMA_BIN there are no anchors):
  HEARTH_IK_BIN, HEARTH_LLAMA_BIN   directories holding llama-server
  HEARTH_SPEC_ANCHOR_MODELS         TARGET,DRAFT (gguf paths): set by spec_bench.sh per pair
  HEARTH_BENCH_THREADS              compute threads per server (default 2)
  HEARTH_SPEC_ANCHOR_CTX            context of every server (default 256, the models')
  HEARTH_SPEC_ANCHOR_OMP_WAIT       OMP_WAIT_POLICY of the servers (default: unset, the
                                    OpenMP runtime's own spin-waiting, the anchors' fastest
                                    on an idle machine; passive: sleeping threads, which
                                    cost a quiet run 5-8x but win on a shared machine: ik's
                                    llama-server on the larger target, 2 CPUs at load
                                    average 5, 18-173 tok/s spinning, 409-675 passive).
                                    hearthd's pool spins briefly, then sleeps
                                    (kernels/pool.c).
"""
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

DRAFT_MAX = 8   # hearthd's default speculate: the longest draft on both sides

# Each engine's draft-model options: greedy drafts up to DRAFT_MAX tokens, no probability
# threshold (hearthd drafts greedily without one; a p_min stops a weak draft model's drafts
# early, which would measure the threshold, not the machinery).
ENGINES = {
    "ik_llama.cpp": ("HEARTH_IK_BIN",
                     lambda d: ["-md", d, "--spec-type", f"draft:n_max={DRAFT_MAX},n_min=0,p_min=0.0"]),
    "llama.cpp": ("HEARTH_LLAMA_BIN",
                  lambda d: ["-md", d, "--spec-type", "draft-simple", "--spec-draft-n-max", str(DRAFT_MAX), "--spec-draft-n-min", "0",
                             "--spec-draft-p-min", "0.0"]),
}

# hearthd's sampling defaults (protocol/msg.h), sent explicitly so both sides sample alike.
SAMPLING = {"top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, seconds=300):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=seconds) as r:
        return json.loads(r.read())


class Server:
    """One llama-server process; arm is "plain" (no draft) or "draft"."""

    def __init__(self, engine, bindir, target, draft, arm, threads, ctx, omp_wait):
        self.engine, self.arm = engine, arm
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix=f"spec-{engine}-{arm}-", suffix=".log", delete=False)
        cmd = [os.path.join(bindir, "llama-server"), "-m", target, "--host", "127.0.0.1",
               "--port", str(self.port), "-np", "1", "-c", str(ctx), "-t", str(threads),
               "-tb", str(threads)]
        if arm == "draft":
            cmd += ENGINES[engine][1](draft)
        self.cmd = cmd
        env = dict(os.environ)
        if omp_wait:
            env["OMP_WAIT_POLICY"] = omp_wait
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        for _ in range(1200):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{' '.join(cmd)} exited: {self.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{' '.join(cmd)}: no /health after 120 s")

    def tail(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()[-800:]

    def generate(self, prompt, tokens, temperature, seed=None, json_schema=None):
        body = {"prompt": prompt, "n_predict": tokens, "temperature": temperature,
                "ignore_eos": True, "cache_prompt": False, **SAMPLING}
        if seed is not None:
            body["seed"] = seed
        if json_schema is not None:
            body["json_schema"] = json.loads(json_schema)
        r = post(f"http://127.0.0.1:{self.port}/completion", body)
        t = r["timings"]
        return {"decode_tps": t["predicted_per_second"], "n_gen": t["predicted_n"],
                "drafted": t.get("draft_n", 0), "accepted": t.get("draft_n_accepted", 0),
                "text": r["content"]}

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        os.unlink(self.log.name)


def start():
    """The servers the environment asks for, as {engine: {"plain": Server, "draft": Server}},
    and a description of each engine's set-up for the results."""
    models = os.environ.get("HEARTH_SPEC_ANCHOR_MODELS", "")
    if not models:
        return {}, {}
    target, draft = models.split(",")
    threads = int(os.environ.get("HEARTH_BENCH_THREADS", "2"))
    ctx = int(os.environ.get("HEARTH_SPEC_ANCHOR_CTX", "256"))
    omp_wait = os.environ.get("HEARTH_SPEC_ANCHOR_OMP_WAIT", "")
    servers, info = {}, {}
    try:
        for engine, (var, draft_args) in ENGINES.items():
            bindir = os.environ.get(var, "")
            if not bindir or not os.access(os.path.join(bindir, "llama-server"), os.X_OK):
                continue
            servers[engine] = {}
            for arm in ("plain", "draft"):   # one by one, so that a failure stops those started
                servers[engine][arm] = Server(engine, bindir, target, draft, arm, threads, ctx, omp_wait)
            info[engine] = {"tool": "llama-server", "target": os.path.basename(target),
                            "draft": os.path.basename(draft), "threads": threads, "ctx": ctx,
                            "omp_wait": omp_wait or "default",
                            "draft_options": " ".join(a if a != draft else os.path.basename(a)
                                                      for a in draft_args(draft))}
    except Exception:
        stop(servers)
        raise
    return servers, info


def stop(servers):
    for arms in servers.values():
        for s in arms.values():
            s.stop()
