#!/bin/sh
# `make soak`: a hearthd on the small fixture, then bench/soak's 10,000 requests from 8
# concurrent clients (fresh and reused connections, cancels, clients killed with SIGKILL
# mid-generation) at nice 10, sampling the daemon's RSS and fds once a second.
# Writes the samples to $SOAK_CSV (default soak.csv in the build directory) and prints the
# summary; fails when a request failed or the daemon did not stop cleanly.
# Env: HEARTH_SHARED (fixtures), SOAK_REQUESTS, SOAK_CLIENTS, SOAK_SEED.
set -eu
builddir=${HEARTH_BUILDDIR:-.}
shared=${HEARTH_SHARED:-../shared}
csv=${SOAK_CSV:-$builddir/soak.csv}
dir=$(mktemp -d /tmp/hearth-soak-XXXXXX)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$dir"' EXIT
"$builddir/hearthd" --model="$shared/fixtures/fx-qwen3.gguf" --socket="$dir/hearth.sock" \
	--max-context=256 --kv-budget=8MiB --threads=1 --weights=w4a16 --log-level=warning \
	2>"$dir/hearthd.log" &
pid=$!
"$builddir/hearth" --socket "$dir/hearth.sock" --timeout 60 ping -c 1 >/dev/null
rc=0
nice -n 10 "$builddir/bench/soak" "$dir/hearth.sock" "$pid" \
	--requests "${SOAK_REQUESTS:-10000}" --clients "${SOAK_CLIENTS:-8}" \
	--seed "${SOAK_SEED:-1}" >"$csv" || rc=$?
kill -TERM "$pid"
wait "$pid" || { echo "soak: hearthd did not stop cleanly" >&2; rc=1; }
if [ -s "$dir/hearthd.log" ]; then
	echo "soak: hearthd's warnings:" >&2
	sort "$dir/hearthd.log" | cut -c25- | sort | uniq -c | sort -rn | head -5 >&2
fi
echo "soak: samples in $csv" >&2
exit $rc
