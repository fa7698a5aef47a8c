#!/bin/sh
# Speculative decoding through a real hearthd (the int4 engine on a quantized fixture), as
# clients get it: `hearth generate` with drafts (--speculate 8, and the daemon's default)
# must print the same tokens as with none (--speculate 0), greedy and seeded sampling,
# one client at a time and three at once (their drafts verified in the same steps), and
# the daemon's stats must show drafts verified and accepted; then the trained demo model on
# real text, with stop strings, a short max_tokens and a JSON Schema with jump-forward. TAP.
set -u
: "${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set (make check sets it)}"
: "${HEARTH_SHARED:?HEARTH_SHARED is not set (make check sets it)}"
: "${HEARTH_SRCDIR:?HEARTH_SRCDIR is not set (make check sets it)}"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_speculate.XXXXXX") || exit 1
HPID=
trap '[ -n "$HPID" ] && kill $HPID 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
B=$HEARTH_BUILDDIR
SOCK=$TMP/h.sock

. "$HEARTH_SRCDIR/tests/integration/spec_lib.sh"
start hearthd.log --model="$HEARTH_SHARED/fixtures/fx-quant-q4_0.gguf" --max-context=512 --kv-budget=16MiB

echo "1..7"

PROMPTS="the cat sat on the mat and the cat sat on the
one two three one two three one two
In the beginning was the word, and the word was"
same=1
i=0
echo "$PROMPTS" >"$TMP/prompts"
while IFS= read -r p; do
	i=$((i + 1))
	for mode in "--temp 0" "--temp 0.7 --seed 11" "--temp 0.9 --top-k 20 --repeat-penalty 1.1 --seed 3"; do
		# shellcheck disable=SC2086
		gen "$TMP/off" "$p" --speculate 0 $mode || same=0
		# shellcheck disable=SC2086
		gen "$TMP/on" "$p" --speculate 8 $mode || same=0
		# shellcheck disable=SC2086
		gen "$TMP/dflt" "$p" $mode || same=0
		[ -s "$TMP/off" ] && cmp -s "$TMP/off" "$TMP/on" && cmp -s "$TMP/off" "$TMP/dflt" || {
			same=0
			echo "# prompt $i, $mode: outputs differ"
		}
	done
done <"$TMP/prompts"
[ $same = 1 ] && ok "one client: drafts change no token (greedy and seeded sampling)" ||
	not_ok "one client: drafts change no token (greedy and seeded sampling)"

# Three clients at once, drafting in the same steps, against the same requests without drafts.
i=0
while IFS= read -r p; do
	i=$((i + 1))
	gen "$TMP/solo$i" "$p" --speculate 0 --temp 0
done <"$TMP/prompts"
i=0
pids=
while IFS= read -r p; do
	i=$((i + 1))
	gen "$TMP/batch$i" "$p" --speculate 8 --temp 0 &
	pids="$pids $!"
done <"$TMP/prompts"
# shellcheck disable=SC2086
wait $pids
same=1
for i in 1 2 3; do
	[ -s "$TMP/solo$i" ] && cmp -s "$TMP/solo$i" "$TMP/batch$i" || same=0
done
[ $same = 1 ] && ok "three clients at once: drafts change no token" ||
	not_ok "three clients at once: drafts change no token"

drafts
echo "# $accepted of $drafted draft tokens accepted"
[ "${drafted:-0}" -gt 0 ] && [ "${accepted:-0}" -gt 0 ] && ok "drafts were verified and accepted" ||
	not_ok "drafts were verified and accepted"

"$B/hearth" --socket "$SOCK" generate -n 4 --speculate 17 "x" >/dev/null 2>&1
[ $? = 2 ] && ok "--speculate above 16 is a usage error" || not_ok "--speculate above 16 is a usage error"

# The trained demo model: its text repeats itself the way real text does.
stop
start hearthd-kjv.log --model="$HEARTH_SRCDIR/models/hearth-kjv-q8_0.gguf" --max-context=256
P="And Abraham journeyed from thence toward the south country, and dwelled between Kadesh and Shur, and sojourned in Gerar. And Abraham said of Sarah his wife, She is my sister.

And Abraham journeyed from thence"
same=1
for mode in "-n 80 --temp 0" "-n 80 --temp 0.8 --seed 5" "-n 3 --temp 0" "-n 80 --temp 0 --stop unto" \
	"-n 60 --temp 0 --json-schema $TMP/schema.json"; do
	printf '{"type":"object","properties":{"who":{"type":"string"},"where":{"type":"string"}},"required":["who","where"]}' \
		>"$TMP/schema.json"
	# shellcheck disable=SC2086
	gen "$TMP/koff" "$P" --speculate 0 $mode || same=0
	# shellcheck disable=SC2086
	gen "$TMP/kon" "$P" $mode || same=0
	[ -s "$TMP/koff" ] && cmp -s "$TMP/koff" "$TMP/kon" || {
		same=0
		echo "# demo model, $mode: outputs differ"
	}
done
[ $same = 1 ] && ok "demo model: drafts change no token (sampling, stop, max_tokens 3, schema)" ||
	not_ok "demo model: drafts change no token (sampling, stop, max_tokens 3, schema)"
drafts
echo "# demo model: $accepted of $drafted draft tokens accepted"
[ "${accepted:-0}" -gt 10 ] && ok "demo model: drafts of real text are accepted" ||
	not_ok "demo model: drafts of real text are accepted"
# --stop cut the output at its first "unto": the stop string never reaches the client.
"$B/hearth" --socket "$SOCK" generate -n 80 --temp 0 --stop unto "$P" >"$TMP/stopped" 2>&1
grep -q unto "$TMP/stopped" && not_ok "a stop string inside an accepted draft ends the output" ||
	ok "a stop string inside an accepted draft ends the output"
exit $((fails > 0))
