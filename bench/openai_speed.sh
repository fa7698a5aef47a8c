#!/bin/sh
# Is the gateway a bottleneck? The same 8 concurrent streams (128 prompt tokens, 128
# generated, greedy, EOS ignored) through libhearth (`hearth bench --clients 8`) and through
# hearth-openai (8 curl SSE streams of /v1/completions with the same token prompt), in
# alternating rounds on one hearthd; aggregate generated tokens per second of each, and their
# ratio (goal: the gateway >= 0.95x of libhearth). MODEL defaults to a Qwen3-0.6B-shaped
# Q4_0 file made by mkmodel.
#   sh bench/openai_speed.sh [ROUNDS]          (make bench-openai-speed)
set -u
: "${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set}"
ROUNDS=${1:-3}
B=$HEARTH_BUILDDIR
N=8
TMP=$(mktemp -d "${TMPDIR:-/tmp}/openai_speed.XXXXXX") || exit 1
HPID= GPID=
trap '[ -n "$GPID" ] && kill $GPID 2>/dev/null; [ -n "$HPID" ] && kill $HPID 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
MODEL=${MODEL:-}
if [ -z "$MODEL" ]; then
	MODEL=$TMP/q06.gguf
	"$B/tests/mkmodel" -o "$MODEL" --preset qwen3-0.6b --type q4_0 >/dev/null || exit 1
fi
"$B/hearthd" --model="$MODEL" --socket="$TMP/h.sock" --max-context=1024 --kv-budget=256MiB \
	--threads="$(nproc)" --log-level=warning >"$TMP/hearthd.log" 2>&1 &
HPID=$!
i=0
until "$B/hearth" --socket "$TMP/h.sock" ping >/dev/null 2>&1 || [ $i -ge 600 ]; do sleep 0.2; i=$((i + 1)); done
"$B/hearth-openai" --listen=127.0.0.1:0 --socket="$TMP/h.sock" >"$TMP/gw.log" 2>&1 &
GPID=$!
PORT=
i=0
while [ -z "$PORT" ] && [ $i -lt 100 ]; do
	PORT=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/gw.log")
	sleep 0.1
	i=$((i + 1))
done
prompt=$(/usr/bin/python3 -c 'import json,random; r=random.Random(1); print(json.dumps([r.randrange(1000, 20000) for _ in range(128)]))')

http_round() {
	t0=$(date +%s.%N)
	c=1
	while [ $c -le $N ]; do
		curl -s -m 600 -H 'Content-Type: application/json' \
			-d "{\"model\":\"m\",\"prompt\":$prompt,\"max_tokens\":128,\"temperature\":0,\"seed\":$c}" \
			"http://127.0.0.1:$PORT/v1/completions" >"$TMP/r.$c" &
		c=$((c + 1))
	done
	wait_curl() { while pgrep -f "curl -s -m 600" >/dev/null; do sleep 0.02; done; }
	wait_curl
	t1=$(date +%s.%N)
	/usr/bin/python3 - "$t0" "$t1" "$TMP" $N <<'EOF'
import json, sys
t0, t1, d, n = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
tok = sum(json.load(open("%s/r.%d" % (d, i)))["usage"]["completion_tokens"] for i in range(1, n + 1))
print("%.2f" % (tok / (t1 - t0)))
EOF
}

lib_round() {
	"$B/hearth" --socket "$TMP/h.sock" bench --clients $N --prompt-tokens 128 --tokens 128 --json 2>/dev/null |
		/usr/bin/python3 -c 'import json,sys
for l in sys.stdin:
    try: v=json.loads(l)
    except ValueError: continue
    for lv in v.get("levels", []): print("%.2f" % lv["aggregate_tps"])'
}

echo "| round | libhearth tok/s | gateway tok/s | gateway / libhearth |"
echo "|---|---|---|---|"
r=1
while [ $r -le "$ROUNDS" ]; do
	l=$(lib_round)
	h=$(http_round)
	echo "| $r | $l | $h | $(echo "scale=3; $h / $l" | bc) |"
	r=$((r + 1))
done
