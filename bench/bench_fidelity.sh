#!/bin/sh
# `make bench` fidelity: bench/fidelity (hearth W4A16 / W4A8 against the f32 reference) and
# bench/fidelity_llama (llama.cpp Q4_0, default and --pure, against llama.cpp unquantized)
# on the same corpus, for fx-qwen3 and fx-quant (F16 source; Q4_0 = the fixture file).
# hearth runs three builds: the default (with --ablate: where the distance comes from),
# weights_group 32, and weights_group 32 with an int8 embedding/head.
# HEARTH_FIDELITY_BIG=1 adds a Qwen3-0.6B-shaped BF16 model from tests/mkmodel
# (1.2 GB, written once to HEARTH_FIDELITY_MODEL; about 15 minutes on 2 cores).
# The llama.cpp half needs HEARTH_LLAMA_LIB (default: the node-llama-cpp CPU build under
# $HEARTH_SRCDIR/bench/node_modules) and is skipped with a note when it is missing.
# HEARTH_FIDELITY_RESULTS names a directory for the results: each run then writes its --json
# there (INDEX-MODEL-N-BUILD.json, so they sort in run order) for bench/doc_tables.py.
set -eu
builddir=${HEARTH_BUILDDIR:-.}
srcdir=${HEARTH_SRCDIR:-.}
shared=${HEARTH_SHARED:?HEARTH_SHARED must name the shared inputs directory}
fx=$shared/fixtures
lib=${HEARTH_LLAMA_LIB:-$srcdir/bench/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64}
have_llama=1
if [ ! -d "$lib" ]; then
	echo "bench_fidelity: no libllama in $lib (make bench-deps, or set HEARTH_LLAMA_LIB): llama.cpp rows skipped"
	have_llama=0
fi

results=${HEARTH_FIDELITY_RESULTS:-}
if [ -n "$results" ]; then
	mkdir -p "$results"
	rm -f "$results"/*.json
fi

save() { # save FILE-TAG COMMAND...: the command's text, or its --json into the results
	tag=$1
	shift
	if [ -n "$results" ]; then
		"$@" --json >"$results/$tag.json"
		cat "$results/$tag.json"
	else
		"$@"
	fi
}

run() { # index name source q4_0-or-empty [corpus options]
	idx=$1 name=$2 src=$3 q4=$4
	shift 4
	echo "== $name: hearth"
	save "$idx-$name-1-hearth" "$builddir/bench/fidelity" --ablate "$@" "$src"
	echo "== $name: hearth, weights_group 32"
	save "$idx-$name-2-hearth-g32" "$builddir/bench/fidelity" --weights-group 32 "$@" "$src"
	echo "== $name: hearth, weights_group 32, int8 embedding/head"
	save "$idx-$name-3-hearth-g32-q8" "$builddir/bench/fidelity" --weights-group 32 --head int8 "$@" "$src"
	[ $have_llama = 1 ] || return 0
	echo "== $name: llama.cpp Q4_0"
	if [ -n "$q4" ]; then
		save "$idx-$name-4-llama" "$builddir/bench/fidelity_llama" --lib "$lib" --check --q4 "$q4" "$@" "$src"
	else
		save "$idx-$name-4-llama" "$builddir/bench/fidelity_llama" --lib "$lib" --check "$@" "$src"
	fi
	echo "== $name: llama.cpp Q4_0 --pure"
	save "$idx-$name-5-llama-pure" "$builddir/bench/fidelity_llama" --lib "$lib" --pure "$@" "$src"
}

run 1 fx-qwen3 "$fx/fx-qwen3.gguf" ""
run 2 fx-quant "$fx/fx-quant-f16.gguf" "$fx/fx-quant-q4_0.gguf"

if [ "${HEARTH_FIDELITY_BIG:-0}" = 1 ]; then
	model=${HEARTH_FIDELITY_MODEL:-${TMPDIR:-/tmp}/hearth-fidelity-qwen3-0.6b-bf16.gguf}
	if [ ! -s "$model" ]; then
		echo "bench_fidelity: writing $model"
		"$builddir/tests/mkmodel" --preset qwen3-0.6b --type bf16 \
			--vocab "$shared/vocab/ggml-vocab-gpt-2-pre-qwen2.gguf" --n-vocab 151936 -o "$model.tmp"
		mv "$model.tmp" "$model"
	fi
	run 3 qwen3-0.6b "$model" "" --seqs 4 --len 32
fi
