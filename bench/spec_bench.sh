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
# Then the draft model (hearthd.conf draft_model), every workload with drafts off, from the
# lookup only, from the draft model only and from both (protocol `draft`): the demo model
# drafting for itself (acceptance as high as a draft can get, at the cost of a draft as big
# as its model), a larger target of the demo vocabulary drafted for by the demo model when
# HEARTH_SPEC_TARGET names one, and the 1.7B file drafted for by a tiny random model of its
# vocabulary (mkmodel: drafts that fail, what they cost). With HEARTH_IK_BIN, ik_llama.cpp's
# llama-speculative runs the same greedy prompts on the demo pair (HEARTH_SPEC_F32, the F32
# demo model, as its target; the Q8_0 as draft) against its llama-simple.
# Passage: bench/spec_passage.txt (public-domain KJV text). Run from the build directory.
# Environment: HEARTH_BENCH_DIR (default $TMPDIR/hearth-bench-speed), HEARTH_SPEC_RESULTS
# (default bench-results/spec), HEARTH_BENCH_THREADS (2), HEARTH_SPEC_ROUNDS (3),
# HEARTH_SPEC_TOKENS (64), HEARTH_IK_BIN, HEARTH_SPEC_TARGET, HEARTH_SPEC_F32.
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

# drive TAG MODEL MAX_CONTEXT PASSAGE_BYTES [HEARTHD-OPTION...]: one hearthd on MODEL,
# spec_drive.py against it (in the modes HEARTH_SPEC_MODES names, if set).
drive() {
	tag=$1 model=$2 ctx=$3 bytes=$4
	shift 4
	say "$tag: hearthd on $model $*"
	"$builddir/hearthd" --model="$model" --socket="$tmp/h.sock" --threads="$threads" \
		--max-context="$ctx" --log-level=warning "$@" >"$tmp/hearthd-$tag.log" 2>&1 &
	hpid=$!
	"$py" "$srcdir/bench/spec_drive.py" "$tmp/h.sock" "$rounds" "$tokens" "$passage" "$bytes" \
		>"$res/hearth-$tag.json" || { say "spec_drive failed; hearthd said:"; cat "$tmp/hearthd-$tag.log" >&2; exit 1; }
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
# ---- the draft model ----
kjv=$srcdir/models/hearth-kjv-q8_0.gguf
export HEARTH_SPEC_MODES=off,lookup,model,auto
drive draft-kjv-self "$kjv" 256 300 --draft-model="$kjv"
if [ -n "${HEARTH_SPEC_TARGET:-}" ]; then
	drive draft-target "$HEARTH_SPEC_TARGET" 256 300 --draft-model="$kjv"
fi
if [ -f "$q40" ]; then
	tiny=$dir/qwen3-vocab-tiny.gguf
	[ -f "$tiny" ] || "$builddir/tests/mkmodel" --vocab "$q40" --preset tiny --arch qwen3 -o "$tiny" >&2
	drive draft-qwen3-1.7b "$q40" 1024 600 --draft-model="$tiny"
fi
unset HEARTH_SPEC_MODES

f32=${HEARTH_SPEC_F32:-}
if [ -n "${HEARTH_IK_BIN:-}" ] && [ -x "$HEARTH_IK_BIN/llama-speculative" ] && [ -n "$f32" ] && [ -f "$f32" ]; then
	say "ik_llama.cpp: llama-simple and llama-speculative (draft $kjv) on $f32, $rounds rounds"
	"$py" "$srcdir/bench/spec_drive.py" prompts "$passage" 300 >"$tmp/prompts-kjv.json"
	"$py" - "$HEARTH_IK_BIN" "$f32" "$kjv" "$tmp/prompts-kjv.json" "$rounds" "$tokens" "$threads" \
		>"$res/ik-draft.json" <<'EOF'
import json, re, subprocess, sys
ik, model, draft, prompts, rounds, tokens, threads = sys.argv[1:8]
prompts = json.load(open(prompts))
common = ["-m", model, "-t", threads, "-c", "256"]
# Its draft stage, greedy, at most 8 tokens a draft (its own default is 16).
spec = ["-md", draft, "--spec-type", "draft:n_max=8,p_min=0.0", "--temp", "0"]


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, errors="replace").stderr


def speed(cmd, t):
    m = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ s(?:econds)?, speed:\s+([\d.]+) t/s", t)
    if not m:
        sys.exit(f"{cmd[0]}: no speed line")
    return float(m.group(1))


# llama-simple's -n counts the prompt too: a first speculative run (untimed, a warm-up as
# well) says how long each prompt is.
n_prompt = {}
for name, p in prompts.items():
    t = run([ik + "/llama-speculative", *common, *spec, "-n", tokens, "-p", p])
    m = re.search(r"encoded\s+(\d+) tokens", t)
    if not m:
        sys.exit("llama-speculative: no encoded line")
    n_prompt[name] = int(m.group(1))
out = {}
for r in range(int(rounds)):
    for name, p in prompts.items():
        o = out.setdefault(name, {"plain": [], "speculative": [], "accept": []})
        for tool in (("simple", "spec") if r % 2 == 0 else ("spec", "simple")):
            if tool == "simple":
                cmd = [ik + "/llama-simple", *common, "-n", str(n_prompt[name] + int(tokens)), "-p", p]
            else:
                cmd = [ik + "/llama-speculative", *common, *spec, "-n", tokens, "-p", p]
            t = run(cmd)
            o["plain" if tool == "simple" else "speculative"].append(speed(cmd, t))
            a = re.search(r"accept\s+=\s+([\d.]+)%", t)
            if tool == "spec" and a:
                o["accept"].append(float(a.group(1)))
        print(f"ik round {r + 1}: {name} {o['plain'][-1]:.1f} -> {o['speculative'][-1]:.1f} t/s", file=sys.stderr)
print(json.dumps({"engine": "ik_llama.cpp", "rounds": int(rounds), "tokens": int(tokens), "runs": out}))
EOF
fi
say "results in $res"
