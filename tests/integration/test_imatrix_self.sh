#!/bin/sh
# hearthd's `imatrix = self` through real processes: the first start samples the model and
# keeps the file in the cache directory (the same bytes as hearthd-tool imatrix --self
# --cov), GPTQ rounds the load, later starts read the file; a damaged file is made again, a
# changed model file gets its own and the old one goes; a cache that cannot be written, or
# none at all, still serves and leaves nothing behind; a SIGHUP onto it plans the
# calibration's memory; a stop ends the sampling; `auto` (the default) is self where both its
# files can be kept, plain elsewhere, and `none` plain. TAP.
set -u
: "${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set (make check sets it)}"
: "${HEARTH_SHARED:?HEARTH_SHARED is not set (make check sets it)}"
: "${HEARTH_SRCDIR:?HEARTH_SRCDIR is not set (make check sets it)}"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_imatrix_self.XXXXXX") || exit 1
HPID=
trap '[ -n "$HPID" ] && kill $HPID 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
B=$HEARTH_BUILDDIR
SOCK=$TMP/h.sock
FX=$HEARTH_SHARED/fixtures
. "$HEARTH_SRCDIR/tests/integration/spec_lib.sh"

echo "1..13"
cached() { # the cache's imatrix files
	ls "$TMP/cache" 2>/dev/null | grep '\.imatrix\.gguf$'
}
mkdir -p "$TMP/cache" "$TMP/tmpdir"
export TMPDIR="$TMP/tmpdir"
cp "$FX/fx-llama.gguf" "$TMP/model.gguf"
SELF="--model=$TMP/model.gguf --max-context=256 --kv-budget=4MiB -o imatrix=self -o imatrix_samples=8 --log-level=info"

# First start: sampled, kept, GPTQ-rounded (the 14 layer matrices and the head), serving;
# the file is hearthd-tool's.
start first.log $SELF -o imatrix_cache="$TMP/cache"
gen "$TMP/out1" "hello hello" --temp 0
f=$(cached)
"$B/hearthd-tool" imatrix -q -m "$TMP/model.gguf" --self 8 -c 256 --cov -o "$TMP/tool.gguf"
[ -s "$TMP/out1" ] && [ "$(quant)" = "q4_mixed+gptq" ] && [ "$(cached | wc -l)" = 1 ] &&
	case $f in model-????????????????-????????????????.imatrix.gguf) true ;; *) false ;; esac &&
	grep -q "imatrix = self: sampling 8 sequences of 256 tokens from .*model.gguf for GPTQ's statistics (kept in $TMP/cache)" "$TMP/first.log" &&
	grep -q "GPTQ rounded 15 against its covariances" "$TMP/first.log" &&
	cmp -s "$TMP/cache/$f" "$TMP/tool.gguf"
check $? "imatrix = self: the first start samples the model, keeps hearthd-tool imatrix --self --cov's file in the cache, GPTQ rounds the load, it serves"
stop

# Second start: the cached file, no sampling, the same model.
start second.log $SELF -o imatrix_cache="$TMP/cache"
gen "$TMP/out2" "hello hello" --temp 0
[ "$(quant)" = "q4_mixed+gptq" ] && cmp -s "$TMP/out1" "$TMP/out2" && ! grep -q "sampling" "$TMP/second.log" &&
	grep -q "imatrix = self: .*$f, made at an earlier start" "$TMP/second.log"
check $? "imatrix = self: a later start reads the cached file without sampling and serves the same model"
stop

# A damaged file (cut short): refused by the load, made again, served; the part a killed
# daemon left of it (a pid that is gone) is removed.
head -c 1000 "$TMP/cache/$f" >"$TMP/cut" && cat "$TMP/cut" >"$TMP/cache/$f"
: >"$TMP/cache/$f.999999.part"
start damaged.log $SELF -o imatrix_cache="$TMP/cache"
gen "$TMP/out3" "hello hello" --temp 0
[ "$(quant)" = "q4_mixed+gptq" ] && cmp -s "$TMP/out1" "$TMP/out3" && cmp -s "$TMP/cache/$f" "$TMP/tool.gguf" &&
	grep -q "warning: imatrix = self: .*$f.*; making it again" "$TMP/damaged.log" &&
	[ ! -e "$TMP/cache/$f.999999.part" ]
check $? "imatrix = self: a damaged cached file is named, made again and the model serves; a dead daemon's part is removed"
stop

# The model file changes (its modification time): a file of its own, the old one removed.
touch -d "2001-01-01" "$TMP/model.gguf"
start changed.log $SELF -o imatrix_cache="$TMP/cache"
gen "$TMP/out4" "hello hello" --temp 0
g=$(cached)
[ "$(quant)" = "q4_mixed+gptq" ] && [ "$(cached | wc -l)" = 1 ] && [ "$g" != "$f" ] &&
	[ "${g%-*}" != "${f%-*}" ] && grep -q "sampling 8 sequences" "$TMP/changed.log"
check $? "imatrix = self: a changed model file gets a file of its own and its old one is removed"
stop

# A cache directory that cannot be written (a file stands in its path): said, served,
# nothing left in TMPDIR.
: >"$TMP/notadir"
start unwritable.log $SELF -o imatrix_cache="$TMP/notadir/cache"
gen "$TMP/out5" "hello hello" --temp 0
[ "$(quant)" = "q4_mixed+gptq" ] && [ -s "$TMP/out5" ] && [ -z "$(ls "$TMP/tmpdir")" ] &&
	grep -q "warning: imatrix = self: cannot write $TMP/notadir/cache/.*; made for this load only instead" \
		"$TMP/unwritable.log"
check $? "imatrix = self: a cache that cannot be written is named, the file made for this load only and removed"
stop

# No cache directory at all: made at every start, removed after the load.
start nocache.log $SELF
gen "$TMP/out6" "hello hello" --temp 0
[ "$(quant)" = "q4_mixed+gptq" ] && [ -z "$(ls "$TMP/tmpdir")" ] &&
	grep -q "(no cache directory: made at every start)" "$TMP/nocache.log"
check $? "imatrix = self without a cache directory: made for the load, removed after it"
stop

# systemd's CacheDirectory= (CACHE_DIRECTORY) is the cache when imatrix_cache is unset.
mkdir -p "$TMP/sd-cache"
CACHE_DIRECTORY="$TMP/sd-cache" start sd.log $SELF
gen "$TMP/out7" "hello hello" --temp 0
[ "$(quant)" = "q4_mixed+gptq" ] && [ "$(ls "$TMP/sd-cache" | grep -c '\.imatrix\.gguf$')" = 1 ] &&
	grep -q "(kept in $TMP/sd-cache)" "$TMP/sd.log"
check $? "imatrix = self: systemd's CACHE_DIRECTORY is the cache when imatrix_cache is unset"
stop
# imatrix = auto, the default: self where its file and the rounded weights are kept (here
# systemd's CACHE_DIRECTORY): the first start samples and serves what imatrix = self does,
# the second reads both files.
mkdir -p "$TMP/auto"
AUTO="--model=$TMP/model.gguf --max-context=256 --kv-budget=4MiB -o imatrix_samples=8 --log-level=info"
CACHE_DIRECTORY="$TMP/auto" start auto1.log $AUTO
gen "$TMP/out10" "hello hello" --temp 0
[ "$(quant)" = "q4_mixed+gptq" ] && cmp -s "$TMP/out7" "$TMP/out10" &&
	grep -q "imatrix = auto: self-calibrated, kept for later starts" "$TMP/auto1.log" &&
	grep -q "imatrix = self: sampling 8 sequences" "$TMP/auto1.log" &&
	[ "$(ls "$TMP/auto" | grep -c '\.imatrix\.gguf$')" = 1 ] && [ "$(ls "$TMP/auto" | grep -c '\.weights$')" = 1 ]
rc=$?
stop
CACHE_DIRECTORY="$TMP/auto" start auto2.log $AUTO
gen "$TMP/out11" "hello hello" --temp 0
[ $rc = 0 ] && [ "$(quant)" = "q4_mixed+gptq" ] && cmp -s "$TMP/out10" "$TMP/out11" &&
	! grep -q "sampling" "$TMP/auto2.log" && grep -q "made at an earlier start" "$TMP/auto2.log" &&
	grep -q "packed matrices read from" "$TMP/auto2.log"
check $? "imatrix = auto under a cache directory: the first start self-calibrates and keeps both files, the next reads them"
stop

# auto without a cache directory, or with weights_cache = off: plain rounding, said why;
# none: plain even with a cache directory.
start auto3.log $AUTO
gen "$TMP/out12" "hello hello" --temp 0
q3=$(quant)
stop
CACHE_DIRECTORY="$TMP/auto" start auto4.log $AUTO -o weights_cache=off
gen "$TMP/out13" "hello hello" --temp 0
q4=$(quant)
[ "$q3" = "q4_mixed" ] && [ "$q4" = "q4_mixed" ] && cmp -s "$TMP/out12" "$TMP/out13" && [ -z "$(ls "$TMP/tmpdir")" ] &&
	grep -q 'imatrix = auto: plain rounding: no directory to keep the rounded weights in (weights_cache, $CACHE_DIRECTORY)' "$TMP/auto3.log" &&
	grep -q "imatrix = auto: plain rounding: weights_cache = off" "$TMP/auto4.log"
check $? "imatrix = auto without a directory to keep its files, or with weights_cache = off: plain rounding, the log says why"
stop
# auto where the calibration's plan does not fit what the machine has available (a KV
# budget of twice its memory: the calibration's copy plans at least that): plain rounding,
# the log gives both figures, nothing sampled. The load itself then fails on that budget
# or serves from untouched pages; either way it never samples.
total_kb=$(awk '/^MemTotal:/ { print $2 }' /proc/meminfo)
mkdir -p "$TMP/auto-big"
CACHE_DIRECTORY="$TMP/auto-big" "$B/hearthd" --socket="$SOCK" --threads=2 --model="$TMP/model.gguf" --max-context=256 \
	--kv-budget=$((total_kb * 2))KiB -o imatrix_samples=8 --log-level=info >"$TMP/big.log" 2>&1 &
HPID=$!
for _ in $(seq 100); do grep -q "imatrix = auto" "$TMP/big.log" && break; sleep 0.1; done
kill $HPID 2>/dev/null
wait $HPID 2>/dev/null
HPID=
rm -f "$SOCK"
grep -Eq "imatrix = auto: plain rounding: its calibration plans [0-9]+ MiB and [0-9]+ MiB are available" "$TMP/big.log" &&
	! grep -q "sampling" "$TMP/big.log" && [ -z "$(ls "$TMP/auto-big" | grep imatrix)" ]
rc=$?
[ $rc = 0 ] || sed 's/^/# /' "$TMP/big.log"
check $rc "imatrix = auto where the calibration would not fit the memory available: plain rounding, both figures in the log"

CACHE_DIRECTORY="$TMP/auto" start none.log $AUTO -o imatrix=none
gen "$TMP/out14" "hello hello" --temp 0
[ "$(quant)" = "q4_mixed" ] && cmp -s "$TMP/out12" "$TMP/out14" && ! grep -q "imatrix = \|steered" "$TMP/none.log"
check $? "imatrix = none: plain rounding even with a cache directory"
stop

# A SIGHUP onto imatrix = self (model_swap = auto): the room check plans the calibration's
# own load and covariances besides the new arena, the model is sampled beside the running
# one, rounded and served (the first start's model); a later swap whose file is made
# (kv_budget changes, the calibration does not) plans no calibration and reads the file.
mkdir -p "$TMP/swapcache"
swapconf() { # KV_BUDGET [imatrix lines]
	printf 'model = %s\nmax_context = 256\nkv_budget = %s\nmodel_swap = auto\n%s' "$TMP/model.gguf" "$1" "${2:-}" \
		>"$TMP/swap.conf"
}
swapconf 4MiB
start swap.log -c "$TMP/swap.conf" --log-level=info
SELFKEYS="imatrix = self
imatrix_samples = 8
imatrix_cache = $TMP/swapcache
"
swapdone() { # N: wait for the Nth swap to finish
	for _ in $(seq 300); do [ "$(grep -c "model swap done" "$TMP/swap.log")" = "$1" ] && break; sleep 0.1; done
}
for _ in $(seq 100); do grep -q "ready:" "$TMP/swap.log" && break; sleep 0.1; done
swapconf 4MiB "$SELFKEYS"
kill -HUP $HPID
swapdone 1
gen "$TMP/out8" "hello hello" --temp 0
plan=$(sed -n 's/.*model swap: the new arena plans \([0-9]*\) bytes.*/\1/p' "$TMP/swap.log")
calib=$(sed -n 's/.*model swap: imatrix = self samples the new model first: \([0-9]*\) bytes for that$/\1/p' "$TMP/swap.log")
[ "$(quant)" = "q4_mixed+gptq" ] && cmp -s "$TMP/out1" "$TMP/out8" && [ "${plan:-0}" -gt 0 ] &&
	[ "${calib:-0}" -gt 0 ] && grep -q "model swap: loading .* beside the running model" "$TMP/swap.log" &&
	grep -q "imatrix = self: sampling 8 sequences" "$TMP/swap.log"
rc=$?
swapconf 8MiB "$SELFKEYS"
kill -HUP $HPID
swapdone 2
gen "$TMP/out9" "hello hello" --temp 0
[ $rc = 0 ] && cmp -s "$TMP/out1" "$TMP/out9" && [ "$(grep -c "samples the new model first" "$TMP/swap.log")" = 1 ] &&
	[ "$(grep -c "imatrix = self: sampling" "$TMP/swap.log")" = 1 ] && grep -q "made at an earlier start" "$TMP/swap.log" &&
	[ "$(quant)" = "q4_mixed+gptq" ]
check $? "SIGHUP onto imatrix = self: the swap's room check counts the calibration, which runs beside the serving model; a made file plans none"
stop

# SIGTERM while sampling (4096 sequences: minutes): the sampling stops at its next step,
# hearthd exits at once, nothing is left in the cache.
rm -rf "$TMP/cache" && mkdir -p "$TMP/cache"
"$B/hearthd" --socket="$SOCK" --threads=2 --model="$TMP/model.gguf" --max-context=256 --kv-budget=4MiB \
	-o imatrix=self -o imatrix_samples=4096 -o imatrix_cache="$TMP/cache" --log-level=info >"$TMP/term.log" 2>&1 &
HPID=$!
for _ in $(seq 100); do grep -q "sampling 4096 sequences" "$TMP/term.log" && break; sleep 0.1; done
sleep 1
kill -TERM $HPID
gone=1
for _ in $(seq 100); do kill -0 $HPID 2>/dev/null || { gone=0; break; }; sleep 0.1; done
wait $HPID 2>/dev/null
HPID=
[ $gone = 0 ] && [ -z "$(ls "$TMP/cache")" ] && grep -q "imatrix = self: the sampling was stopped after .* (hearthd is stopping); nothing kept" "$TMP/term.log"
check $? "imatrix = self: SIGTERM stops the sampling within seconds, nothing left in the cache"
exit $((fails > 0))
