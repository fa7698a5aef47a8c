#!/bin/sh
# `make bench-grammar` (part of `make bench`, never of make check): what structured output costs.
# (1) bench/bench_grammar: compile time and per-step mask time (p50/p99/max) of every schema
# of tests/support/schemas on a Qwen3-sized vocabulary; (2) a hearthd on the Qwen3-1.7B-shaped
# Q4_0 file of bench/run.sh (written here when missing) decoding with and without the
# 10-property schema, and the long-keys schema with and without jump-forward, in alternating
# rounds (bench/grammar_drive.py); (3) llama.cpp on the same file with and without the same
# schema, alternating too (bench/llama_grammar.mjs). Run from the build directory.
# Environment: HEARTH_BENCH_DIR (models; default $TMPDIR/hearth-bench-speed, shared with
# bench-speed), HEARTH_GRAMMAR_RESULTS (default bench-results/grammar), HEARTH_BENCH_THREADS (2),
# HEARTH_GRAMMAR_ROUNDS (5), HEARTH_GRAMMAR_TOKENS (128).
set -eu

builddir=${HEARTH_BUILDDIR:-$(pwd)}
srcdir=${HEARTH_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
shared=${HEARTH_SHARED:?HEARTH_SHARED must name the shared fixtures directory (vocab/)}
dir=${HEARTH_BENCH_DIR:-${TMPDIR:-/tmp}/hearth-bench-speed}
res=${HEARTH_GRAMMAR_RESULTS:-$builddir/bench-results/grammar}
threads=${HEARTH_BENCH_THREADS:-2}
rounds=${HEARTH_GRAMMAR_ROUNDS:-5}
tokens=${HEARTH_GRAMMAR_TOKENS:-128}
vocab=$shared/vocab/ggml-vocab-gpt-2-pre-qwen2.gguf
libdir=$srcdir/bench/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
schemas=$srcdir/tests/support/schemas

say() { echo "bench-grammar: $*" >&2; }

libllama=
for f in "$libdir"/libllama.v*.so "$libdir"/libllama.so; do
	[ -f "$f" ] && { libllama=$f; break; }
done
if [ -z "$libllama" ] || ! command -v node >/dev/null; then
	say "llama.cpp comparison needs node and node-llama-cpp: make bench-deps"
	exit 1
fi
mkdir -p "$dir" "$res"
rm -f "$res"/*.json "$res"/*.txt

bf16=$dir/qwen3-1.7b-bf16.gguf
q40=$dir/qwen3-1.7b-q4_0.gguf
if [ ! -f "$q40" ]; then
	if [ ! -f "$bf16" ]; then
		say "writing $bf16 (mkmodel qwen3-1.7b bf16 seed 1, real qwen2 tokenizer; ~1 min)"
		"$builddir/tests/mkmodel" --preset qwen3-1.7b --type bf16 --seed 1 --vocab "$vocab" \
			--n-vocab 151936 -o "$bf16.tmp" >/dev/null
		mv "$bf16.tmp" "$bf16"
	fi
	say "quantizing $bf16 -> $q40 with llama_model_quantize"
	"$builddir/bench/llama_quantize" "$libllama" "$bf16" "$q40.tmp" q4_0 "$threads" \
		>"$dir/quantize-q4_0.log" 2>&1 || { say "quantize failed, see $dir/quantize-q4_0.log"; exit 1; }
	mv "$q40.tmp" "$q40"
fi
say "machine: $(nproc) cpus, load average $(cut -d' ' -f1-3 /proc/loadavg)"
cut -d' ' -f1-3 /proc/loadavg >"$res/load_before"

say "mask times (bench/bench_grammar) on every schema of tests/support/schemas"
for f in "$schemas"/*.json; do
	echo "schema $(basename "$f")"
	HEARTH_SHARED=$shared "$builddir/bench/bench_grammar" "$f"
done >"$res/masks.txt"

say "hearthd on $q40, $threads threads: plain / schema / schema + jump-forward, $rounds alternating rounds"
sock=$res/h.sock
"$builddir/hearthd" --model="$q40" --socket="$sock" --threads="$threads" --max-context=1024 \
	--log-level=warning >"$res/hearthd.log" 2>&1 &
hpid=$!
trap 'kill $hpid 2>/dev/null' EXIT
/usr/bin/python3 "$srcdir/bench/grammar_drive.py" "$sock" "$rounds" "$tokens" \
	"$schemas/ten_properties.json" "$schemas/long_keys.json" >"$res/hearth.json"
kill $hpid
wait $hpid 2>/dev/null || true
trap - EXIT

say "llama.cpp on $q40, $threads threads: plain / schema, $rounds alternating rounds"
node "$srcdir/bench/llama_grammar.mjs" --threads "$threads" --rounds "$rounds" --tokens "$tokens" \
	"$q40" "$schemas/ten_properties.json" >"$res/llama.json"
cut -d' ' -f1-3 /proc/loadavg >"$res/load_after"
say "results in $res"
