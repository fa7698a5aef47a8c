#!/usr/bin/python3
"""hearth's side of `make bench-spec`: decode speed of a running hearthd with speculative
decoding off (speculate 0) and at the daemon's default, per workload, in alternating rounds
so that a shared machine's drift falls on both alike.

usage: bench/spec_drive.py SOCKET ROUNDS TOKENS PASSAGE_FILE [PASSAGE_BYTES]
       bench/spec_drive.py prompts PASSAGE_FILE [PASSAGE_BYTES]   (the greedy workloads'
       prompts as one JSON object, for an anchor's runs)
Workloads, all from one passage of text (the first PASSAGE_BYTES, default 600, of
PASSAGE_FILE, cut at a word; small enough that prompt and output fit the model's context):
  quote    the passage, a blank line, and its first words again: an answer that quotes its
           source (extracting, summarising with citations)
  rewrite  the passage, a blank line, and the passage again with its first half reworded
           (thou -> you, unto -> to): a rewrite that keeps most of the text
  json     the passage and a JSON Schema asking for {"quote": string, "words": integer}
  free     a short prompt and greedy continuation (nothing to look up but the output itself)
  sampled  the same at temperature 0.8, fixed seed
Each round runs every workload in every mode (the order flips every round). Modes: off and on
(the daemon's default), or what HEARTH_SPEC_MODES lists (comma-separated) of off, on, lookup,
model and auto (protocol `draft`: prompt lookup only, the daemon's draft model only, or lookup
where it matches and the model elsewhere). Prints one JSON object: per workload and mode the
daemon's decode tokens/s (done.decode_tps), tokens, and the draft tokens verified and accepted,
in all and of the draft model (stats before and after the request).
With HEARTH_SPEC_ANCHOR_MODELS=TARGET,DRAFT and HEARTH_IK_BIN / HEARTH_LLAMA_BIN, the anchors'
llama-server without and with the draft model (bench/anchor_spec.py) answer every workload in
the same rounds, in the same flipping order ("anchors" in the output: their generation-only
tokens/s, drafted and accepted counts, and whether the draft changed their text).
"""
import os
import json
import sys

import anchor_spec  # bench/anchor_spec.py
import drive  # bench/drive.py: also puts the Python client on the path

SCHEMA = json.dumps({"type": "object", "properties": {"quote": {"type": "string"},
                                                       "words": {"type": "integer"}},
                     "required": ["quote", "words"], "additionalProperties": False})


def passage_of(path, n_bytes):
    text = " ".join(open(path, encoding="utf-8").read().split())
    cut = text[:n_bytes]
    return cut[:cut.rfind(" ")] if " " in cut else cut


def workloads(p):
    half = len(p) // 2
    reworded = p[:half].replace("thou ", "you ").replace("unto ", "to ") + p[half:]
    first = " ".join(p.split()[:6])
    return {
        "quote": (p + "\n\n" + first, dict(temperature=0.0)),
        "rewrite": (p + "\n\n" + reworded[:half], dict(temperature=0.0)),
        "json": (p + "\n", dict(temperature=0.0, json_schema=SCHEMA)),
        "free": ("And it came to pass", dict(temperature=0.0)),
        "sampled": ("And it came to pass", dict(temperature=0.8, seed=7)),
    }


def main(argv):
    if len(argv) in (3, 4) and argv[1] == "prompts":
        work = workloads(passage_of(argv[2], int(argv[3]) if len(argv) == 4 else 600))
        print(json.dumps({n: w[0] for n, w in work.items() if n in ("quote", "rewrite", "free")}))
        return 0
    if len(argv) not in (5, 6):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    sock, rounds, tokens = argv[1], int(argv[2]), int(argv[3])
    work = workloads(passage_of(argv[4], int(argv[5]) if len(argv) == 6 else 600))
    c = drive.connect(sock, "bench-spec")
    if c is None:
        return 1

    modes = os.environ.get("HEARTH_SPEC_MODES", "off,on").split(",")
    extras = {"off": {"speculate": 0}, "on": {}, "lookup": {"draft": "lookup"},
              "model": {"draft": "model"}, "auto": {"draft": "auto"}}
    if modes[0] != "off" or any(m not in extras for m in modes):
        print(f"spec_drive: HEARTH_SPEC_MODES {modes}: off first, then of {list(extras)}", file=sys.stderr)
        return 2

    def run(name, mode):
        prompt, params = work[name]
        before = c.stats()
        g = c.generate(prompt, max_tokens=tokens, ignore_eos=True, **params, **extras[mode]).wait()
        after = c.stats()
        d = g.done
        return {"decode_tps": d["decode_tps"], "n_gen": d["n_gen"],
                "drafted": after["draft_tokens"] - before["draft_tokens"],
                "accepted": after["draft_accepted"] - before["draft_accepted"],
                "model_drafted": after["draft_model_tokens"] - before["draft_model_tokens"],
                "model_accepted": after["draft_model_accepted"] - before["draft_model_accepted"],
                "tokens": [t.id for t in g.tokens]}

    servers, info = anchor_spec.start()
    try:
        return rounds_of(work, modes, run, servers, info, rounds, tokens)
    finally:
        anchor_spec.stop(servers)


def rounds_of(work, modes, run, servers, info, rounds, tokens):
    """Every workload in every hearth mode and on every anchor server, per round, the order
    flipping every round; prints the results' JSON."""
    def run_anchor(name, engine, arm):
        prompt, params = work[name]
        return servers[engine][arm].generate(prompt, tokens, params["temperature"], params.get("seed"),
                                             params.get("json_schema"))

    steps = [("hearth", m) for m in modes] + [(e, a) for e in servers for a in ("plain", "draft")]
    for name in work:            # warm-up: faults the weights in, compiles the schema
        run(name, "off")
        for engine, arm in steps[len(modes):]:
            run_anchor(name, engine, arm)
    res = {n: {m: [] for m in modes} for n in work}
    anc = {e: {n: {"plain": [], "draft": []} for n in work} for e in servers}
    same = {n: True for n in work}
    anc_same = {e: {n: True for n in work} for e in servers}
    for r in range(rounds):
        for name in work:
            for who, mode in (steps if r % 2 == 0 else steps[::-1]):
                if who == "hearth":
                    res[name][mode].append(run(name, mode))
                else:
                    anc[who][name][mode].append(run_anchor(name, who, mode))
            same[name] &= all(res[name]["off"][-1]["tokens"] == res[name][m][-1]["tokens"] for m in modes)
            for e in servers:
                anc_same[e][name] &= anc[e][name]["plain"][-1]["text"] == anc[e][name]["draft"][-1]["text"]
        print(f"spec_drive: round {r + 1}/{rounds}: " + ", ".join(
            f"{n} " + "/".join(f"{res[n][m][-1]['decode_tps']:.1f}" for m in modes)
            + "".join(f" {e} {anc[e][n]['plain'][-1]['decode_tps']:.1f}/{anc[e][n]['draft'][-1]['decode_tps']:.1f}"
                      for e in servers)
            for n in work) + f" tok/s ({'/'.join(modes)})", file=sys.stderr)
    for n in work:
        for mode in res[n]:
            for x in res[n][mode]:
                del x["tokens"]
        for e in servers:
            for arm in ("plain", "draft"):
                for x in anc[e][n][arm]:
                    del x["text"]
    out = {"engine": "hearth", "rounds": rounds, "tokens": tokens, "modes": modes,
           "runs": res, "same_output": same}
    if servers:
        out["anchors"] = {e: {**info[e], "runs": anc[e], "same_output": anc_same[e]} for e in servers}
    print(json.dumps(out))
    return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
