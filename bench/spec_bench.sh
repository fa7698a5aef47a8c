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
# vocabulary (mkmodel: drafts that fail, what they cost). With HEARTH_IK_BIN and/or
# HEARTH_LLAMA_BIN, the anchors' llama-server (ik_llama.cpp, mainline llama.cpp) without and with
# the same draft model answer the same workloads on the same files in the same alternating
# rounds as hearthd, for the demo pair and the larger target (bench/anchor_spec.py, run by
# spec_drive.py).
# Passage: bench/spec_passage.txt (public-domain KJV text). Run from the build directory.
# Environment: HEARTH_BENCH_DIR (default $TMPDIR/hearth-bench-speed), HEARTH_SPEC_RESULTS
# (default bench-results/spec), HEARTH_BENCH_THREADS (2), HEARTH_SPEC_ROUNDS (3),
# HEARTH_SPEC_TOKENS (64), HEARTH_IK_BIN, HEARTH_LLAMA_BIN (anchor build directories),
# HEARTH_SPEC_TARGET, HEARTH_SPEC_ONLY=draft (the draft-model part alone) or target (HEARTH_SPEC_TARGET's part).
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
only=${HEARTH_SPEC_ONLY:-}
case $only in
draft) rm -f "$res"/*draft*.json ;;
target) rm -f "$res"/hearth-draft-target.json ;;
*) rm -f "$res"/*.json ;;
esac
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bench-spec.XXXXXX")
hpid=
trap '[ -n "$hpid" ] && kill "$hpid" 2>/dev/null; rm -rf "$tmp"' EXIT INT TERM
say "machine: $(nproc) cpus, load average $(cut -d' ' -f1-3 /proc/loadavg)"
export HEARTH_BENCH_THREADS="$threads"

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
q40=$dir/qwen3-1.7b-q4_0.gguf
if [ -n "$only" ]; then
	say "HEARTH_SPEC_ONLY=$only: the lookup part is left out"
else
	drive kjv "$srcdir/models/hearth-kjv-q8_0.gguf" 256 300
	if [ -f "$q40" ]; then
		drive qwen3-1.7b "$q40" 1024 600
	else
		say "no $q40 (make bench-speed writes it): the demo model only"
	fi

	if [ -n "${HEARTH_IK_BIN:-}" ] && [ -x "$HEARTH_IK_BIN/llama-lookup" ] && [ -f "$q40" ]; then
		say "ik_llama.cpp: llama-simple and llama-lookup on the same prompts, $rounds rounds"
		"$py" "$srcdir/bench/spec_drive.py" prompts "$passage" 600 >"$tmp/prompts.json"
		"$py" "$srcdir/bench/ik_spec.py" lookup "$HEARTH_IK_BIN" "$q40" "$tmp/prompts.json" "$rounds" "$tokens" \
			"$threads" >"$res/ik.json"
	fi
fi
# ---- the draft model ----
kjv=$srcdir/models/hearth-kjv-q8_0.gguf
export HEARTH_SPEC_MODES=off,lookup,model,auto
if [ -n "${HEARTH_IK_BIN:-}${HEARTH_LLAMA_BIN:-}" ]; then
	say "anchors: llama-server of ${HEARTH_IK_BIN:-(no ik_llama.cpp)} and ${HEARTH_LLAMA_BIN:-(no mainline)}"
	export HEARTH_IK_BIN HEARTH_LLAMA_BIN
fi
if [ "$only" != target ]; then
	export HEARTH_SPEC_ANCHOR_MODELS="$kjv,$kjv"
	drive draft-kjv-self "$kjv" 256 300 --draft-model="$kjv"
fi
if [ -n "${HEARTH_SPEC_TARGET:-}" ]; then
	export HEARTH_SPEC_ANCHOR_MODELS="$HEARTH_SPEC_TARGET,$kjv"
	drive draft-target "$HEARTH_SPEC_TARGET" 256 300 --draft-model="$kjv"
fi
unset HEARTH_SPEC_ANCHOR_MODELS
if [ -f "$q40" ] && [ "$only" != target ]; then
	tiny=$dir/qwen3-vocab-tiny.gguf
	[ -f "$tiny" ] || "$builddir/tests/mkmodel" --vocab "$q40" --preset tiny --arch qwen3 -o "$tiny" >&2
	drive draft-qwen3-1.7b "$q40" 1024 600 --draft-model="$tiny"
fi
unset HEARTH_SPEC_MODES

say "results in $res"
