#!/bin/sh
# `hearth tokenize` through a real hearthd against llama.cpp: on the Llama 2 SentencePiece
# vocabulary of the shared folder, every test string of llama.cpp's own tokenizer test
# (NAME.gguf.inp, its ids in NAME.gguf.out, no BOS) as llama.cpp's llama-tokenize gives it:
# BOS first only when the file's tokenizer.ggml.add_bos_token asks for one
# (model_wants_add_bos && !no_bos), so a file that says false gets none unless asked not to
# anyway; --no-bos never adds it. The daemon's own prompt tokenization follows the same key.
# TAP.
set -u
: "${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set (make check sets it)}"
: "${HEARTH_SHARED:?HEARTH_SHARED is not set (make check sets it)}"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_tokenize.XXXXXX") || exit 1
HPID=
trap '[ -n "$HPID" ] && kill "$HPID" 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
B=$HEARTH_BUILDDIR
VOCAB=$HEARTH_SHARED/vocab/ggml-vocab-llama-spm.gguf
SOCK=$TMP/h.sock
n=0
fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"; }
expect() { if [ "$2" -eq 0 ]; then ok "$1"; else not_ok "$1"; fi; }
H() { "$B/hearth" --socket "$SOCK" "$@"; }

# The test strings, one file each (t/N), and llama.cpp's ids for each (t/N.ids); empty
# strings are left out (a tokenize request needs text).
mkdir "$TMP/t"
python3 - "$VOCAB.inp" "$VOCAB.out" "$TMP/t" <<'PY' || { echo "Bail out! cannot read the test vectors"; exit 1; }
import sys
texts = open(sys.argv[1], encoding='utf-8').read().split('\n__ggml_vocab_test__\n')
ids = open(sys.argv[2]).read().split('\n')
texts[-1] = texts[-1].removesuffix('\n__ggml_vocab_test__')
assert len(ids) >= len(texts), (len(ids), len(texts))
for i, t in enumerate(texts):
    if t:
        open('%s/%d' % (sys.argv[3], i), 'w', encoding='utf-8').write(t)
        open('%s/%d.ids' % (sys.argv[3], i), 'w').write(' '.join(ids[i].split()) + '\n')
PY
n_strings=$(ls "$TMP/t" | grep -vc ids)
echo "1..6"

# serve MODEL: a hearthd on it, answering on $SOCK.
serve() {
	[ -n "$HPID" ] && { kill "$HPID"; wait "$HPID" 2>/dev/null; }
	"$B/hearthd" --socket="$SOCK" --threads=2 --log-level=warning --model="$1" --max-context=256 \
		--kv-budget=4MiB >"$TMP/hearthd.log" 2>&1 &
	HPID=$!
	for _ in $(seq 100); do
		H ping -c 1 >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "Bail out! hearthd did not start on $1"
	sed 's/^/# /' "$TMP/hearthd.log"
	exit 1
}

# each PREFIX [FLAG]: how many strings hearth tokenizes (with FLAG) as PREFIX + llama.cpp's ids.
each() {
	bad=0
	for f in "$TMP"/t/*.ids; do
		t=${f%.ids}
		got=$(H tokenize ${2:-} - <"$t") || { bad=$((bad + 1)); continue; }
		want=$(echo "$1 $(cat "$f")" | xargs)
		[ "$got" = "$want" ] && continue
		bad=$((bad + 1))
		[ "$bad" -le 3 ] && echo "# string $(basename "$t"): got '$got', llama.cpp '$want'" | cut -c1-200
	done
	echo "$bad"
}

"$B/tests/mkmodel" -o "$TMP/bos.gguf" --vocab "$VOCAB" --seed 5 >/dev/null &&
	"$B/tests/mkmodel" -o "$TMP/nobos.gguf" --vocab "$VOCAB" --no-bos --seed 5 >/dev/null ||
	{ echo "Bail out! mkmodel failed"; exit 1; }

# The vocabulary's own file says add_bos_token true: BOS (id 1) first, as llama.cpp.
serve "$TMP/bos.gguf"
bad=$(each 1)
echo "$bad" | grep -v '^[0-9]*$'
bad=$(echo "$bad" | tail -n 1)
expect "add_bos_token true: BOS, then llama.cpp's ids, for $n_strings strings ($bad differ)" "$bad"
bad=$(each "" --no-bos | tail -n 1)
expect "add_bos_token true, --no-bos: llama.cpp's ids alone ($bad differ)" "$bad"
H generate --json -n 1 --temp 0 "Hello world" >"$TMP/gen.json" 2>&1
grep -q '"n_prompt":3,' "$TMP/gen.json"
expect "a prompt's tokens are the same three (BOS, Hello, world) the daemon generates from" $?

# Same vocabulary, add_bos_token false: no BOS, as llama-tokenize gives (it adds BOS only when
# the model wants one); --no-bos changes nothing.
serve "$TMP/nobos.gguf"
bad=$(each "")
echo "$bad" | grep -v '^[0-9]*$'
bad=$(echo "$bad" | tail -n 1)
expect "add_bos_token false: llama.cpp's ids with no BOS, for $n_strings strings ($bad differ)" "$bad"
bad=$(each "" --no-bos | tail -n 1)
expect "add_bos_token false, --no-bos: the same ($bad differ)" "$bad"
H generate --json -n 1 --temp 0 "Hello world" >"$TMP/gen.json" 2>&1
grep -q '"n_prompt":2,' "$TMP/gen.json"
expect "the daemon generates from the same two tokens, no BOS" $?

[ "$fails" -eq 0 ]
