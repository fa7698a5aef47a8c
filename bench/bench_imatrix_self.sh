#!/bin/sh
# What hearthd's `imatrix = self` costs, model by model, and what weights_cache gives back:
# the start with no imatrix, the first start with imatrix = self (it loads the model, samples
# it, writes the cache, loads it again rounded by GPTQ) and a later start (it reads the
# cache), all three with weights_cache = off; then each of the two layouts again with its
# packed weights kept (a start that writes them, then the one timed, which reads them). Each
# start is timed from the log's "loading" line to its "ready:" line; also the calibration's
# own seconds (its log line), the files' sizes and hearthd's peak resident memory (VmHWM) in
# the first three starts. One JSON line
# per model to $HEARTH_IMATRIX_SELF_RESULTS; `bench/doc_tables.py imatrix-self` writes the
# table in doc/benchmarks.md. Models: HEARTH_IMATRIX_SELF_MODELS, "label=path ..."; all are
# served with max_context 256 (the trained models' length; the samples are 256 tokens).
set -eu
builddir=${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set}
out=${HEARTH_IMATRIX_SELF_RESULTS:?HEARTH_IMATRIX_SELF_RESULTS is not set}
models=${HEARTH_IMATRIX_SELF_MODELS:?HEARTH_IMATRIX_SELF_MODELS is not set}
work=$(mktemp -d "${TMPDIR:-/tmp}/hearth-imatrix-self.XXXXXX")
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$work"' EXIT
: >"$out"

# seconds from the log's "loading" line to its "ready:" line
load_seconds() {
	awk '/ info: loading / && !s { split($2, t, ":"); s = t[1] * 3600 + t[2] * 60 + t[3] }
	     / notice: ready: / { split($2, t, ":"); r = t[1] * 3600 + t[2] * 60 + t[3] }
	     END { if (s && r) printf "%.1f", r - s; else print "null" }' "$1"
}

# serve LOG ARGS...: hearthd until it is ready (or exits); its VmHWM in KiB in $hwm
serve() {
	log=$1
	shift
	"$builddir/hearthd" --socket="$work/h.sock" --max-context=256 --kv-budget=64MiB --log-level=info "$@" \
		>"$work/$log" 2>&1 &
	pid=$!
	while kill -0 $pid 2>/dev/null && ! grep -q " notice: ready: " "$work/$log"; do sleep 0.2; done
	hwm=$(awk '/^VmHWM:/ { print $2 }' /proc/$pid/status 2>/dev/null || echo 0)
	kill $pid 2>/dev/null || true
	wait $pid 2>/dev/null || true
	pid=
	grep -q " notice: ready: " "$work/$log" || { sed 's/^/# /' "$work/$log" >&2; exit 1; }
}

for m in $models; do
	label=${m%%=*} model=${m#*=}
	rm -rf "$work/cache"
	mkdir -p "$work/cache"
	echo "== $label: $model" >&2
	serve plain.log --model="$model" -o weights_cache=off
	plain=$(load_seconds "$work/plain.log") plain_hwm=$hwm
	serve first.log --model="$model" -o imatrix=self -o imatrix_cache="$work/cache" -o weights_cache=off
	first=$(load_seconds "$work/first.log") first_hwm=$hwm
	calib=$(sed -n 's/.*imatrix = self: .* made in \([0-9.]*\) s$/\1/p' "$work/first.log")
	serve cached.log --model="$model" -o imatrix=self -o imatrix_cache="$work/cache" -o weights_cache=off
	cached=$(load_seconds "$work/cached.log") cached_hwm=$hwm
	grep -q "made at an earlier start" "$work/cached.log" || { echo "$label: the cache was not used" >&2; exit 1; }
	bytes=$(cat "$work"/cache/*.imatrix.gguf | wc -c)
	quant=$(sed -n 's/.* notice: ready: .* model (\([^)]*\)).*/\1/p' "$work/cached.log")
	# the same two layouts with their packed weights kept: written, then read
	for run in plain self; do
		set -- --model="$model" -o weights_cache="$work/weights"
		[ $run = self ] && set -- "$@" -o imatrix=self -o imatrix_cache="$work/cache"
		rm -rf "$work/weights" && mkdir -p "$work/weights"
		serve $run-write.log "$@"
		serve $run-read.log "$@"
		grep -q "packed matrices read from" "$work/$run-read.log" ||
			{ echo "$label: the packed weights were not read" >&2; exit 1; }
		eval "${run}_kept=\$(load_seconds \"\$work/\$run-read.log\")"
	done
	wbytes=$(cat "$work"/weights/*.weights | wc -c)
	line=$(printf '{"label":"%s","model":"%s","quant":"%s","plain_s":%s,"first_s":%s,"calib_s":%s,"cached_s":%s,"file_bytes":%s,"plain_hwm_kib":%s,"first_hwm_kib":%s,"cached_hwm_kib":%s,"plain_kept_s":%s,"self_kept_s":%s,"weights_bytes":%s}' \
		"$label" "$(basename "$model")" "$quant" "$plain" "$first" "${calib:-null}" "$cached" "$bytes" \
		"$plain_hwm" "$first_hwm" "$cached_hwm" "$plain_kept" "$self_kept" "$wbytes")
	echo "$line" | tee -a "$out"
done
