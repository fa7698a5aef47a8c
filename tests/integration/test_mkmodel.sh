#!/bin/sh
# The fixture generator end to end: every architecture x weight type is written and read back
# by hearth's GGUF reader (mkmodel verifies its own output), output is a function of the seed,
# bad shapes are refused; with HEARTH_LLAMA_CHECK=1 (`make bench-llama-load`, which needs
# node-llama-cpp in bench/), llama.cpp itself loads and runs the files. Prints TAP.
set -u

: "${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set (make check sets it)}"
: "${HEARTH_SRCDIR:?HEARTH_SRCDIR is not set (make check sets it)}"
: "${HEARTH_SHARED:?HEARTH_SHARED is not set (make check sets it)}"
MKMODEL="$HEARTH_BUILDDIR/tests/mkmodel"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_mkmodel.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT

n=0
fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"; }
check() { # check DESCRIPTION COMMAND...
	desc=$1
	shift
	if "$@" >"$TMP/out" 2>&1; then ok "$desc"; else not_ok "$desc"; sed 's/^/# /' "$TMP/out"; fi
}
refuses() { # refuses DESCRIPTION COMMAND...
	desc=$1
	shift
	if "$@" >"$TMP/out" 2>&1; then not_ok "$desc (exit 0)"; else ok "$desc"; fi
}

if [ "${HEARTH_LLAMA_CHECK:-0}" = 1 ]; then echo "1..32"; else echo "1..29"; fi

for arch in llama qwen2 qwen3; do
	for type in f32 f16 bf16 q8_0 q4_0; do
		check "mkmodel writes a $arch $type model the reader accepts" \
			"$MKMODEL" -o "$TMP/$arch-$type.gguf" --arch "$arch" --type "$type" --untied --seed 3
	done
done

check "qwen3 with head_dim unlike n_embd/n_head" \
	"$MKMODEL" -o "$TMP/qwen3-hd.gguf" --arch qwen3 --head-dim 32 --n-embd 96 --n-head 4 --n-head-kv 1
check "a copied vocabulary padded to --n-vocab" \
	"$MKMODEL" -o "$TMP/vocab.gguf" --arch qwen2 --vocab "$HEARTH_SHARED/vocab/ggml-vocab-gpt-2-pre-qwen2.gguf" \
	--n-vocab 50304 --type q8_0

"$MKMODEL" -o "$TMP/a.gguf" --seed 11 --type bf16 >/dev/null 2>&1
"$MKMODEL" -o "$TMP/b.gguf" --seed 11 --type bf16 >/dev/null 2>&1
"$MKMODEL" -o "$TMP/c.gguf" --seed 12 --type bf16 >/dev/null 2>&1
check "the same seed gives the same bytes" cmp -s "$TMP/a.gguf" "$TMP/b.gguf"
refuses "another seed gives other weights" cmp -s "$TMP/a.gguf" "$TMP/c.gguf"

refuses "qwen2 refuses a head size llama.cpp cannot load" \
	"$MKMODEL" -o "$TMP/bad1.gguf" --arch qwen2 --head-dim 32
refuses "q4_0 refuses rows that are not whole blocks" \
	"$MKMODEL" -o "$TMP/bad2.gguf" --type q4_0 --n-ff 200
refuses "n_head must be a multiple of n_head_kv" \
	"$MKMODEL" -o "$TMP/bad3.gguf" --n-head 4 --n-head-kv 3
refuses "--n-vocab below the byte tokens" \
	"$MKMODEL" -o "$TMP/bad4.gguf" --n-vocab 100
if [ -e "$TMP/bad1.gguf" ] || [ -e "$TMP/bad1.gguf.tmp" ]; then
	not_ok "a refused model leaves no file"
else
	ok "a refused model leaves no file"
fi

# Trained models (bench/train): a SentencePiece vocabulary and weights from files. The truth
# for --weights is the file itself: every tensor's f32 bytes must appear verbatim in the F32
# GGUF. python3 (no torch) writes a .hkw for the tiny shape and a 303-token vocabulary.
{
	printf '<unk>\t0.0\t2\n<s>\t0.0\t3\n</s>\t0.0\t3\n'
	i=0
	while [ $i -lt 256 ]; do printf '<0x%02X>\t0.0\t6\n' $i; i=$((i + 1)); done
	for p in the and of to in he that shall unto for i his a lord they be is him not them it with \
		all thou thy was god which my me said but ye their have will thee from as are when this out \
		were; do
		printf '\342\226\201%s\t-%d.0\t1\n' "$p" $i
		i=$((i + 1))
	done
} >"$TMP/spm.tsv"
python3 - "$TMP/w.hkw" "$(wc -l <"$TMP/spm.tsv")" <<'PY'
import struct, sys
# tests/mkmodel's tiny preset: 64 wide, 2 layers, 4 heads of 16, 2 KV heads, SwiGLU 192, tied
shapes = [("token_embd.weight", int(sys.argv[2]), 64)]
for l in range(2):
    b = "blk.%d." % l
    shapes += [(b + "attn_norm.weight", 64, 1), (b + "attn_q.weight", 64, 64),
               (b + "attn_k.weight", 32, 64), (b + "attn_v.weight", 32, 64),
               (b + "attn_output.weight", 64, 64), (b + "ffn_norm.weight", 64, 1),
               (b + "ffn_gate.weight", 192, 64), (b + "ffn_up.weight", 192, 64),
               (b + "ffn_down.weight", 64, 192)]
shapes.append(("output_norm.weight", 64, 1))
with open(sys.argv[1], "wb") as f:
    f.write(b"HKW1" + struct.pack("<I", len(shapes)))
    for k, (name, rows, cols) in enumerate(shapes):
        f.write(struct.pack("<I", len(name)) + name.encode() + struct.pack("<II", rows, cols))
        f.write(struct.pack("<%df" % (rows * cols), *[((i * 7 + k) % 97 - 48) / 64.0 for i in range(rows * cols)]))
PY
check "--spm-vocab and --weights write a trained model the reader accepts" \
	"$MKMODEL" -o "$TMP/trained.gguf" --spm-vocab "$TMP/spm.tsv" --weights "$TMP/w.hkw"
weights_inside() {
	python3 - "$TMP/w.hkw" "$TMP/trained.gguf" <<'PY'
import struct, sys
w, g = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
n, at = struct.unpack_from("<I", w, 4)[0], 8
for _ in range(n):
    ln = struct.unpack_from("<I", w, at)[0]
    name = w[at + 4:at + 4 + ln].decode()
    rows, cols = struct.unpack_from("<II", w, at + 4 + ln)
    at += 12 + ln
    data = w[at:at + 4 * rows * cols]
    at += 4 * rows * cols
    if g.find(data) < 0:
        sys.exit("%s: its values are not in the GGUF" % name)
PY
}
check "--weights: every tensor's values are in the F32 file as given" weights_inside
check "hearth loads and runs it (SPM pieces and byte fallback in the prompt)" \
	"$HEARTH_BUILDDIR/hearthd-tool" run -m "$TMP/trained.gguf" -p "unto the lord, é" -n 2 --temp 0
refuses "--weights missing a tensor the shape needs is refused" \
	"$MKMODEL" -o "$TMP/bad5.gguf" --spm-vocab "$TMP/spm.tsv" --weights "$TMP/w.hkw" --n-layer 3
refuses "--weights of another shape is refused" \
	"$MKMODEL" -o "$TMP/bad6.gguf" --spm-vocab "$TMP/spm.tsv" --weights "$TMP/w.hkw" --n-ff 128

# llama.cpp as the oracle: each architecture loads and generates.
check_llama() { # FILE
	out=$(cd "$HEARTH_SRCDIR" && node bench/llama_load_check.mjs "$1" 4 2>&1)
	case $out in
	*'"ok":true'*) return 0 ;;
	*) echo "$out"; return 1 ;;
	esac
}
# Only where asked: CI and a fresh machine have no node-llama-cpp, and a check that may
# silently not run does not belong in make check.
if [ "${HEARTH_LLAMA_CHECK:-0}" = 1 ]; then
	for arch in llama qwen2 qwen3; do
		check "llama.cpp loads and runs the $arch q4_0 model" check_llama "$TMP/$arch-q4_0.gguf"
	done
fi

[ "$fails" -eq 0 ]
