#!/bin/sh
# `hearth bench` end to end, fast: bench/serve_bench.sh starts a real hearthd on the small
# fixture model, two levels of client processes generate 8 tokens each, and the JSON must
# show every token generated and every token stamped by the daemon's sampling clock (the
# ring record's t_sampled_ns), with latencies that make sense on one shared clock. TAP.
set -u

srcdir=${HEARTH_SRCDIR:-}
builddir=${HEARTH_BUILDDIR:-}
if [ -z "$srcdir" ] || [ -z "$builddir" ] || [ -z "${HEARTH_SHARED:-}" ]; then
	echo "Bail out! HEARTH_SRCDIR, HEARTH_BUILDDIR and HEARTH_SHARED must be set (make check sets them)"
	exit 1
fi
model=$HEARTH_SHARED/fixtures/fx-qwen3.gguf
if [ ! -f "$model" ]; then
	echo "Bail out! fixture $model is missing"
	exit 1
fi

n=0
failed=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); failed=1; echo "not ok $n - $1"; [ -n "${2:-}" ] && printf '%s\n' "$2" | sed 's/^/# /'; }
check() { if eval "$2"; then ok "$1"; else not_ok "$1" "$out"; fi; }

echo "1..7"
out=$(HEARTH_BENCH_SERVE_MODEL=$model HEARTH_BENCH_KV_BUDGET=16MiB HEARTH_BUILDDIR=$builddir \
	sh "$srcdir/bench/serve_bench.sh" --clients 1,3 --prompt-tokens 8 --tokens 8 --json 2>&1)
rc=$?
json=$(printf '%s\n' "$out" | grep '^{"model"')
check "bench exits 0 against a running daemon" '[ $rc -eq 0 ]'
check "every client generated exactly --tokens tokens" \
	'[ "$(printf "%s" "$json" | grep -o "\"n_gen\":8}" | wc -l)" -eq 4 ]'
check "every token carries the daemon's sampling time" \
	'printf "%s" "$json" | grep -q "\"ipc_samples\":8," && printf "%s" "$json" | grep -q "\"ipc_samples\":24,"'
# One clock on both sides: sampling precedes the callback, and by far less than a minute.
p50s=$(printf '%s' "$json" | grep -o '"ipc_us_p50":[-0-9.]*' | cut -d: -f2)
maxs=$(printf '%s' "$json" | grep -o '"ipc_us_max":[-0-9.]*' | cut -d: -f2)
check "IPC latencies are positive" \
	'[ -n "$p50s" ] && ! printf "%s\n" $p50s | grep -q "^-"'
check "IPC latencies are below a minute" \
	'[ -n "$maxs" ] && [ "$(printf "%s\n" $maxs | awk "\$1 >= 60000000 || \$1 < 0" | wc -l)" -eq 0 ]'
# The wake-latency probe ran: a same-cpu figure (and another-cpu one when there are two)
# between zero and a second.
wake=$(printf '%s' "$json" | grep -o '"wake_same_cpu_us_p50":[0-9.]*' | cut -d: -f2)
check "the wake floor is measured alongside" \
	'[ -n "$wake" ] && awk -v w="$wake" "BEGIN { exit !(w > 0 && w < 1000000) }"'
# Clients that watch their ring before sleeping (--spin-us) get every token the same way.
out=$(HEARTH_BENCH_SERVE_MODEL=$model HEARTH_BENCH_KV_BUDGET=16MiB HEARTH_BUILDDIR=$builddir \
	sh "$srcdir/bench/serve_bench.sh" --clients 2 --prompt-tokens 8 --tokens 8 --spin-us 5000 \
	--json 2>&1)
rc=$?
json=$(printf '%s\n' "$out" | grep '^{"model"')
check "spinning clients (--spin-us) get exactly --tokens tokens each" \
	'[ $rc -eq 0 ] && [ "$(printf "%s" "$json" | grep -o "\"n_gen\":8}" | wc -l)" -eq 2 ] &&
	printf "%s" "$json" | grep -q "\"ipc_samples\":16,"'
exit $failed
