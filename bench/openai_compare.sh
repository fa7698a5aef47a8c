#!/bin/sh
# The gateway's speed side by side: 8 concurrent streams on one Q4_0 file (Qwen3-0.6B shape
# by default), in alternating rounds, through (1) libhearth (`hearth bench --clients 8`, 128
# prompt tokens, 128 generated), (2) hearth-openai (8 streaming /v1/chat/completions clients,
# bench/openai_streams.py, 128 generated with ignore_eos) and (3) llama.cpp's llama-server
# `--parallel 8` with the same 8 streaming chat requests, one server per anchor directory
# given: HEARTH_LLAMA_BIN (mainline llama.cpp) and HEARTH_IK_BIN (ik_llama.cpp). Every server
# gets THREADS compute threads (default 2). One JSON line per round, aggregate generated
# tokens/s of each; bench/doc_tables.py openai turns them into the table.
#   sh bench/openai_compare.sh [ROUNDS]        (make bench-openai-compare)
set -u
: "${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set}"
ROUNDS=${1:-5}
B=$HEARTH_BUILDDIR
S=$(dirname "$0")
N=8
TOK=128
THREADS=${THREADS:-2}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/openai_compare.XXXXXX") || exit 1
PIDS=
trap 'for p in $PIDS; do kill $p 2>/dev/null; done; wait 2>/dev/null; rm -rf "$TMP"' EXIT
MODEL=${MODEL:-}
if [ -z "$MODEL" ]; then
	MODEL=$TMP/q06.gguf
	"$B/tests/mkmodel" -o "$MODEL" --preset qwen3-0.6b --type q4_0 >/dev/null || exit 1
fi
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { # URL: until it answers 200, at most 120 s
	i=0
	until [ "$(curl -s -o /dev/null -w '%{http_code}' "$1")" = 200 ]; do
		i=$((i + 1))
		[ $i -ge 600 ] && { echo "openai_compare: $1 never became ready" >&2; exit 1; }
		sleep 0.2
	done
}

"$B/hearthd" --model="$MODEL" --socket="$TMP/h.sock" --max-context=1024 --kv-budget=256MiB \
	--threads="$THREADS" --log-level=warning >"$TMP/hearthd.log" 2>&1 &
PIDS="$PIDS $!"
i=0
until "$B/hearth" --socket "$TMP/h.sock" ping >/dev/null 2>&1 || [ $i -ge 600 ]; do sleep 0.2; i=$((i + 1)); done
GPORT=$(free_port)
"$B/hearth-openai" --listen="127.0.0.1:$GPORT" --socket="$TMP/h.sock" >"$TMP/gw.log" 2>&1 &
PIDS="$PIDS $!"
wait_http "http://127.0.0.1:$GPORT/health"

# llama-server: one per anchor, each with 8 slots of 1024 tokens (the context is shared).
LLAMAS=
start_llama() { # NAME DIR
	[ -n "$2" ] || return 0
	[ -x "$2/llama-server" ] || { echo "openai_compare: no $2/llama-server" >&2; exit 1; }
	port=$(free_port)
	"$2/llama-server" -m "$MODEL" --host 127.0.0.1 --port "$port" --parallel $N -c $((N * 1024)) \
		-t "$THREADS" -tb "$THREADS" >"$TMP/$1.log" 2>&1 &
	PIDS="$PIDS $!"
	wait_http "http://127.0.0.1:$port/health"
	LLAMAS="$LLAMAS $1=$port"
}
start_llama llama_mainline "${HEARTH_LLAMA_BIN:-}"
start_llama llama_ik "${HEARTH_IK_BIN:-}"

# Each round's prompts are new to every server (the salt, the seed), so no prefix or slot
# cache holds them from an earlier round; within a round the 8 prompts differ from the start.
streams() { # PORT SALT: aggregate tok/s, or exit on any failed stream
	out=$(/usr/bin/python3 "$S/openai_streams.py" "http://127.0.0.1:$1/v1/chat/completions" $N $TOK --ignore-eos --salt "$2")
	case $out in *aggregate_tps*) ;; *) echo "openai_compare: $out" >&2; return 1 ;; esac
	echo "$out" | /usr/bin/python3 -c 'import json,sys; v=json.load(sys.stdin); assert v["tokens"] == '$((N * TOK))', v; print(v["aggregate_tps"])' ||
		{ echo "openai_compare: not every stream gave $TOK tokens: $out" >&2; exit 1; }
}
lib() { # SEED
	"$B/hearth" --socket "$TMP/h.sock" bench --clients $N --prompt-tokens 128 --tokens $TOK --seed "$1" --json 2>/dev/null |
		/usr/bin/python3 -c 'import json,sys
for l in sys.stdin:
    try: v=json.loads(l)
    except ValueError: continue
    for lv in v.get("levels", []): print("%.2f" % lv["aggregate_tps"])'
}

# Warm-up: each server once, not counted (first-touch of KV pages, llama-server's graphs).
lib 1000 >/dev/null
streams "$GPORT" 1000 >/dev/null || exit 1
for l in $LLAMAS; do streams "${l#*=}" 1000 >/dev/null || streams "${l#*=}" 1001 >/dev/null || exit 1; done

r=1
while [ $r -le "$ROUNDS" ]; do
	# The order turns each round so no contender always runs first or last.
	line="{\"round\": $r, \"streams\": $N, \"tokens\": $TOK, \"threads\": $THREADS"
	order="lib gw $LLAMAS"
	k=0
	while [ $k -lt $(((r - 1) % 2)) ]; do order="$(echo $order | cut -d' ' -f2-) $(echo $order | cut -d' ' -f1)"; k=$((k + 1)); done
	for c in $order; do
		case $c in
		lib) v=$(lib $r); line="$line, \"libhearth\": $v" ;;
		gw) v=$(streams "$GPORT" $r) || exit 1; line="$line, \"gateway\": $v" ;;
		*) # llama-server ends a stream early now and then (its chat parser on random-weight
		   # output): such a round of it is run again on new prompts, and counted.
			v=$(streams "${c#*=}" $r) || v=$(streams "${c#*=}" $((r + 100))) || exit 1
			line="$line, \"${c%%=*}\": $v" ;;
		esac
	done
	echo "$line}"
	r=$((r + 1))
done
