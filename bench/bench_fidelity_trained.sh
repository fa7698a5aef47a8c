#!/bin/sh
# `make bench-fidelity-trained`: fidelity on trained weights (bench/train's model, peaked
# distributions), over held-out chapters it never trained on. hearth W4A16 / W4A8 at each
# layout the loader offers, against hearth's f32 reference; llama.cpp Q4_0, Q4_K_M and
# IQ4_XS made by llama.cpp's own quantizer from the same F32 file, against llama.cpp's
# unquantized run. HEARTH_TRAINED_MODEL (F32 GGUF) and HEARTH_TRAINED_CORPUS (one held-out
# chapter a line) name the inputs; HEARTH_LLAMA_QUANTIZE may name a llama-quantize binary
# (else bench/llama_quantize on the node-llama-cpp libllama). HEARTH_FIDELITY_RESULTS: a
# directory for the --json results (bench/doc_tables.py fidelity-trained).
# HEARTH_FIDELITY_SHORT=1 leaves out the weights_group 32 builds (the larger model's run).
# Importance matrices over training chapters (bench/train/calib_text.py, never the held-out
# ones): hearthd-tool imatrix's, with hearth's default steered by it (the daemon's imatrix
# key), and hearthd-tool imatrix --self's (no text: sequences the model samples itself);
# each of the two again with --cov (the inputs' covariances: hearthd rounds by GPTQ);
# HEARTH_LLAMA_BIN (a native llama.cpp build's bin/, ../shared/anchors/build-llama.sh)
# adds llama-imatrix's over the same text, hearth's default with that one, and llama.cpp
# Q4_K_M and IQ4_XS quantized with it.
set -eu
builddir=${HEARTH_BUILDDIR:-.}
srcdir=${HEARTH_SRCDIR:-.}
model=${HEARTH_TRAINED_MODEL:?HEARTH_TRAINED_MODEL must name the trained F32 GGUF}
corpus=${HEARTH_TRAINED_CORPUS:?HEARTH_TRAINED_CORPUS must name its held-out text}
# 16 chapters x 128 positions = 2048 held-out positions; 12 of them give the greedy prompts.
seqs=${HEARTH_FIDELITY_SEQS:-16}
len=${HEARTH_FIDELITY_LEN:-128}
lib=${HEARTH_LLAMA_LIB:-$srcdir/bench/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64}
results=${HEARTH_FIDELITY_RESULTS:-}
work=$(mktemp -d "${TMPDIR:-/tmp}/hearth-fidelity-trained.XXXXXX")
trap 'rm -rf "$work"' EXIT
if [ -n "$results" ]; then
	mkdir -p "$results"
	rm -f "$results"/*.json
fi

save() { # save TAG COMMAND...: the command's text, or its --json into the results
	tag=$1
	shift
	if [ -n "$results" ]; then
		"$@" --json >"$results/$tag.json"
		cat "$results/$tag.json"
	else
		"$@"
	fi
}

c="--corpus $corpus --seqs $seqs --len $len"
# Tags sort in the table's order (two digits: doc_tables.py sorts the file names).
echo "== hearth, default layout (weights_group 64: row8 layers; weights_mix auto: an int6 embedding/head, then int8 layer matrices, where 4.5 bpw allows)"
save 01-hearth-default "$builddir/bench/fidelity" $c --greedy 12 --label default "$model"
echo "== hearth, weights_mix off: layers group 64 row8, embedding/head group 32 asym"
save 02-hearth-mix-off "$builddir/bench/fidelity" $c --greedy 12 --mix off "$model"
echo "== hearth, weights_group 128 (the previous default)"
save 03-hearth-g128 "$builddir/bench/fidelity" $c --greedy 12 --weights-group 128 "$model"
echo "== hearth, weights_group 128, weights_mix off (the default before that)"
save 03a-hearth-g128-mix-off "$builddir/bench/fidelity" $c --greedy 12 --weights-group 128 --mix off "$model"
echo "== hearth, weights_mix off, int8 embedding/head"
save 04-hearth-q8 "$builddir/bench/fidelity" $c --greedy 12 --mix off --head int8 "$model"
echo "== hearth, weights_mix off, int6 embedding/head"
save 04a-hearth-q6 "$builddir/bench/fidelity" $c --greedy 12 --mix off --head int6 "$model"
# Importance matrices over training chapters (never held-out ones): hearth's own
# (hearthd-tool imatrix), and llama-imatrix's when a native llama.cpp build is named.
echo "== importance matrix: hearthd-tool imatrix over training chapters"
/usr/bin/python3 "$srcdir/bench/train/calib_text.py" "$work/calib.txt"
"$builddir/hearthd-tool" imatrix -q --engine ref -m "$model" -f "$work/calib.txt" -o "$work/imatrix-hearth.gguf" \
	-c 128
echo "== hearth, default layout with hearth's imatrix"
save 01b-hearth-default-imatrix-hearth "$builddir/bench/fidelity" $c --greedy 12 \
	--label "default, hearthd-tool imatrix" --imatrix "$work/imatrix-hearth.gguf" "$model"
echo "== hearth, default layout with hearth's imatrix from no text (--self: 64 sequences the model samples)"
"$builddir/hearthd-tool" imatrix -q -m "$model" --self 64 -c 256 -o "$work/imatrix-self.gguf"
save 01c-hearth-default-imatrix-self "$builddir/bench/fidelity" $c --greedy 12 \
	--label "default, hearthd-tool imatrix --self" --imatrix "$work/imatrix-self.gguf" "$model"
# With the inputs' covariances too (--cov): hearthd rounds the layer matrices by GPTQ.
echo "== hearth, default layout rounded by GPTQ against covariances over the same chapters (--cov)"
"$builddir/hearthd-tool" imatrix -q -m "$model" -f "$work/calib.txt" -c 128 --cov -o "$work/imatrix-cov.gguf"
save 01d-hearth-default-gptq "$builddir/bench/fidelity" $c --greedy 12 \
	--label "default, hearthd-tool imatrix --cov" --imatrix "$work/imatrix-cov.gguf" "$model"
echo "== hearth, default layout rounded by GPTQ against covariances from no text (hearthd's imatrix = self:"
echo "   the same bytes as --self 64 -c 256 --cov, tests/integration/test_imatrix_self.sh)"
"$builddir/hearthd-tool" imatrix -q -m "$model" --self 64 -c 256 --cov -o "$work/imatrix-self-cov.gguf"
save 01e-hearth-default-gptq-self "$builddir/bench/fidelity" $c --greedy 12 \
	--label "default, imatrix = self (--self 64 -c 256 --cov)" --imatrix "$work/imatrix-self-cov.gguf" "$model"
imatrix=
if [ -n "${HEARTH_LLAMA_BIN:-}" ] && [ -x "$HEARTH_LLAMA_BIN/llama-imatrix" ]; then
	echo "== importance matrix: llama-imatrix over the same chapters"
	"$HEARTH_LLAMA_BIN/llama-imatrix" -m "$model" -f "$work/calib.txt" -o "$work/imatrix.gguf" -c 128 \
		>"$work/imatrix.log" 2>&1 || { cat "$work/imatrix.log"; exit 1; }
	imatrix=$work/imatrix.gguf
	echo "== hearth, default layout with llama-imatrix's imatrix"
	save 01a-hearth-default-imatrix "$builddir/bench/fidelity" $c --greedy 12 --label "default, imatrix" \
		--imatrix "$imatrix" "$model"
else
	echo "bench_fidelity_trained: no llama-imatrix (set HEARTH_LLAMA_BIN to a llama.cpp build's bin/): its rows skipped"
fi
if [ -z "${HEARTH_FIDELITY_SHORT:-}" ]; then
	echo "== hearth, weights_group 32"
	save 05-hearth-g32 "$builddir/bench/fidelity" $c --greedy 12 --weights-group 32 --mix off "$model"
	echo "== hearth, weights_group 32, int8 embedding/head"
	save 06-hearth-g32-q8 "$builddir/bench/fidelity" $c --greedy 12 --weights-group 32 --mix off --head int8 "$model"
fi

if [ ! -d "$lib" ]; then
	echo "bench_fidelity_trained: no libllama in $lib (make bench-deps, or set HEARTH_LLAMA_LIB): llama.cpp rows skipped"
	exit 0
fi
libllama=
for f in "$lib"/libllama.v*.so "$lib"/libllama.so; do
	[ -f "$f" ] && { libllama=$f; break; }
done
i=7
for t in q4_0 q4_k_m iq4_xs; do
	q="$work/model-$t.gguf"
	if [ -n "${HEARTH_LLAMA_QUANTIZE:-}" ]; then
		"$HEARTH_LLAMA_QUANTIZE" "$model" "$q" "$t" 2 >"$work/quantize.log" 2>&1 ||
			{ cat "$work/quantize.log"; exit 1; }
	else
		"$builddir/bench/llama_quantize" "$libllama" "$model" "$q" "$t" 2
	fi
	label=$(echo "$t" | tr a-z A-Z)
	echo "== llama.cpp $label"
	# --check once: llama.cpp's unquantized run against hearth's f32 reference
	chk=""
	[ $i = 7 ] && chk=--check
	save "0$i-llama-$t" "$builddir/bench/fidelity_llama" --lib "$lib" --q4 "$q" --label "llama.cpp $label" --greedy 12 \
		$chk $c "$model"
	i=$((i + 1))
done
# The same quantizer steered by the same imatrix (llama-quantize --imatrix: the C API cannot
# pass one, so this needs the native build).
if [ -n "$imatrix" ] && [ -x "$HEARTH_LLAMA_BIN/llama-quantize" ]; then
	for t in q4_k_m iq4_xs; do
		q="$work/model-$t-imatrix.gguf"
		"$HEARTH_LLAMA_BIN/llama-quantize" --imatrix "$imatrix" "$model" "$q" "$t" 2 >"$work/quantize.log" 2>&1 ||
			{ cat "$work/quantize.log"; exit 1; }
		label=$(echo "$t" | tr a-z A-Z)
		echo "== llama.cpp $label with the imatrix"
		save "$i-llama-$t-imatrix" "$builddir/bench/fidelity_llama" --lib "$lib" --q4 "$q" \
			--label "llama.cpp $label, imatrix" --greedy 12 $c "$model"
		i=$((i + 1))
	done
fi
