#!/bin/sh
# Embeddings through a real hearthd (the int4 engine on the Q4_0 fixture of
# tests/fixtures/embed), as clients get them: `hearth embed` against llama.cpp's vectors for
# mean, cls and last pooling, the file's pooling by default, raw output, a batch larger than
# one request, embeds running beside a generate without changing its output, refusals that
# name the problem while the daemon goes on serving, the per-client token quota, a
# generative model (no pooling_type), a file that adds EOS (Qwen3-Embedding's way), and
# hearth-openai's /v1/embeddings (float and base64, token arrays, errors). TAP.
set -u
: "${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set (make check sets it)}"
: "${HEARTH_SRCDIR:?HEARTH_SRCDIR is not set (make check sets it)}"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_embed.XXXXXX") || exit 1
HPID= H2PID= GPID=
trap 'for p in $GPID $H2PID $HPID; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$TMP"' EXIT
B=$HEARTH_BUILDDIR
FX=$HEARTH_SRCDIR/tests/fixtures/embed
SOCK=$TMP/h.sock
PY=python3
n=0
fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"; }
expect() { if [ "$2" -eq 0 ]; then ok "$1"; else not_ok "$1"; fi; }
H() { "$B/hearth" --socket "$SOCK" "$@"; }

# wait_for SOCKET: until a hearthd answers on it.
wait_for() {
	for _ in $(seq 100); do
		"$B/hearth" --socket "$1" ping -c 1 >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	return 1
}

"$B/tests/mkmodel" -o "$TMP/embed.gguf" --arch qwen3 --pooling last --seed 7 --type q4_0 >/dev/null
"$B/tests/mkmodel" -o "$TMP/gen.gguf" --arch qwen3 --seed 7 --type q4_0 >/dev/null
[ "$(sha256sum "$TMP/embed.gguf" | cut -d' ' -f1)" = "$(cat "$FX/model-q4_0.sha256")" ]
expect "mkmodel writes the model the llama.cpp references were made from (make_ref.sh)" $?

"$B/hearthd" --socket="$SOCK" --threads=2 --log-level=warning --model="$TMP/embed.gguf" --max-context=512 \
	--kv-budget=16MiB >"$TMP/hearthd.log" 2>&1 &
HPID=$!
wait_for "$SOCK" || { echo "Bail out! hearthd did not start"; sed 's/^/# /' "$TMP/hearthd.log"; exit 1; }

# cmp_ref JSON REF MIN: every vector of hearth's JSON against llama.cpp's, with the same
# token counts, at cosine >= MIN; prints the lowest.
cmp_ref() {
	$PY - "$1" "$2" "$3" <<'PY'
import json, math, sys
got = json.load(open(sys.argv[1]))
lines = open(sys.argv[2]).read().split('\n')
n, E = map(int, lines[0].split())
worst = 1.0
assert len(got['data']) == n and got['n_embd'] == E, (len(got['data']), got['n_embd'])
for i in range(n):
    f = lines[1 + i].split()
    nt = int(f[0])
    ref = [float(x) for x in f[1 + nt:]]
    d = got['data'][i]
    assert d['index'] == i and d['n_tokens'] == nt, (i, d['n_tokens'], nt)
    v = d['embedding']
    assert abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-5
    c = sum(a * b for a, b in zip(v, ref)) / math.sqrt(sum(a * a for a in v) * sum(b * b for b in ref))
    worst = min(worst, c)
print('# lowest cosine %.7f against %s' % (worst, sys.argv[2].split('/')[-1]))
sys.exit(0 if worst >= float(sys.argv[3]) else 1)
PY
}

# Each pooling against llama.cpp on the same Q4_0 file (it rounds activations to 8 bits
# for Q4_0 products, hearth keeps 16: tests/unit/test_embed holds the engines closer).
for p in mean cls last; do
	H embed --pooling $p <"$FX/inputs.txt" >"$TMP/$p.json" && cmp_ref "$TMP/$p.json" "$FX/ref-q4_0-$p.txt" 0.9995
	expect "hearth embed --pooling $p matches llama.cpp's vectors and token counts (cosine >= 0.9995)" $?
done

# No --pooling: the file's (last).
H embed - <"$FX/inputs.txt" >"$TMP/dflt.json" && $PY - "$TMP/dflt.json" "$TMP/last.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
sys.exit(not (a['pooling'] == 'last' and a['data'] == b['data']))
PY
expect "without --pooling the file's pooling_type (last) is used and said" $?

# --raw writes the same floats as float32 rows.
H embed --raw --pooling mean <"$FX/inputs.txt" >"$TMP/mean.raw" && $PY - "$TMP/mean.raw" "$TMP/mean.json" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], 'rb').read()
j = json.load(open(sys.argv[2]))
vals = [x for d in j['data'] for x in d['embedding']]
got = struct.unpack('=%df' % (len(raw) // 4), raw)
sys.exit(not (len(raw) == 4 * len(vals) and all(abs(a - b) <= 1e-7 * max(1, abs(b)) for a, b in zip(got, vals))))
PY
expect "--raw writes n x n_embd float32 equal to the JSON numbers" $?

# 300 inputs, more than one request holds (256): every vector equals that text alone.
# The first request's 7 KiB of text is tokenized off the daemon's event loop.
$PY -c "
for i in range(300): print('line %d of a batch: %s' % (i, 'x' * (i % 17)))" >"$TMP/batch.txt"
H embed <"$TMP/batch.txt" >"$TMP/batch.json" &&
	H embed "line 0 of a batch: " "line 299 of a batch: $($PY -c "print('x' * (299 % 17))")" >"$TMP/ends.json" &&
	$PY - "$TMP/batch.json" "$TMP/ends.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
d = a['data']
ok = len(d) == 300 and [x['index'] for x in d] == list(range(300))
for k, i in ((0, 0), (1, 299)):
    ok = ok and max(abs(x - y) for x, y in zip(d[i]['embedding'], b['data'][k]['embedding'])) < 1e-6
ok = ok and a['usage']['prompt_tokens'] == sum(x['n_tokens'] for x in d)
sys.exit(not ok)
PY
expect "a batch of 300 inputs comes back whole and in order, each vector as when embedded alone" $?

# Embeds beside a running generate, in the same steps: its tokens are those of a solo run.
H generate --json --temp 0 -n 480 "the quick brown fox" >"$TMP/solo.gen" 2>/dev/null
H generate --json --temp 0 -n 480 "the quick brown fox" >"$TMP/busy.gen" 2>/dev/null &
GEN=$!
busy=0
for i in 1 2 3 4 5 6; do
	H embed --pooling mean <"$FX/inputs.txt" >"$TMP/beside$i.json" || busy=1
	cmp -s "$TMP/beside$i.json" "$TMP/mean.json" || busy=1
	# The generate must still be running after the first embed, or nothing ran beside it.
	[ $i = 1 ] && ! kill -0 $GEN 2>/dev/null && busy=1 && echo "# the generate ended before the first embed did"
done
wait $GEN || busy=1
tok() { sed -n 's/.*"token":\([0-9]*\).*/\1/p' "$1"; }
[ $busy = 0 ] && [ -n "$(tok "$TMP/solo.gen")" ] && [ "$(tok "$TMP/solo.gen")" = "$(tok "$TMP/busy.gen")" ]
expect "embeds beside a generate: the generate's greedy tokens and the vectors are as when each runs alone" $?

# Refusals that say what is wrong; the daemon serves on. The long input (8000 bytes)
# is tokenized off the daemon's event loop, and refused from there.
long=$($PY -c "print('a b ' * 2000)")
H embed "$long" >/dev/null 2>"$TMP/long.err"
rc=$?
[ $rc = 1 ] && grep -q "input\[0\] is [0-9]* tokens; the context holds 512" "$TMP/long.err"
expect "an input longer than the context is refused naming the input, its tokens and the context" $?
H embed --pooling none x >/dev/null 2>"$TMP/pool.err"
[ $? = 2 ] && grep -q "mean, cls or last" "$TMP/pool.err"
expect "a pooling that gives no single vector is a usage error naming the choices" $?
H embed "" >/dev/null 2>&1
rc=$?
printf '\n\n' | H embed >/dev/null 2>&1
rc2=$?
[ $rc = 2 ] && [ $rc2 = 2 ] && H embed "still serving" >/dev/null && H ping -c 1 >/dev/null
expect "empty inputs are refused before sending; the daemon still answers embed and ping" $?

# A generative model (no pooling_type; the same weights) embeds only with a pooling
# named; an embed counts its tokens against max_queued_tokens_per_client like a generate.
"$B/hearthd" --socket="$TMP/g.sock" --threads=2 --log-level=warning --model="$TMP/gen.gguf" --max-context=512 \
	--kv-budget=16MiB --max-queued-tokens-per-client=200 >"$TMP/hearthd2.log" 2>&1 &
H2PID=$!
wait_for "$TMP/g.sock"
G() { "$B/hearth" --socket "$TMP/g.sock" "$@"; }
G embed hello >/dev/null 2>"$TMP/gen.err"
rc=$?
[ $rc = 1 ] && grep -q "pooling_type is unspecified" "$TMP/gen.err" &&
	G embed --pooling mean "hello world" >"$TMP/gen-mean.json" && $PY - "$TMP/gen-mean.json" "$TMP/mean.json" <<'PY'
import json, sys
g, e = (json.load(open(p)) for p in sys.argv[1:3])
sys.exit(not (g['pooling'] == 'mean' and g['data'][0]['embedding'] == e['data'][0]['embedding']))
PY
expect "a model without pooling_type refuses a bare embed naming it, and embeds with --pooling mean" $?
G embed --pooling mean <"$FX/inputs.txt" >/dev/null 2>"$TMP/quota.err"
[ $? = 1 ] && grep -q "257 tokens queued; the limit is 200 (max_queued_tokens_per_client)" "$TMP/quota.err"
expect "an embed of more tokens than max_queued_tokens_per_client is refused naming the key" $?
kill $H2PID
H2PID=

# A file with tokenizer.ggml.add_eos_token (as Qwen3-Embedding's): texts end in EOS, as
# llama.cpp tokenizes them for embeddings, and last pooling takes that position.
"$B/tests/mkmodel" -o "$TMP/eos.gguf" --arch qwen3 --pooling last --seed 7 --type q4_0 --add-eos >/dev/null
"$B/hearthd" --socket="$TMP/e.sock" --threads=2 --log-level=warning --model="$TMP/eos.gguf" --max-context=512 \
	--kv-budget=16MiB >"$TMP/hearthd3.log" 2>&1 &
H2PID=$!
wait_for "$TMP/e.sock"
eos_ok=0
[ "$(sha256sum "$TMP/eos.gguf" | cut -d' ' -f1)" = "$(cat "$FX/model-q4_0-eos.sha256")" ] || eos_ok=1
for p in mean last; do
	"$B/hearth" --socket "$TMP/e.sock" embed --pooling $p <"$FX/inputs.txt" >"$TMP/eos-$p.json" &&
		cmp_ref "$TMP/eos-$p.json" "$FX/ref-q4_0-eos-$p.txt" 0.9995 || eos_ok=1
done
[ $eos_ok = 0 ]
expect "with add_eos_token every text ends in EOS and the vectors match llama.cpp's (mean, last)" $?
kill $H2PID
H2PID=

# The gateway.
"$B/hearth-openai" --listen=127.0.0.1:0 --socket="$SOCK" --model-name=hearth >"$TMP/gw.log" 2>&1 &
GPID=$!
PORT=
for _ in $(seq 100); do
	PORT=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/gw.log")
	[ -n "$PORT" ] && break
	sleep 0.1
done
URL="http://127.0.0.1:$PORT/v1/embeddings"
post() { curl -s -o "$TMP/$1" -w '%{http_code}' "$URL" -H 'Content-Type: application/json' -d "$2"; }
body=$($PY -c "import json,sys; print(json.dumps({'model': 'hearth', 'input': open(sys.argv[1]).read().split('\n')[:-1], 'pooling': 'mean'}))" "$FX/inputs.txt")
code=$(post gw.json "$body")
[ "$code" = 200 ] && $PY - "$TMP/gw.json" "$TMP/mean.json" <<'PY'
import json, sys
g, c = (json.load(open(p)) for p in sys.argv[1:3])
ok = g['object'] == 'list' and g['model'] == 'hearth' and len(g['data']) == len(c['data'])
ok = ok and g['usage']['prompt_tokens'] == c['usage']['prompt_tokens'] == g['usage']['total_tokens']
for a, b in zip(g['data'], c['data']):
    ok = ok and a['object'] == 'embedding' and a['index'] == b['index']
    ok = ok and max(abs(x - y) for x, y in zip(a['embedding'], b['embedding'])) < 1e-6
sys.exit(not ok)
PY
expect "POST /v1/embeddings gives the CLI's vectors in OpenAI's shape with usage.prompt_tokens" $?
code=$(post gw64.json "$($PY -c "import json,sys; b=json.loads(sys.argv[1]); b['encoding_format']='base64'; print(json.dumps(b))" "$body")")
[ "$code" = 200 ] && $PY - "$TMP/gw64.json" "$TMP/gw.json" <<'PY'
import base64, json, struct, sys
b64, fl = (json.load(open(p)) for p in sys.argv[1:3])
ok = len(b64['data']) == len(fl['data'])
for a, b in zip(b64['data'], fl['data']):
    raw = base64.b64decode(a['embedding'])
    v = struct.unpack('<%df' % (len(raw) // 4), raw)
    ok = ok and len(v) == len(b['embedding']) and all(abs(x - y) < 1e-7 for x, y in zip(v, b['embedding']))
sys.exit(not ok)
PY
expect "encoding_format base64 carries the same float32 values little-endian" $?
ids=$(H tokenize --no-bos --json "hello world") # embed adds no BOS for this vocabulary, as llama.cpp
code=$(post gwtok.json "{\"input\": [$ids], \"pooling\": \"mean\"}")
[ "$code" = 200 ] && $PY - "$TMP/gwtok.json" "$TMP/gw.json" <<'PY'
import json, sys
t, f = (json.load(open(p)) for p in sys.argv[1:3])
sys.exit(not max(abs(x - y) for x, y in zip(t['data'][0]['embedding'], f['data'][0]['embedding'])) < 1e-6)
PY
expect "token ids as input embed like their text" $?
errs=0
for case in '{"input": ""}|400|empty string' '{"input": []}|400|empty array' '{"input": [[1, -2]]}|400|token id' \
	'{"input": [[999999]]}|400|beyond the vocabulary' '{"input": "x", "dimensions": 3}|400|width, 64' \
	'{"input": "x", "encoding_format": "hex"}|400|base64' '{"input": "x", "stream": true}|400|stream' \
	"{\"input\": \"$long\"}|400|context holds 512"; do
	b=${case%%|*}
	rest=${case#*|}
	want=${rest%%|*}
	words=${rest#*|}
	code=$(post err.json "$b")
	if [ "$code" != "$want" ] || ! grep -q "$words" "$TMP/err.json" || ! grep -q '"error"' "$TMP/err.json"; then
		errs=1
		echo "# $b: $code $(cat "$TMP/err.json")"
	fi
done
[ $errs = 0 ]
expect "bad embeddings requests are 400s in OpenAI's error shape that name the problem" $?
code=$(post after.json '{"input": "still serving"}')
[ "$code" = 200 ] && H ping -c 1 >/dev/null
expect "after the refusals the gateway and the daemon still serve" $?

echo "1..$n"
if [ "$fails" -gt 0 ]; then
	sed 's/^/# hearthd: /' "$TMP/hearthd.log" | tail -n 20
	sed 's/^/# gw: /' "$TMP/gw.log" | tail -n 20
fi
[ "$fails" -eq 0 ]
