#!/bin/sh
# hearth-openai end to end: a real hearthd on the fx-qwen3 fixture, the gateway on a free
# loopback port with an API key, curl for the raw HTTP and SSE framing, then the official
# OpenAI SDK's suite (tests/openai, node's test runner). TAP.
set -u
: "${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set (make check sets it)}"
: "${HEARTH_SRCDIR:?HEARTH_SRCDIR is not set (make check sets it)}"
: "${HEARTH_SHARED:?HEARTH_SHARED is not set (make check sets it)}"
MODEL="$HEARTH_SHARED/fixtures/fx-qwen3.gguf"
SDK="$HEARTH_SRCDIR/tests/openai"
if ! command -v node >/dev/null || [ ! -d "$SDK/node_modules/openai" ]; then
	echo "Bail out! node or the pinned openai package is missing (scripts/deps.sh installs them)"
	exit 1
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_openai.XXXXXX") || exit 1
HPID= GPID=
cleanup() {
	[ -n "$GPID" ] && kill "$GPID" 2>/dev/null
	[ -n "$HPID" ] && kill "$HPID" 2>/dev/null
	wait 2>/dev/null
	rm -rf "$TMP"
}
trap cleanup EXIT
n=0
fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"; }
expect() { if [ "$2" -eq 0 ]; then ok "$1"; else not_ok "$1"; fi; }

"$HEARTH_BUILDDIR/hearthd" --model="$MODEL" --socket="$TMP/h.sock" --max-context=512 --kv-budget=8MiB \
	--threads=2 --log-level=warning >"$TMP/hearthd.log" 2>&1 &
HPID=$!
KEY=hk-test-0123456789abcdef
printf 'tester:%s\n' "$KEY" >"$TMP/keys"
chmod 600 "$TMP/keys"
i=0
while [ ! -S "$TMP/h.sock" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
"$HEARTH_BUILDDIR/hearth-openai" --listen=127.0.0.1:0 --socket="$TMP/h.sock" --api-keys="$TMP/keys" \
	--model-name=hearth >"$TMP/gw.log" 2>&1 &
GPID=$!
i=0
PORT=
while [ -z "$PORT" ] && [ $i -lt 300 ]; do
	PORT=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/gw.log")
	sleep 0.1
	i=$((i + 1))
done
if [ -z "$PORT" ]; then
	echo "Bail out! hearth-openai did not start"
	sed 's/^/# /' "$TMP/gw.log" "$TMP/hearthd.log"
	exit 1
fi
URL="http://127.0.0.1:$PORT"
i=0
until curl -s -o /dev/null -w '%{http_code}' "$URL/health" | grep -q 200 || [ $i -ge 300 ]; do sleep 0.1; i=$((i + 1)); done

# Raw HTTP and SSE framing, as curl sees it.
code=$(curl -s -o "$TMP/h.json" -w '%{http_code}' "$URL/health")
[ "$code" = 200 ] && grep -q '"status":"ok"' "$TMP/h.json"
expect "GET /health is 200 ok once the model is loaded" $?
code=$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/models")
[ "$code" = 401 ]
expect "/v1/models without a key is 401" $?
code=$(curl -s -o "$TMP/nf.json" -w '%{http_code}' -H "Authorization: Bearer $KEY" "$URL/v1/nothing")
[ "$code" = 404 ] && grep -q '"error":{' "$TMP/nf.json"
expect "an unknown URL is 404 in OpenAI's error shape" $?
code=$(curl -s -o "$TMP/bad.json" -w '%{http_code}' -H "Authorization: Bearer $KEY" \
	-H 'Content-Type: application/json' -d '{"model":"x","messages":[' "$URL/v1/chat/completions")
[ "$code" = 400 ] && grep -q 'invalid_json' "$TMP/bad.json"
expect "a truncated JSON body is 400 invalid_json" $?
code=$(curl -s -o "$TMP/draft.json" -w '%{http_code}' -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
	-d '{"model":"hearth","prompt":"one two one two","max_tokens":4,"temperature":0,"draft":"model"}' \
	"$URL/v1/completions")
code2=$(curl -s -o "$TMP/draft2.json" -w '%{http_code}' -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
	-d '{"model":"hearth","prompt":"x","max_tokens":4,"draft":"oracle"}' "$URL/v1/completions")
[ "$code" = 200 ] && [ "$code2" = 400 ] && grep -q '"param":"draft"' "$TMP/draft2.json"
expect "the draft extension passes auto/lookup/model through and is 400 otherwise" $?
curl -s -N -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
	-d '{"model":"hearth","messages":[{"role":"user","content":"Hi"}],"max_tokens":5,"temperature":0,"stream":true}' \
	"$URL/v1/chat/completions" -D "$TMP/sse.hdr" -o "$TMP/sse.txt"
grep -qi '^content-type: text/event-stream' "$TMP/sse.hdr" &&
	[ "$(tail -c 14 "$TMP/sse.txt")" = "$(printf 'data: [DONE]\n\n')" ] &&
	! grep -v '^data: ' "$TMP/sse.txt" | grep -q . &&
	[ "$(grep -c '^data: {' "$TMP/sse.txt")" -ge 3 ]
expect "a streamed chat is text/event-stream: data lines, blank separators, [DONE] last" $?
curl -s -o "$TMP/metrics.txt" "$URL/metrics"
grep -q '^hearth_openai_requests_total{endpoint="chat_completions",outcome="2xx"} [1-9]' "$TMP/metrics.txt" &&
	grep -q '^# TYPE hearth_openai_time_to_first_token_seconds histogram' "$TMP/metrics.txt" &&
	grep -q '^hearth_kv_total_bytes ' "$TMP/metrics.txt" && grep -q '^hearth_up 1' "$TMP/metrics.txt"
expect "GET /metrics is Prometheus text with the gateway's and hearthd's figures" $?

# The prefix cache's counters move by exactly what the requests report: a chat, then the
# same chat again, whose prompt is found cached up to its last full 16-token KV block (the
# last prompt token is always computed, so its logits exist).
metric() { sed -n "s/^$1 \([0-9][0-9]*\)\$/\1/p" "$2"; }
words="river stone lamp orchard winter copper meadow harbor lantern thistle granite violet ember willow"
body="{\"model\":\"hearth\",\"messages\":[{\"role\":\"user\",\"content\":\"$words $words $words\"}],\"max_tokens\":2,\"temperature\":0}"
pc_ok=0
curl -s -o "$TMP/pm0.txt" "$URL/metrics"
curl -s -o "$TMP/pc1.json" -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' -d "$body" "$URL/v1/chat/completions"
curl -s -o "$TMP/pm1.txt" "$URL/metrics"
curl -s -o "$TMP/pc2.json" -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' -d "$body" "$URL/v1/chat/completions"
curl -s -o "$TMP/pm2.txt" "$URL/metrics"
usage() { /usr/bin/python3 -c 'import json,sys; u=json.load(open(sys.argv[1]))["usage"]; print(u["prompt_tokens"], u.get("prompt_tokens_details", {}).get("cached_tokens", 0))' "$1"; }
set -- $(usage "$TMP/pc1.json") $(usage "$TMP/pc2.json")
p1=$1 c1=$2 p2=$3 c2=$4
for k in 0 1 2; do
	eval "h$k=\$(metric hearth_prefix_cache_hit_tokens_total \"\$TMP/pm$k.txt\")"
	eval "l$k=\$(metric hearth_prefix_cache_lookup_tokens_total \"\$TMP/pm$k.txt\")"
done
want=$((p1 / 16 * 16))
[ "$want" -ge "$p1" ] && want=$((p1 - 1))
echo "# prompt $p1 then $p2 tokens, cached $c1 then $c2 (blocks: $want); hits $h0 -> $h1 -> $h2, lookups $l0 -> $l1 -> $l2"
[ -n "$h0" ] && [ -n "$h2" ] && [ "$p1" -gt 32 ] && [ "$p2" = "$p1" ] && [ "$c2" = "$want" ] &&
	[ $((l1 - l0)) = "$p1" ] && [ $((h1 - h0)) = "$c1" ] && [ $((l2 - l1)) = "$p2" ] && [ $((h2 - h1)) = "$c2" ] ||
	pc_ok=1
expect "a repeated chat moves hearth_prefix_cache_hit_tokens_total by its cached tokens and lookup_tokens_total by its prompt" $pc_ok
grep -q '^hearth_load_phase{phase="ready"} 1$' "$TMP/pm2.txt"
expect "/metrics says hearth_load_phase{phase=\"ready\"} 1 once the model is loaded" $?
"$HEARTH_BUILDDIR/hearth" --socket "$TMP/h.sock" stats --prometheus >"$TMP/prom.txt" &&
	"$HEARTH_BUILDDIR/hearth" --socket "$TMP/h.sock" stats --json >"$TMP/stats.json"
rc=$?
[ $rc = 0 ] && [ "$(metric hearth_prefix_cache_hit_tokens_total "$TMP/prom.txt")" = "$h2" ] &&
	grep -q '^hearth_load_phase{phase="ready"} 1$' "$TMP/prom.txt" &&
	/usr/bin/python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(not (s["phase"] == "ready" and s["prefix_hit_tokens"] == int(sys.argv[2]) and s["prefix_lookup_tokens"] == int(sys.argv[3])))' \
		"$TMP/stats.json" "$h2" "$l2"
expect "hearth stats --prometheus and --json show the same prefix-cache counters and the ready phase" $?

# The OpenAI SDK's suite: its TAP lines renumbered into this stream.
HEARTH_OPENAI_URL=$URL HEARTH_OPENAI_KEY=$KEY HEARTH_SOCKET="$TMP/h.sock" HEARTH_CLI="$HEARTH_BUILDDIR/hearth" \
	node --test --test-reporter=tap "$SDK/openai.test.mjs" >"$TMP/sdk.tap" 2>&1
while IFS= read -r line; do
	case "$line" in
	"ok "*) ok "sdk: ${line#* - }" ;;
	"not ok "*) not_ok "sdk: ${line#* - }" ;;
	esac
done <"$TMP/sdk.tap"
grep -q '^ok \|^not ok ' "$TMP/sdk.tap" || not_ok "the OpenAI SDK suite ran"
echo "1..$n"
if [ "$fails" -gt 0 ]; then
	sed 's/^/# /' "$TMP/sdk.tap" | tail -n 80
	sed 's/^/# gw: /' "$TMP/gw.log" | tail -n 20
fi
[ "$fails" -eq 0 ]
