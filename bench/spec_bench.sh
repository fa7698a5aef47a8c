#!/bin/sh
# `make bench-spec` (part of `make bench`, never of make check): what speculative decoding
# (prompt lookup, protocol `speculate`) buys per workload. A hearthd per model runs
# bench/spec_drive.py: every workload with drafts off and at the daemon's default, in
# alternating rounds. Models: the trained demo model (models/hearth-kjv-q8_0.gguf; real text,
# but 2.9M parameters, so a step is dominated by fixed costs, not by reading weights) and the
# Qwen3-1.7B-shaped Q4_0 file of bench/run.sh when it exists (random weights, whose greedy
# output falls into loops that the lookup then drafts). With HEARTH_IK_BIN naming a native
# ik_llama.cpp build, its llama-simple (no drafts) and llama-lookup (its prompt-lookup
# speculative decoding) run the same greedy prompts on the 1.7B file, alternating too.
# Passage: bench/spec_passage.txt (public-domain KJV text). Run from the build directory.
# Environment: HEARTH_BENCH_DIR (default $TMPDIR/hearth-bench-speed), HEARTH_SPEC_RESULTS
# (default bench-results/spec), HEARTH_BENCH_THREADS (2), HEARTH_SPEC_ROUNDS (3),
# HEARTH_SPEC_TOKENS (64), HEARTH_IK_BIN.
set -eu

builddir=${HEARTH_BUILDDIR:-$(pwd)}
srcdir=${HEARTH_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
dir=${HEARTH_BENCH_DIR:-${TMPDIR:-/tmp}/hearth-bench-speed}
res=${HEARTH_SPEC_RESULTS:-$builddir/bench-results/spec}
threads=${HEARTH_BENCH_THREADS:-2}
rounds=${HEARTH_SPEC_ROUNDS:-3}
tokens=${HEARTH_SPEC_TOKENS:-64}
passage=$srcdir/bench/spec_passage.txt
py=/usr/bin/python3

say() { echo "bench-spec: $*" >&2; }

mkdir -p "$res"
rm -f "$res"/*.json
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-spec.XXXXXX")
hpid=
trap '[ -n "$hpid" ] && kill "$hpid" 2>/dev/null; rm -rf "$tmp"' EXIT INT TERM
say "machine: $(nproc) cpus, load average $(cut -d' ' -f1-3 /proc/loadavg)"

# drive TAG MODEL MAX_CONTEXT PASSAGE_BYTES: one hearthd on MODEL, spec_drive.py against it.
drive() {
	say "$1: hearthd on $2"
	"$builddir/hearthd" --model="$2" --socket="$tmp/h.sock" --threads="$threads" \
		--max-context="$3" --log-level=warning >"$tmp/hearthd-$1.log" 2>&1 &
	hpid=$!
	"$py" "$srcdir/bench/spec_drive.py" "$tmp/h.sock" "$rounds" "$tokens" "$passage" "$4" \
		>"$res/hearth-$1.json" || { say "spec_drive failed; hearthd said:"; cat "$tmp/hearthd-$1.log" >&2; exit 1; }
	kill "$hpid"
	wait "$hpid" 2>/dev/null || true
	hpid=
	rm -f "$tmp/h.sock"
}

# The demo model's context is 256 tokens: a shorter passage keeps prompt and output inside.
drive kjv "$srcdir/models/hearth-kjv-q8_0.gguf" 256 300
q40=$dir/qwen3-1.7b-q4_0.gguf
if [ -f "$q40" ]; then
	drive qwen3-1.7b "$q40" 1024 600
else
	say "no $q40 (make bench-speed writes it): the demo model only"
fi

if [ -n "${HEARTH_IK_BIN:-}" ] && [ -x "$HEARTH_IK_BIN/llama-lookup" ] && [ -f "$q40" ]; then
	say "ik_llama.cpp: llama-simple and llama-lookup on the same prompts, $rounds rounds"
	"$py" "$srcdir/bench/spec_drive.py" prompts "$passage" 600 >"$tmp/prompts.json"
	"$py" - "$HEARTH_IK_BIN" "$q40" "$tmp/prompts.json" "$rounds" "$tokens" "$threads" \
		>"$res/ik.json" <<'EOF'
import json, re, subprocess, sys
ik, model, prompts, rounds, tokens, threads = sys.argv[1:7]
prompts = json.load(open(prompts))
common = ["-m", model, "-t", threads, "-rtr"]


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace").stderr


# llama-simple's -n counts the prompt too: a first lookup run (untimed, a warm-up as well)
# says how many tokens each prompt is.
n_prompt = {}
for name, p in prompts.items():
    t = run([ik + "/llama-lookup", *common, "-n", tokens, "-p", p, "--temp", "0", "-c", "1024"])
    m = re.search(r"prompt eval time =\s+[\d.]+ ms /\s+(\d+) tokens", t)
    if not m:
        sys.exit("llama-lookup: no prompt eval line")
    n_prompt[name] = int(m.group(1))
out = {}
for r in range(int(rounds)):
    for name, p in prompts.items():
        o = out.setdefault(name, {"plain": [], "lookup": [], "accept": []})
        for tool in (("simple", "lookup") if r % 2 == 0 else ("lookup", "simple")):
            if tool == "simple":
                cmd = [ik + "/llama-simple", *common, "-n", str(n_prompt[name] + int(tokens)), "-p", p]
            else:
                cmd = [ik + "/llama-lookup", *common, "-n", tokens, "-p", p, "--temp", "0", "-c", "1024"]
            t = run(cmd)
            m = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ s(?:econds)?, speed:\s+([\d.]+) t/s", t)
            if not m:
                sys.exit(f"{cmd[0]}: no speed line")
            o["plain" if tool == "simple" else "lookup"].append(float(m.group(1)))
            a = re.search(r"accept\s+=\s+([\d.]+)%", t)
            if tool == "lookup" and a:
                o["accept"].append(float(a.group(1)))
        print(f"ik round {r + 1}: {name} {o['plain'][-1]:.1f} -> {o['lookup'][-1]:.1f} t/s", file=sys.stderr)
print(json.dumps({"engine": "ik_llama.cpp", "rounds": int(rounds), "tokens": int(tokens), "runs": out}))
EOF
fi
say "results in $res"
