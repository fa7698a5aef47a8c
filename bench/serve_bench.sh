#!/bin/sh
# `make bench` serving benchmark: starts hearthd on a Qwen3-0.6B-shaped bf16 model from
# tests/mkmodel (int4 g128 resident), runs `hearth bench` (1, 2, 4, 8, 16 concurrent client
# processes, 128-token prompt, 128 tokens each) against it and stops the daemon.
# The 1.2 GB model is written once and reused: HEARTH_BENCH_SERVE_MODEL names it (default
# $TMPDIR/hearth-bench-qwen3-0.6b-bf16.gguf). Arguments go to `hearth bench` (--json,
# --clients 1,8, ...); HEARTH_BENCH_HEARTHD_ARGS adds hearthd options (--threads=1).
# Run from the build directory (or set HEARTH_BUILDDIR).
set -eu
builddir=${HEARTH_BUILDDIR:-.}
model=${HEARTH_BENCH_SERVE_MODEL:-${TMPDIR:-/tmp}/hearth-bench-qwen3-0.6b-bf16.gguf}
# 16 clients x (128 + 128) tokens = 4096 tokens of KV; at 112 KiB a token (28 layers x
# 8 KV heads x 128 x K,V in f16) 640 MiB holds about 5800.
kv_budget=${HEARTH_BENCH_KV_BUDGET:-640MiB}

if [ ! -s "$model" ]; then
	# Qwen2's real tokenizer when the shared vocabularies are around (the project's
	# ../shared); mkmodel's own small vocabulary otherwise. Either is padded to 151936.
	vocab=${HEARTH_SHARED:-}/vocab/ggml-vocab-gpt-2-pre-qwen2.gguf
	echo "serve_bench: writing $model (tests/mkmodel --preset qwen3-0.6b --type bf16)"
	if [ -n "${HEARTH_SHARED:-}" ] && [ -f "$vocab" ]; then
		"$builddir/tests/mkmodel" --preset qwen3-0.6b --type bf16 --seed 1 \
			--vocab "$vocab" --n-vocab 151936 -o "$model.tmp"
	else
		"$builddir/tests/mkmodel" --preset qwen3-0.6b --type bf16 --seed 1 \
			--n-vocab 151936 -o "$model.tmp"
	fi
	mv "$model.tmp" "$model"
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/hearth-serve-bench.XXXXXX")
pid=
cleanup() {
	if [ -n "$pid" ]; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$dir"
}
trap cleanup EXIT INT TERM

: >"$dir/hearthd.log"
"$builddir/hearthd" --model="$model" --socket="$dir/hearth.sock" --kv-budget="$kv_budget" \
	--max-context=1024 ${HEARTH_BENCH_HEARTHD_ARGS:-} >"$dir/hearthd.log" 2>&1 &
pid=$!
i=0
until grep -q 'ready:' "$dir/hearthd.log"; do
	if ! kill -0 "$pid" 2>/dev/null || [ $i -ge 1200 ]; then
		echo "serve_bench: hearthd did not become ready:" >&2
		cat "$dir/hearthd.log" >&2
		exit 1
	fi
	i=$((i + 1))
	sleep 0.5
done
grep -E 'weights:|ready:' "$dir/hearthd.log" | sed 's/^/serve_bench: hearthd: /'
kv=$(sed -n 's/.*KV for \([0-9]*\) tokens.*/\1/p' "$dir/hearthd.log")
if [ -n "$kv" ] && [ "$kv" -lt 4096 ]; then
	echo "serve_bench: KV for $kv tokens < 16 x 256: raise HEARTH_BENCH_KV_BUDGET" >&2
	exit 1
fi
"$builddir/hearth" --socket "$dir/hearth.sock" --timeout 600 bench "$@"
