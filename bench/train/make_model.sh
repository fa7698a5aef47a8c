#!/bin/sh
# `make train-model`: trains the demo model (bench/train/train.py), then writes it as GGUF
# with tests/mkmodel: F32 (the fidelity reference) and Q8_0 (the committed demo file).
# usage: make_model.sh MKMODEL OUTDIR [train.py options]; train.py's defaults are the demo's.
# HEARTH_MODEL_NAME names the files (default hearth-kjv; `make train-model-large` sets it).
set -eu
mkmodel=$1 out=$2
shift 2
here=$(dirname "$0")
name=${HEARTH_MODEL_NAME:-hearth-kjv}
# Debian's torch links libblas.so.3, the reference BLAS unless OpenBLAS is the chosen
# alternative; preloading OpenBLAS makes training ~10x faster without changing the system.
blas=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3
if [ -f "$blas" ]; then
	LD_PRELOAD=$blas
	OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-2}
	export LD_PRELOAD OPENBLAS_NUM_THREADS
fi
mkdir -p "$out"
/usr/bin/python3 "$here/train.py" --out-dir "$out" --name "$name" "$@" >"$out/$name.log" 2>&1 ||
	{ cat "$out/$name.log"; exit 1; }
cat "$out/$name.log"
unset LD_PRELOAD
# shellcheck disable=SC2046 # the shape is a list of options, split on purpose
"$mkmodel" --name "$name" --type f32 $(cat "$out/$name.mkmodel-args") -o "$out/$name-f32.gguf"
"$mkmodel" --name "$name" --type q8_0 $(cat "$out/$name.mkmodel-args") -o "$out/$name-q8_0.gguf"
ls -l "$out/$name-f32.gguf" "$out/$name-q8_0.gguf"
