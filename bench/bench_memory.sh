#!/bin/sh
# `make bench` memory benchmark: the issue's target setup (a Qwen3-1.7B-shaped bf16 model
# from tests/mkmodel, int4 g128 resident, kv_budget 192 MiB, max_context 2048) through
# bench/bench_memory, which prints the ledger and one PASS/FAIL line per target.
# The 3.4 GB model is written once (about 45 s) and reused: HEARTH_BENCH_MODEL names it
# (default: $TMPDIR/hearth-bench-qwen3-1.7b-bf16.gguf). Run from the build directory.
set -eu
builddir=${HEARTH_BUILDDIR:-.}
model=${HEARTH_BENCH_MODEL:-${TMPDIR:-/tmp}/hearth-bench-qwen3-1.7b-bf16.gguf}
if [ ! -s "$model" ]; then
	echo "bench_memory: writing $model (tests/mkmodel --preset qwen3-1.7b --type bf16 --seed 1)"
	"$builddir/tests/mkmodel" --preset qwen3-1.7b --type bf16 --seed 1 -o "$model.tmp"
	mv "$model.tmp" "$model"
fi
exec "$builddir/bench/bench_memory" "$model" --kv-budget 192MiB --max-context 2048 "$@"
