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

if [ "${HEARTH_LLAMA_CHECK:-0}" = 1 ]; then echo "1..27"; else echo "1..24"; fi

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
