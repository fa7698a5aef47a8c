#!/bin/sh
# Speculative decoding from a draft model through a real hearthd (config draft_model): the
# trained demo model drafting for itself must leave every token as plain decoding has it
# (greedy, seeded sampling, a JSON Schema, three clients at once) while its drafts are
# accepted, and stats must count them apart from the lookup's; a draft of another
# vocabulary must be refused at load by name; a SIGHUP model swap takes the draft with its
# model (the new pair drafts, the old one is gone). TAP.
set -u
: "${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set (make check sets it)}"
: "${HEARTH_SHARED:?HEARTH_SHARED is not set (make check sets it)}"
: "${HEARTH_SRCDIR:?HEARTH_SRCDIR is not set (make check sets it)}"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_draft_model.XXXXXX") || exit 1
HPID=
trap '[ -n "$HPID" ] && kill $HPID 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
B=$HEARTH_BUILDDIR
SOCK=$TMP/h.sock
KJV=$HEARTH_SRCDIR/models/hearth-kjv-q8_0.gguf
FX=$HEARTH_SHARED/fixtures

GEN_TOKENS=48
. "$HEARTH_SRCDIR/tests/integration/spec_lib.sh"

echo "1..7"
check() { # status description
	if [ "$1" = 0 ]; then ok "$2"; else not_ok "$2"; fi
}

start kjv.log --model="$KJV" --draft-model="$KJV" --max-context=256
printf '{"type":"object","properties":{"who":{"type":"string"},"where":{"type":"string"}},"required":["who","where"]}' \
	>"$TMP/schema.json"
PROMPTS="And the LORD spake unto Moses, saying,
In the beginning God created the heaven and the earth.
And Abraham journeyed from thence toward the south country"
echo "$PROMPTS" >"$TMP/prompts"
same=1
while IFS= read -r p; do
	for mode in "--temp 0" "--temp 0.8 --seed 5" "--temp 1.0 --top-k 40 --seed 9" \
		"--temp 0 --json-schema $TMP/schema.json"; do
		# shellcheck disable=SC2086
		gen "$TMP/off" "$p" --speculate 0 $mode || same=0
		# shellcheck disable=SC2086
		gen "$TMP/model" "$p" --draft model $mode || same=0
		# shellcheck disable=SC2086
		gen "$TMP/auto" "$p" $mode || same=0
		[ -s "$TMP/off" ] && cmp -s "$TMP/off" "$TMP/model" && cmp -s "$TMP/off" "$TMP/auto" || {
			same=0
			echo "# $p / $mode: outputs differ"
		}
	done
done <"$TMP/prompts"
check $((1 - same)) "draft model: no token changes (greedy, sampling, schema; model and auto)"

i=0
pids=
while IFS= read -r p; do
	i=$((i + 1))
	gen "$TMP/solo$i" "$p" --speculate 0 --temp 0.7 --seed $i
	gen "$TMP/batch$i" "$p" --draft model --temp 0.7 --seed $i &
	pids="$pids $!"
done <"$TMP/prompts"
# shellcheck disable=SC2086
wait $pids
same=1
for i in 1 2 3; do
	[ -s "$TMP/solo$i" ] && cmp -s "$TMP/solo$i" "$TMP/batch$i" || same=0
done
check $((1 - same)) "three clients drafting from the model at once: no token changes"

drafts
echo "# draft model: $model_accepted of $model_drafted accepted; $drafted drafts in all"
[ "${model_drafted:-0}" -gt 0 ] && [ "${model_accepted:-0}" -gt $((model_drafted / 2)) ] &&
	[ "${drafted:-0}" -gt "${model_drafted:-0}" ]
check $? "stats: the draft model's drafts counted apart, mostly accepted (the model drafting for itself)"
"$B/hearth" --socket "$SOCK" stats --prometheus >"$TMP/prom.txt"
grep -q "^hearth_draft_model_accepted_tokens_total $model_accepted\$" "$TMP/prom.txt" &&
	grep -q "^hearth_draft_model_tokens_total $model_drafted\$" "$TMP/prom.txt"
check $? "stats --prometheus: the draft model's counters"

"$B/hearth" --socket "$SOCK" generate -n 4 --draft bogus "x" >/dev/null 2>&1
check $(($? != 2)) "--draft other than auto, lookup or model is a usage error"
stop

# Another vocabulary (Llama 2's SentencePiece against GPT-2 BPE) is refused at load.
"$B/hearthd" --socket="$SOCK" --threads=2 --model="$FX/fx-qwen3.gguf" --draft-model="$FX/fx-llama.gguf" \
	--max-context=256 --kv-budget=4MiB >"$TMP/refused.log" 2>&1 &
rpid=$!
for _ in $(seq 100); do kill -0 $rpid 2>/dev/null || break; sleep 0.1; done
kill $rpid 2>/dev/null
wait $rpid
rc=$?
grep -q "vocabularies must be the same" "$TMP/refused.log" && [ $rc != 0 ]
refused=$?
[ $refused = 0 ] || sed 's/^/# /' "$TMP/refused.log"
check $refused "a draft of another vocabulary is refused at load, by name"

# A swap takes the draft with its model: qwen3 + qwen2 (GPT-2 BPE), then llama + a Llama 2
# SentencePiece qwen3 (the fx-quant fixture).
CONF=$TMP/h.conf
printf 'model = %s\ndraft_model = %s\nmax_context = 256\nkv_budget = 4MiB\n' "$FX/fx-qwen3.gguf" "$FX/fx-qwen2.gguf" >"$CONF"
start swap.log --config="$CONF"
gen "$TMP/q3" "hello hello hello" --draft model --temp 0 -n 16
drafts
before=${model_drafted:-0}
printf 'model = %s\ndraft_model = %s\nmax_context = 256\nkv_budget = 4MiB\n' "$FX/fx-llama.gguf" "$FX/fx-quant-q4_0.gguf" >"$CONF"
kill -HUP $HPID
swapped=0
for _ in $(seq 200); do
	"$B/hearth" --socket "$SOCK" stats --json 2>/dev/null | grep -q '"arch":"llama"' && { swapped=1; break; }
	sleep 0.1
done
gen "$TMP/ll_off" "hello hello hello" --speculate 0 --temp 0 -n 16
gen "$TMP/ll_on" "hello hello hello" --draft model --temp 0 -n 16
drafts
echo "# before the swap: $before model drafts; after: ${model_drafted:-0}"
[ $swapped = 1 ] && [ "$before" -gt 0 ] && [ "${model_drafted:-0}" -gt 0 ] && [ -s "$TMP/ll_off" ] &&
	cmp -s "$TMP/ll_off" "$TMP/ll_on"
check $? "SIGHUP swap: the new model drafts from its new draft, outputs unchanged"
grep -i "error\|fail" "$TMP/swap.log" | sed 's/^/# /'
stop
exit $((fails > 0))
