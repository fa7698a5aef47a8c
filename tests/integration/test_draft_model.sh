#!/bin/sh
# Speculative decoding from a draft model through a real hearthd (config draft_model): the
# trained demo model drafting for itself must leave every token as plain decoding has it
# (greedy, seeded sampling, a JSON Schema, three clients at once) while its drafts are
# accepted, and stats must count them apart from the lookup's; the draft lives in the
# model's one arena (one mapping, its regions as the ledger's draft.* lines, its KV in stats,
# its name in the welcome); a draft of another vocabulary must be refused at load by name;
# a SIGHUP model swap takes the draft with its model (the new pair drafts, the old one is
# gone) and refuses a new pair whose draft cannot draft, keeping the old one serving. TAP.
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

echo "1..11"

# The arena of the daemon's latest load, as its log says: "arena: N bytes" and the plan's
# regions ("arena plan: weights.q4g128 N, ..., draft.kv_pool N, ...") with their sum.
arena_of() { # log
	arena_bytes=$(sed -n 's/.*notice: arena: \([0-9]*\) bytes.*/\1/p' "$TMP/$1" | tail -n 1)
	plan=$(sed -n 's/.*info: arena plan: //p' "$TMP/$1" | tail -n 1)
	plan_sum=$(echo "$plan" | tr ',' '\n' | awk '{ s += $2 } END { print s + 0 }')
}

# Mappings of the daemon exactly N bytes long: the arena is one.
maps_of_size() { # N
	c=0
	while read -r range _; do
		lo=${range%-*} hi=${range#*-}
		[ $((0x$hi - 0x$lo)) = "$1" ] && c=$((c + 1))
	done <"/proc/$HPID/maps"
	echo $c
}

# The ledger's draft lines (draft.weights.*, draft.embed_head, draft.kv_pool, ...), one a line.
draft_lines() {
	"$B/hearth" --socket "$SOCK" ledger --json | grep -o '"name":"draft[^"]*"' | sed 's/"name":"//; s/"$//'
}

start kjv.log --model="$KJV" --draft-model="$KJV" --max-context=256 --log-level=info
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

# One arena for both: one mapping of the arena's size, planned with the draft's regions
# (all of them within it), and the ledger shows those regions as the draft's lines.
draft_lines >"$TMP/draft_lines"
sed 's/^/# ledger: /' "$TMP/draft_lines"
arena_of kjv.log
n_maps=$(maps_of_size "${arena_bytes:-0}")
echo "# arena: ${arena_bytes:-?} bytes in $n_maps mapping(s); plan: $plan_sum bytes: $plan"
grep -q '^draft\.weights\.q4g' "$TMP/draft_lines" && grep -qx 'draft.embed_head' "$TMP/draft_lines" &&
	grep -qx 'draft.norms' "$TMP/draft_lines" && grep -qx 'draft.kv_pool' "$TMP/draft_lines" &&
	grep -qx 'draft.scratch' "$TMP/draft_lines" && ! grep -q '^draft:' "$TMP/draft_lines" &&
	[ "$n_maps" = 1 ] && echo "$plan" | grep -q ' draft\.kv_pool [1-9]' &&
	[ "$plan_sum" -gt 0 ] && [ "$plan_sum" -le "$arena_bytes" ]
check $? "the draft is in the model's one arena: one mapping, its regions the ledger's draft.* lines"

stats=$("$B/hearth" --socket "$SOCK" stats --json)
dkv_total=$(echo "$stats" | sed -n 's/.*"draft_kv_total":\([0-9]*\).*/\1/p')
dkv_used=$(echo "$stats" | sed -n 's/.*"draft_kv_used":\([0-9]*\).*/\1/p')
kv_total=$(echo "$stats" | sed -n 's/.*"kv_total":\([0-9]*\).*/\1/p')
echo "# draft KV $dkv_used of $dkv_total bytes; the model's $kv_total"
# draft_kv_budget is 64MiB by default, the model's kv_budget 256MiB: apart, each its own.
[ "${dkv_total:-0}" -gt 0 ] && [ "$dkv_total" -le $((64 << 20)) ] && [ "$dkv_used" -le "$dkv_total" ] &&
	[ "${kv_total:-0}" -gt $((64 << 20)) ] &&
	echo "$stats" | grep -q '"draft":{"name":"[^"]*","arch":"llama","quant":"q4_[^"]*","n_params":[1-9]' &&
	"$B/hearth" --socket "$SOCK" stats | grep -q '^draft model ' &&
	"$B/hearth" --socket "$SOCK" stats --prometheus | grep -q "^hearth_draft_kv_total_bytes $dkv_total\$"
check $? "stats: the draft's KV apart from the model's; the welcome names the draft model"
stop

# Another vocabulary (Llama 2's SentencePiece against GPT-2 BPE) is refused at load.
refused_at_load "vocabularies must be the same" "a draft of another vocabulary is refused at load, by name" \
	--model="$FX/fx-qwen3.gguf" --draft-model="$FX/fx-llama.gguf" --max-context=256 --kv-budget=4MiB

# A swap takes the draft with its model: qwen3 + qwen2 (GPT-2 BPE), then llama + a Llama 2
# SentencePiece qwen3 (the fx-quant fixture).
CONF=$TMP/h.conf
printf 'model = %s\ndraft_model = %s\nmax_context = 256\nkv_budget = 4MiB\n' "$FX/fx-qwen3.gguf" "$FX/fx-qwen2.gguf" >"$CONF"
start swap.log --config="$CONF" --log-level=info
gen "$TMP/q3" "hello hello hello" --draft model --temp 0 -n 16
arena_of swap.log # the model is in: the generation waited for it
old_arena=${arena_bytes:-0}
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
# The old pair went with one free (its arena unmapped once its requests were done), and the
# new pair is one arena of its own.
arena_of swap.log
for _ in $(seq 50); do [ "$(maps_of_size "$old_arena")" = 0 ] && break; sleep 0.1; done
old_left=$(maps_of_size "$old_arena")
new_maps=$(maps_of_size "${arena_bytes:-0}")
draft_lines >"$TMP/draft_lines2"
echo "# after the swap: the old arena ($old_arena bytes) in $old_left mapping(s), the new one (${arena_bytes:-?}) in $new_maps; plan: $plan"
[ "$old_arena" != "${arena_bytes:-0}" ] && [ "$old_left" = 0 ] && [ "$new_maps" = 1 ] &&
	echo "$plan" | grep -q ' draft\.kv_pool [1-9]' && grep -qx 'draft.kv_pool' "$TMP/draft_lines2" &&
	"$B/hearth" --socket "$SOCK" stats --json | grep -q '"draft":{"name":"[^"]*","arch":"qwen3"'
check $? "SIGHUP swap: the old model and draft released together, the new pair in one arena"

# A new pair whose draft speaks another vocabulary is refused before anything is freed or
# mapped: the old pair keeps serving, drafting as before.
printf 'model = %s\ndraft_model = %s\nmax_context = 256\nkv_budget = 4MiB\nmodel_swap = drain\n' \
	"$FX/fx-qwen3.gguf" "$FX/fx-llama.gguf" >"$CONF"
kill -HUP $HPID
for _ in $(seq 100); do grep -q "model swap refused" "$TMP/swap.log" && break; sleep 0.1; done
drafts
before=${model_drafted:-0}
gen "$TMP/ll_on2" "hello hello hello" --draft model --temp 0 -n 16
drafts
echo "# refused swap: model drafts $before -> ${model_drafted:-0}"
grep "model swap refused" "$TMP/swap.log" | grep -q "vocabularies must be the same" &&
	cmp -s "$TMP/ll_off" "$TMP/ll_on2" && [ "${model_drafted:-0}" -gt "$before" ] &&
	"$B/hearth" --socket "$SOCK" stats --json | grep -q '"arch":"llama"' && [ "$(maps_of_size "$arena_bytes")" = 1 ]
check $? "SIGHUP onto a draft of another vocabulary: refused by name, the old pair keeps serving"
grep -i "error\|fail" "$TMP/swap.log" | sed 's/^/# /'
stop
exit $((fails > 0))
