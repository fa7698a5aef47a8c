#!/bin/sh
# Load on hearth-openai: CLIENTS concurrent streaming chat clients (curl, SSE) for ROUNDS
# rounds against a real hearthd + hearth-openai on a small synthetic model. Every stream
# must end with [DONE] and no request may fail; the RSS and open descriptors of both
# processes are sampled after each round and must stay flat (the last round's within a
# small margin of the first's). Prints a table for doc/benchmarks.md.
#   sh bench/openai_load.sh [CLIENTS] [ROUNDS]       (make bench-openai: 32 clients, 10 rounds)
set -u
: "${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set}"
CLIENTS=${1:-32}
ROUNDS=${2:-10}
B=$HEARTH_BUILDDIR
TMP=$(mktemp -d "${TMPDIR:-/tmp}/openai_load.XXXXXX") || exit 1
HPID= GPID=
cleanup() {
	[ -n "$GPID" ] && kill "$GPID" 2>/dev/null
	[ -n "$HPID" ] && kill "$HPID" 2>/dev/null
	wait 2>/dev/null
	rm -rf "$TMP"
}
trap cleanup EXIT

"$B/tests/mkmodel" -o "$TMP/m.gguf" --arch qwen3 --n-embd 128 --n-layer 4 --n-head 4 --n-head-kv 2 \
	--head-dim 32 --n-ff 256 >/dev/null || exit 1
"$B/hearthd" --model="$TMP/m.gguf" --socket="$TMP/h.sock" --max-context=512 --kv-budget=64MiB \
	--threads=2 --max-requests-per-uid=64 --log-level=warning >"$TMP/hearthd.log" 2>&1 &
HPID=$!
i=0
until "$B/hearth" --socket "$TMP/h.sock" ping >/dev/null 2>&1 || [ $i -ge 300 ]; do sleep 0.1; i=$((i + 1)); done
"$B/hearth-openai" --listen=127.0.0.1:0 --socket="$TMP/h.sock" --max-connections=$((CLIENTS * 2)) \
	>"$TMP/gw.log" 2>&1 &
GPID=$!
PORT=
i=0
while [ -z "$PORT" ] && [ $i -lt 100 ]; do
	PORT=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$TMP/gw.log")
	sleep 0.1
	i=$((i + 1))
done
[ -n "$PORT" ] || { echo "openai_load: the gateway did not start" >&2; exit 1; }

rss() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
fds() { ls "/proc/$1/fd" | wc -l; }
body='{"model":"hearth","messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":64,"temperature":0.8,"stream":true}'

printf '| round | streams | complete | failed | hearthd RSS (KiB) | hearthd fds | gateway RSS (KiB) | gateway fds | seconds |\n'
printf '|---|---|---|---|---|---|---|---|---|\n'
first_h= first_g= bad=0
r=1
while [ $r -le "$ROUNDS" ]; do
	t0=$(date +%s.%N)
	c=1
	while [ $c -le "$CLIENTS" ]; do
		curl -s -N -m 120 -H 'Content-Type: application/json' -d "$body" \
			"http://127.0.0.1:$PORT/v1/chat/completions" >"$TMP/s.$c" 2>/dev/null &
		c=$((c + 1))
	done
	wait_curl() { while pgrep -f "curl -s -N -m 120" >/dev/null; do sleep 0.1; done; }
	wait_curl
	t1=$(date +%s.%N)
	ok=0 failed=0
	c=1
	while [ $c -le "$CLIENTS" ]; do
		if [ "$(tail -c 14 "$TMP/s.$c")" = "$(printf 'data: [DONE]\n\n')" ] && ! grep -q '"error"' "$TMP/s.$c"; then
			ok=$((ok + 1))
		else
			failed=$((failed + 1))
		fi
		c=$((c + 1))
	done
	hr=$(rss "$HPID") hf=$(fds "$HPID") gr=$(rss "$GPID") gf=$(fds "$GPID")
	[ -z "$first_h" ] && first_h=$hr first_g=$gr first_hf=$hf first_gf=$gf
	printf '| %d | %d | %d | %d | %d | %d | %d | %d | %.1f |\n' "$r" "$CLIENTS" "$ok" "$failed" "$hr" "$hf" "$gr" "$gf" \
		"$(echo "$t1 - $t0" | bc)"
	bad=$((bad + failed))
	r=$((r + 1))
done
# Flat: within 10% (and 8 MiB) of the first round's RSS, and the same descriptor count.
flat=1
[ $((hr - first_h)) -gt $((first_h / 10 + 8192)) ] && flat=0
[ $((gr - first_g)) -gt $((first_g / 10 + 8192)) ] && flat=0
[ "$hf" -ne "$first_hf" ] && flat=0
[ "$gf" -ne "$first_gf" ] && flat=0
echo
echo "streams: $((CLIENTS * ROUNDS)), failed: $bad; RSS and fds flat: $([ $flat -eq 1 ] && echo yes || echo NO)"
[ "$bad" -eq 0 ] && [ $flat -eq 1 ]
