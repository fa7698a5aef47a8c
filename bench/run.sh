#!/bin/sh
# `make bench-speed` (part of `make bench`, never of make check): hearth against llama.cpp on a
# Qwen3-1.7B-shaped model, and on a Gemma-3-1B-shaped one (sliding-window layers) as a second
# row. Writes the BF16 models with tests/mkmodel, makes Q4_0 (and Q4_K_M of Qwen3) from them
# with llama.cpp's own quantizer, runs hearthd-tool bench and bench/llama_bench.mjs in one go and
# prints both with the ratios (bench/bench_report.mjs). Run from the build directory.
# Environment: HEARTH_BENCH_DIR (models + results; default $TMPDIR/hearth-bench-speed),
# HEARTH_BENCH_THREADS (2), HEARTH_BENCH_REPS (3), HEARTH_BENCH_PP (512), HEARTH_BENCH_TG (128),
# HEARTH_BENCH_OURS_Q4_0=0 skips hearth on the Q4_0 file (its codes carried over as group 32).
# Anchors: HEARTH_IK_BIN and HEARTH_LLAMA_BIN name the bin/ directories of native ik_llama.cpp
# and mainline llama.cpp builds (DEVELOPERS.md says how to build them). Each one found is
# measured with its own llama-bench on the same Q4_0 and Q4_K_M files in rounds alternating
# with hearth on the Q4_0 file; node-llama-cpp's prebuilt llama.cpp is the fallback when
# neither is set. llama-quantize of the mainline build makes the files when it is there.
set -eu

builddir=${HEARTH_BUILDDIR:-$(pwd)}
srcdir=${HEARTH_SRCDIR:-$(cd "$(dirname "$0")/.." && pwd)}
shared=${HEARTH_SHARED:?HEARTH_SHARED must name the shared fixtures directory (vocab/)}
dir=${HEARTH_BENCH_DIR:-${TMPDIR:-/tmp}/hearth-bench-speed}
threads=${HEARTH_BENCH_THREADS:-2}
reps=${HEARTH_BENCH_REPS:-3}
pp=${HEARTH_BENCH_PP:-512}
tg=${HEARTH_BENCH_TG:-128}
vocab=$shared/vocab/ggml-vocab-gpt-2-pre-qwen2.gguf
libdir=$srcdir/bench/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64

say() { echo "bench: $*" >&2; }

anchors=
for a in "ik_llama.cpp:${HEARTH_IK_BIN:-}" "llama.cpp:${HEARTH_LLAMA_BIN:-}"; do
	bin=${a#*:}
	[ -n "$bin" ] || continue
	[ -x "$bin/llama-bench" ] || { say "${a%%:*}: no llama-bench in $bin"; exit 1; }
	anchors="$anchors $a"
done
quantizer=
[ -n "${HEARTH_LLAMA_BIN:-}" ] && [ -x "$HEARTH_LLAMA_BIN/llama-quantize" ] &&
	quantizer=$HEARTH_LLAMA_BIN/llama-quantize
libllama=
for f in "$libdir"/libllama.v*.so "$libdir"/libllama.so; do
	[ -f "$f" ] && { libllama=$f; break; }
done
if [ -z "$anchors" ] || [ -z "$quantizer" ]; then
	if [ -z "$libllama" ] || ! command -v node >/dev/null; then
		say "llama.cpp comparison needs HEARTH_IK_BIN/HEARTH_LLAMA_BIN, or node and node-llama-cpp (make bench-deps)"
		exit 1
	fi
fi
if [ -n "$anchors" ]; then
	say "anchors: native$anchors"
else
	say "anchors: node-llama-cpp's prebuilt llama.cpp only (set HEARTH_IK_BIN / HEARTH_LLAMA_BIN for native builds)"
fi
[ -f "$vocab" ] || { say "missing $vocab"; exit 1; }
mkdir -p "$dir"

bf16=$dir/qwen3-1.7b-bf16.gguf
q40=$dir/qwen3-1.7b-q4_0.gguf
q4km=$dir/qwen3-1.7b-q4_k_m.gguf
if [ ! -f "$bf16" ]; then
	say "writing $bf16 (mkmodel qwen3-1.7b bf16 seed 1, real qwen2 tokenizer; ~1 min)"
	"$builddir/tests/mkmodel" --preset qwen3-1.7b --type bf16 --seed 1 --vocab "$vocab" \
		--n-vocab 151936 -o "$bf16.tmp" >/dev/null
	mv "$bf16.tmp" "$bf16"
fi
gbf16=$dir/gemma-3-1b-bf16.gguf
gq40=$dir/gemma-3-1b-q4_0.gguf
if [ ! -f "$gbf16" ]; then
	say "writing $gbf16 (mkmodel gemma-3-1b bf16 seed 1, its own vocabulary of 262144)"
	"$builddir/tests/mkmodel" --preset gemma-3-1b --type bf16 --seed 1 -o "$gbf16.tmp" >/dev/null
	mv "$gbf16.tmp" "$gbf16"
fi
for pair in "$bf16:q4_0" "$bf16:q4_k_m" "$gbf16:q4_0"; do
	src=${pair%:*} t=${pair##*:}
	out=${src%-bf16.gguf}-$t.gguf
	[ -f "$out" ] && continue
	log=$dir/quantize-$(basename "$out" .gguf).log
	if [ -n "$quantizer" ]; then
		say "quantizing $src -> $out with $quantizer"
		"$quantizer" "$src" "$out.tmp" "$(echo "$t" | tr a-z A-Z)" "$threads" \
			>"$log" 2>&1 || { say "quantize failed, see $log"; exit 1; }
	else
		say "quantizing $src -> $out with llama_model_quantize"
		"$builddir/bench/llama_quantize" "$libllama" "$src" "$out.tmp" "$t" "$threads" \
			>"$log" 2>&1 || { say "quantize failed, see $log"; exit 1; }
	fi
	mv "$out.tmp" "$out"
done

res=$dir/results
mkdir -p "$res"
say "machine: $(nproc) cpus, load average $(cut -d' ' -f1-3 /proc/loadavg)"
date -u +%Y-%m-%dT%H:%M:%SZ >"$res/date"
cut -d' ' -f1-3 /proc/loadavg >"$res/load_before"

# hearth and llama.cpp back to back, in one run, same thread count.
say "hearthd-tool bench on the BF16 file (quantized at load: the default layout, group 64 row8)"
"$builddir/hearthd-tool" bench --json -m "$bf16" -t "$threads" -r "$reps" \
	--pp "$pp" --tg "$tg" >"$res/hearth_bf16.json"
say "hearthd-tool bench on the BF16 file with weights_group 32 (searched group 32 sym, head included)"
"$builddir/hearthd-tool" bench --json -m "$bf16" -t "$threads" -r "$reps" \
	--pp "$pp" --tg "$tg" --weights-group 32 >"$res/hearth_bf16_g32.json"
say "hearthd-tool bench on the BF16 file with weights_group 32 and head int8 (the closest to the f32 model)"
"$builddir/hearthd-tool" bench --json -m "$bf16" -t "$threads" -r "$reps" \
	--pp "$pp" --tg "$tg" --weights-group 32 --head int8 >"$res/hearth_bf16_g32_q8.json"
if [ -n "$anchors" ]; then
	# One repetition of each engine per round, engines alternating, so a slow spell of the
	# machine lands on all of them alike; medians over the rounds.
	rm -rf "$res/rounds" "$res/hearth_q4_0.json" "$res/hearth_gemma3_q4_0.json"
	mkdir -p "$res/rounds"
	i=1
	while [ "$i" -le "$reps" ]; do
		say "round $i of $reps: hearth on the Q4_0 files, then$anchors on Q4_0 and Q4_K_M"
		"$builddir/hearthd-tool" bench --json -m "$q40" -t "$threads" -r 1 \
			--pp "$pp" --tg "$tg" >"$res/rounds/hearth_q4_0.$i.json"
		"$builddir/hearthd-tool" bench --json -m "$gq40" -t "$threads" -r 1 \
			--pp "$pp" --tg "$tg" >"$res/rounds/hearth_gemma3_q4_0.$i.json"
		for a in $anchors; do
			for f in "$q40" "$q4km" "$gq40"; do
				python3 "$srcdir/bench/anchor_bench.py" round "${a%%:*}" "${a#*:}" "$f" \
					"$threads" "$pp" "$tg" >>"$res/rounds/anchors.jsonl"
			done
		done
		i=$((i + 1))
	done
	python3 "$srcdir/bench/anchor_bench.py" merge-hearth "$res/hearth_q4_0.json" \
		"$res"/rounds/hearth_q4_0.*.json
	python3 "$srcdir/bench/anchor_bench.py" merge-hearth "$res/hearth_gemma3_q4_0.json" \
		"$res"/rounds/hearth_gemma3_q4_0.*.json
	python3 "$srcdir/bench/anchor_bench.py" merge-anchors "$res/rounds/anchors.jsonl" >"$res/llama.json"
else
	say "llama.cpp on Q4_0 and Q4_K_M"
	node "$srcdir/bench/llama_bench.mjs" --json --threads "$threads" --reps "$reps" \
		--pp "$pp" --tg "$tg" "$q40" "$q4km" "$gq40" \
		>"$res/llama.json"
	say "hearthd-tool bench on the Gemma-3-1B-shaped Q4_0 file"
	"$builddir/hearthd-tool" bench --json -m "$gq40" -t "$threads" -r "$reps" \
		--pp "$pp" --tg "$tg" >"$res/hearth_gemma3_q4_0.json"
	if [ "${HEARTH_BENCH_OURS_Q4_0:-1}" != 0 ]; then
		say "hearthd-tool bench on the Q4_0 file (codes carried over: group 32)"
		"$builddir/hearthd-tool" bench --json -m "$q40" -t "$threads" -r "$reps" \
			--pp "$pp" --tg "$tg" \
			>"$res/hearth_q4_0.json"
	else
		rm -f "$res/hearth_q4_0.json"
	fi
fi
cut -d' ' -f1-3 /proc/loadavg >"$res/load_after"

node "$srcdir/bench/bench_report.mjs" "$res"
