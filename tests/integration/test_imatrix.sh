#!/bin/sh
# The imatrix key through a real hearthd: llama.cpp's imatrix of fx-llama steers the load
# (the layout named for it in stats and the log) and the model serves; an imatrix of another
# model is refused at load by name; a SIGHUP onto a legacy .dat imatrix is refused while the
# model keeps serving, and a SIGHUP without the key reloads the model without it. And
# hearthd-tool imatrix: its own file steers the load the same way, its int4 engine's
# statistics are its reference engine's on the same weights, too short a text is refused.
# TAP.
set -u
: "${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set (make check sets it)}"
: "${HEARTH_SHARED:?HEARTH_SHARED is not set (make check sets it)}"
: "${HEARTH_SRCDIR:?HEARTH_SRCDIR is not set (make check sets it)}"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_imatrix.XXXXXX") || exit 1
HPID=
trap '[ -n "$HPID" ] && kill $HPID 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
B=$HEARTH_BUILDDIR
SOCK=$TMP/h.sock
FX=$HEARTH_SHARED/fixtures
IM=$HEARTH_SRCDIR/tests/fixtures/imatrix
. "$HEARTH_SRCDIR/tests/integration/spec_lib.sh"

echo "1..14"

CONF=$TMP/h.conf
printf 'model = %s\nimatrix = %s\nmax_context = 256\nkv_budget = 4MiB\nweights_mix = off\nmodel_swap = drain\n' \
	"$FX/fx-llama.gguf" "$IM/fx-llama.imatrix.gguf" >"$CONF"
start run.log --config="$CONF" --log-level=info
"$B/hearth" --socket "$SOCK" generate --temp 0 -n 8 "hello hello" >"$TMP/out1" 2>"$TMP/err1"
q=$(quant)
echo "# layout: $q"
[ "$q" = "q4_mixed+imatrix" ] && [ -s "$TMP/out1" ] &&
	grep -q "with the imatrix .*fx-llama.imatrix.gguf steering the int4 scale search" "$TMP/run.log" &&
	grep -q "weights: q4_mixed+imatrix" "$TMP/run.log" &&
	grep -q "imatrix .*fx-llama.imatrix.gguf steered 14 int4 matrices$" "$TMP/run.log"
check $? "imatrix: the load is steered by llama.cpp's imatrix (all 14 layer matrices), named in stats and the log, and serves"

# A legacy imatrix on reload: refused by name, the model keeps serving as it was.
printf 'model = %s\nimatrix = %s\nmax_context = 256\nkv_budget = 4MiB\nweights_mix = off\nmodel_swap = drain\n' \
	"$FX/fx-llama.gguf" "$IM/fx-llama.imatrix.dat" >"$CONF"
kill -HUP $HPID
for _ in $(seq 100); do grep -q "model swap refused" "$TMP/run.log" && break; sleep 0.1; done
"$B/hearth" --socket "$SOCK" generate --temp 0 -n 8 "hello hello" >"$TMP/out2" 2>>"$TMP/err1"
grep "model swap refused" "$TMP/run.log" | grep -q "fx-llama.imatrix.dat.*--in-file" &&
	[ "$(quant)" = "q4_mixed+imatrix" ] && cmp -s "$TMP/out1" "$TMP/out2"
check $? "SIGHUP onto a legacy .dat imatrix: refused by name, the model keeps serving"

# Without the key the model is reloaded unsteered (here with an int6 embedding and head,
# which the log's count of matrices by width names: fx-llama's are untied, so two).
printf 'model = %s\nmax_context = 256\nkv_budget = 4MiB\nweights_mix = off\nhead = int6\nmodel_swap = drain\n' \
	"$FX/fx-llama.gguf" >"$CONF"
kill -HUP $HPID
for _ in $(seq 100); do [ "$(quant)" = "q4_mixed+head_q6" ] && break; sleep 0.1; done
"$B/hearth" --socket "$SOCK" generate --temp 0 -n 8 "hello hello" >"$TMP/out3" 2>>"$TMP/err1"
[ "$(quant)" = "q4_mixed+head_q6" ] && [ -s "$TMP/out3" ] &&
	grep -q "weights: q4_mixed+head_q6, 0 of 16 matrices carried over without re-rounding, 0 int8, 2 int6;" \
		"$TMP/run.log"
check $? "SIGHUP without the imatrix: the model reloads without it, its int6 head counted in the log"
sed 's/^/# /' "$TMP/err1"
stop

# hearth's own imatrix (hearthd-tool imatrix over a text in the repository) steers a real
# hearthd as llama-imatrix's does.
"$B/hearthd-tool" imatrix -q -m "$FX/fx-llama.gguf" -f "$HEARTH_SRCDIR/bench/spec_passage.txt" -c 64 \
	-o "$TMP/own.imatrix.gguf" 2>"$TMP/tool.err"
rc=$?
start own.log --model="$FX/fx-llama.gguf" -o imatrix="$TMP/own.imatrix.gguf" --max-context=256 --kv-budget=4MiB \
	-o weights_mix=off --log-level=info
"$B/hearth" --socket "$SOCK" generate --temp 0 -n 8 "hello hello" >"$TMP/out4" 2>>"$TMP/tool.err"
[ $rc = 0 ] && [ "$(quant)" = "q4_mixed+imatrix" ] && [ -s "$TMP/out4" ] &&
	grep -q "with the imatrix .*own.imatrix.gguf steering the int4 scale search" "$TMP/own.log" &&
	grep -q "own.imatrix.gguf steered 14 int4 matrices$" "$TMP/own.log"
check $? "hearthd-tool imatrix: its file steers a real hearthd's load, which serves"
sed 's/^/# /' "$TMP/tool.err"
stop

# The int4 engine's statistics (the default) against the reference engine's on a model
# whose every matrix the int4 engine carries over exactly (Q4_0 throughout): the same
# matrices and counts, every sum within 1 % of its matrix's largest (W4A16 rounds the
# activations to bf16; measured 0.4 %).
"$B/tests/mkmodel" -o "$TMP/q40.gguf" --type q4_0 --arch llama --n-embd 128 --n-layer 2 --n-head 4 \
	--n-head-kv 2 --n-ff 256 >/dev/null 2>&1 &&
	"$B/hearthd-tool" imatrix -q -m "$TMP/q40.gguf" -f "$HEARTH_SRCDIR/bench/spec_passage.txt" -c 64 \
		-o "$TMP/q40-int4.gguf" &&
	"$B/hearthd-tool" imatrix -q --engine ref -m "$TMP/q40.gguf" -f "$HEARTH_SRCDIR/bench/spec_passage.txt" \
		-c 64 -o "$TMP/q40-ref.gguf" &&
	/usr/bin/python3 "$HEARTH_SRCDIR/tests/integration/gguf_f32_compare.py" "$TMP/q40-int4.gguf" \
		"$TMP/q40-ref.gguf" 0.01 >"$TMP/cmp.out" 2>&1
check $? "hearthd-tool imatrix: the int4 engine's statistics are the reference engine's on the same weights"
sed 's/^/# /' "$TMP/cmp.out"

# An imatrix for a file whose matrices are all carried over (Q4_0 throughout): nothing is
# quantized at load, so nothing is steered, and the log says so instead of implying it.
start q40.log --model="$TMP/q40.gguf" -o imatrix="$TMP/q40-int4.gguf" --max-context=256 --kv-budget=4MiB \
	--log-level=notice
"$B/hearth" --socket "$SOCK" generate --temp 0 -n 4 "hello" >/dev/null 2>&1
grep -q "q40-int4.gguf steered 0 int4 matrices: none of its statistics name a matrix quantized at load" \
	"$TMP/q40.log" && [ "$(quant)" = "q4_g32" ]
check $? "an imatrix that steers nothing (every matrix carried over) is logged as such"
stop

# --self: no text, sequences sampled from the model itself: the same file for the same
# seed, another for another, every layer matrix and the head (its input at every sampled
# token) with (len - 1) x N tokens, and it steers a load.
SELF="$B/hearthd-tool imatrix -q -m $FX/fx-llama.gguf --self 6 -c 32"
$SELF -o "$TMP/self1.gguf" && $SELF -o "$TMP/self2.gguf" && $SELF --seed 2 -o "$TMP/self3.gguf" &&
	cmp -s "$TMP/self1.gguf" "$TMP/self2.gguf" && ! cmp -s "$TMP/self1.gguf" "$TMP/self3.gguf" &&
	"$B/hearthd-tool" imatrix -m "$FX/fx-llama.gguf" --self 6 -c 32 -o "$TMP/self4.gguf" 2>&1 |
	grep -q "15 matrices over 186 tokens"
check $? "hearthd-tool imatrix --self: the same seed writes the same file, another seed another, 6 x 31 tokens"
start self.log --model="$FX/fx-llama.gguf" -o imatrix="$TMP/self1.gguf" --max-context=256 --kv-budget=4MiB \
	-o weights_mix=off --log-level=notice
"$B/hearth" --socket "$SOCK" generate --temp 0 -n 4 "hello" >/dev/null 2>&1
grep -q "self1.gguf steered 15 int4 matrices$" "$TMP/self.log" && [ "$(quant)" = "q4_mixed+imatrix" ]
check $? "hearthd-tool imatrix --self: its file steers a real hearthd's load"
stop
# --cov: each distinct input's covariance too; hearthd rounds every layer matrix and the head by GPTQ
# against them (the log counts them, the layout says +gptq) and serves; deterministic too.
COV="$B/hearthd-tool imatrix -q -m $FX/fx-llama.gguf --self 6 -c 32 --cov"
$COV -o "$TMP/cov1.gguf" && $COV -o "$TMP/cov2.gguf" && cmp -s "$TMP/cov1.gguf" "$TMP/cov2.gguf" &&
	[ "$(stat -c %s "$TMP/cov1.gguf")" -gt "$(stat -c %s "$TMP/self1.gguf")" ]
rc=$?
# gptq_serves LOG FILE QUANT STEERED ROUNDED [HEARTHD-OPTION...]: a hearthd on fx-llama with the
# imatrix FILE serves, its layout is QUANT and its log counts the matrices FILE steered and
# GPTQ rounded.
gptq_serves() {
	glog=$1 gfile=$2 gquant=$3 gsteered=$4 grounded=$5
	shift 5
	start "$glog" --model="$FX/fx-llama.gguf" -o imatrix="$gfile" --max-context=256 --kv-budget=4MiB \
		-o weights_mix=off --log-level=notice "$@"
	"$B/hearth" --socket "$SOCK" generate --temp 0 -n 8 "hello hello" >"$TMP/$glog.out" 2>&1
	[ -s "$TMP/$glog.out" ] && [ "$(quant)" = "$gquant" ] &&
		grep -q "${gfile##*/} steered $gsteered int4 matrices; GPTQ rounded $grounded against its covariances$" \
			"$TMP/$glog"
	grc=$?
	stop
	return $grc
}
[ $rc = 0 ] && gptq_serves cov.log "$TMP/cov1.gguf" q4_mixed+gptq 15 15
check $? "hearthd-tool imatrix --cov: GPTQ rounds all 14 layer matrices and the head of a real hearthd's load, which serves"
# From text with --cov the head's input is kept too (15 entries; without, llama-imatrix's 14,
# as above), and GPTQ rounds the head with the layers.
"$B/hearthd-tool" imatrix -m "$FX/fx-llama.gguf" -f "$HEARTH_SRCDIR/bench/spec_passage.txt" -c 64 --cov \
	-o "$TMP/textcov.gguf" 2>&1 | grep -q "15 matrices over 320 tokens"
[ $? = 0 ] && gptq_serves textcov.log "$TMP/textcov.gguf" q4_mixed+gptq 15 15
check $? "hearthd-tool imatrix -f --cov: the head's input kept too, GPTQ rounds it with the layers, and serves"
# An int6 head is rounded by GPTQ against its input's covariance too (the 14 int4 matrices
# steered, 15 rounded), and the model serves.
gptq_serves cov6.log "$TMP/cov1.gguf" q4_mixed+head_q6+gptq 14 15 -o head=int6
check $? "hearthd-tool imatrix --cov: an int6 head is rounded by GPTQ too, and serves"
"$B/hearthd-tool" imatrix -m "$FX/fx-llama.gguf" --self 2 -f "$HEARTH_SRCDIR/bench/spec_passage.txt" \
	-o "$TMP/x.gguf" 2>"$TMP/both.err"
[ $? = 2 ] && grep -q "two sources: give one" "$TMP/both.err" && [ ! -e "$TMP/x.gguf" ]
check $? "hearthd-tool imatrix: --text and --self together are a usage error"

# Text shorter than one chunk: refused naming the text and both counts, nothing written.
printf 'In the beginning' >"$TMP/short.txt"
"$B/hearthd-tool" imatrix -q -m "$FX/fx-llama.gguf" -f "$TMP/short.txt" -c 64 -o "$TMP/short.imatrix.gguf" \
	2>"$TMP/short.err"
rc=$?
[ $rc = 1 ] && grep -q "short.txt: [0-9]* tokens, fewer than one chunk of 64" "$TMP/short.err" &&
	[ ! -e "$TMP/short.imatrix.gguf" ]
check $? "hearthd-tool imatrix: text shorter than a chunk is refused by name, nothing left behind"
sed 's/^/# /' "$TMP/short.err"

# An imatrix of another model (fx-llama's 64-wide statistics for a 256-wide model).
refused_at_load "blk.0.attn_q.weight has statistics for 64 columns, the model's matrix has 256" \
	"an imatrix of another model is refused at load, naming the matrix" \
	--model="$FX/fx-quant-bf16.gguf" -o imatrix="$IM/fx-llama.imatrix.gguf" --max-context=256 --kv-budget=4MiB
exit $((fails > 0))
