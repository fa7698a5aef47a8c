#!/bin/sh
# `hearthd-tool bench` end to end, fast: on the small fx-qwen3 fixture it must report both
# activation paths with sane statistics, the model facts that follow from the fixture's shape
# (README: 64 wide, 3 layers, 4/2 heads of 32, ff 192, tied 50257-token head), and decode
# bytes that add up (weights per step x tg + the KV of every position attended); bad options
# and missing files are refused. TAP.
set -u

: "${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set (make check sets it)}"
: "${HEARTH_SHARED:?HEARTH_SHARED is not set (make check sets it)}"
TOOL="$HEARTH_BUILDDIR/hearthd-tool"
MODEL="$HEARTH_SHARED/fixtures/fx-qwen3.gguf"
if [ ! -f "$MODEL" ]; then
	echo "Bail out! fixture $MODEL is missing"
	exit 1
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_main_bench.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT

n=0
fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"; }
expect() { # expect DESCRIPTION CONDITION-EXIT-STATUS
	if [ "$2" -eq 0 ]; then ok "$1"; else not_ok "$1"; fi
}
# num KEY FILE: the first numeric value of "KEY": in FILE
num() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p" "$2" | head -1; }

echo "1..15"

# pp 16, tg 4: the tg tokens sit at positions 16..19 and attend to 17..20 positions.
"$TOOL" bench --json -m "$MODEL" -t 2 -r 3 --pp 16 --tg 4 --probe-mib 16 \
	>"$TMP/both.json" 2>"$TMP/err"
rc=$?
expect "bench on fx-qwen3 exits 0" $rc
[ $rc -eq 0 ] || sed 's/^/# /' "$TMP/err"

grep -q '"runs":\[{"act":"a16".*},{"act":"a8".*}\]}$' "$TMP/both.json"
expect "both activation paths are reported, W4A16 first" $?

# 3 x (128x64 + 2 x 64x64 + 64x128 + 3 x 192x64) + 50257x64 = 3400768
[ "$(num matrix_params "$TMP/both.json")" = 3400768 ]
expect "matrix parameters follow from the fixture's shape (3400768)" $?

# 3 layers x 2 KV heads x (32 + 32) x 2 bytes (f16)
[ "$(num kv_bytes_per_pos "$TMP/both.json")" = 768 ]
expect "KV bytes per position follow from the shape (768)" $?

w=$(num decode_weight_bytes "$TMP/both.json")
tgb=$(num tg_bytes "$TMP/both.json")
[ -n "$w" ] && [ -n "$tgb" ] && [ "$tgb" -eq $((4 * w + 768 * (17 + 18 + 19 + 20))) ]
expect "decode bytes = 4 x weights per step + KV of 17..20 positions" $?

# --kv q8: a row is 32 int8 codes + a 4-byte scale: 3 layers x 2 KV heads x (36 + 36) bytes,
# and decode bytes count those rows.
"$TOOL" bench --json -m "$MODEL" -t 2 -r 1 --pp 16 --tg 4 --act a8 --probe-mib 0 --kv q8 \
	>"$TMP/q8.json" 2>"$TMP/err"
rc=$?
wq=$(num decode_weight_bytes "$TMP/q8.json")
tq=$(num tg_bytes "$TMP/q8.json")
[ $rc -eq 0 ] && [ "$(num kv_bytes_per_pos "$TMP/q8.json")" = 432 ] && [ -n "$wq" ] && [ -n "$tq" ] &&
	[ "$tq" -eq $((4 * wq + 432 * (17 + 18 + 19 + 20))) ]
expect "--kv q8 runs; KV bytes per position are the q8 rows' (432), decode bytes use them" $?
[ $rc -eq 0 ] || sed 's/^/# /' "$TMP/err"

# Every statistic: min <= median <= max, and median > 0.
awk 'BEGIN { RS = "{\"median\":"; bad = 0 }
     NR > 1 { split($0, a, /[,}]/); med = a[1]; sub(/"min":/, "", a[2]); sub(/"max":/, "", a[3]);
              if (!(med > 0 && a[2] + 0 <= med + 0 && med + 0 <= a[3] + 0)) bad = 1; k++ }
     END { exit (bad || k != 11) }' "$TMP/both.json"
expect "11 statistics (probe; pp/tg/GB/s, paired probe and % x 2 paths), each with 0 < min <= median <= max" $?

# With one repetition the paired percentage is exactly that repetition's decode GB/s over
# the GB/s of the probe slices read between its tokens; the KV type is named.
"$TOOL" bench --json -m "$MODEL" -t 2 -r 1 --pp 16 --tg 4 --act a8 --probe-mib 16 \
	>"$TMP/pair.json" 2>"$TMP/err"
rc=$?
med() { sed -n "s/.*\"$1\":{\"median\":\([0-9.]*\).*/\1/p" "$2" | head -1; }
g=$(med tg_gbs "$TMP/pair.json"); pg=$(med probe_paired_gbs "$TMP/pair.json")
pc=$(med tg_pct_paired "$TMP/pair.json")
[ $rc -eq 0 ] && [ -n "$g" ] && [ -n "$pg" ] && [ -n "$pc" ] &&
	awk -v g="$g" -v pg="$pg" -v pc="$pc" 'BEGIN { d = 100 * g / pg - pc; if (d < 0) d = -d
		exit !(pg > 0 && pc > 0 && d <= 0.005 * pc) }' # the JSON's 4 decimals
expect "one repetition: % paired = 100 x decode GB/s / its paired probe GB/s" $?
[ $rc -eq 0 ] || sed 's/^/# /' "$TMP/err"
grep -q '"kv":"f16"' "$TMP/both.json" && grep -q '"kv":"q8"' "$TMP/q8.json"
expect "the JSON names the KV type (f16 by default, q8 with --kv q8)" $?

"$TOOL" bench --json -m "$MODEL" -t 1 -r 1 --pp 8 --tg 2 --act a8 --probe-mib 0 \
	--kernels ref >"$TMP/a8.json" 2>"$TMP/err"
rc=$?
[ $rc -eq 0 ] && grep -q '"kernels":"ref"' "$TMP/a8.json" && grep -q '"runs":\[{"act":"a8"' "$TMP/a8.json" &&
	! grep -q '"act":"a16"' "$TMP/a8.json" && ! grep -q probe_gbs "$TMP/a8.json" &&
	! grep -q tg_pct_paired "$TMP/a8.json"
expect "--act a8 --probe-mib 0 --kernels ref: one run, no probe, ref kernels" $?

"$TOOL" bench -m "$MODEL" -r 1 --pp 8 --tg 2 --probe-mib 8 >"$TMP/table" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "^stream probe" "$TMP/table" && grep -q "^W4A16 " "$TMP/table" &&
	grep -q "^W4A8 " "$TMP/table"
expect "the table names the probe and one row per path" $?

"$TOOL" bench --pp 8 >"$TMP/out" 2>&1
[ $? -eq 2 ] && grep -q -- "--model" "$TMP/out"
expect "no --model is refused (exit 2, says --model)" $?

"$TOOL" bench -m "$MODEL" --act a4 >"$TMP/out" 2>&1
[ $? -eq 2 ]
expect "--act a4 is refused" $?

"$TOOL" bench -m "$MODEL" --reps 0 >"$TMP/out" 2>&1
[ $? -eq 2 ]
expect "--reps 0 is refused" $?

"$TOOL" bench -m "$TMP/missing.gguf" --probe-mib 0 >"$TMP/out" 2>&1
[ $? -eq 1 ] && grep -q "missing.gguf" "$TMP/out"
expect "a missing model fails (exit 1) naming the file" $?

[ $fails -eq 0 ]
