#!/bin/bash
# hearth under a real systemd as PID 1: a Debian 12 root (debootstrap, cached outside the
# tree and reused), booted with systemd-nspawn, hearth installed into it with
# `make install DESTDIR=`, then the unit contract checked from inside the container:
# socket activation, Type=notify READY/STATUS, the watchdog restarting a stopped daemon,
# Restart= after a crash, the hardening read back from `systemctl show` and seen in
# /proc, journald priorities, `systemctl reload` swapping the model.
# Usage (as root, from the build tree): make check-systemd
# Env: HEARTH_SYSTEMD_CACHE (default /var/cache/hearth-systemd-test), HEARTH_SHARED,
#      SBINDIR, BINDIR, SYSCONFDIR (the configured install paths; make passes them).
# Prints a markdown table of results; exits 1 if any check failed, 77 if it cannot run.
set -u

CACHE=${HEARTH_SYSTEMD_CACHE:-/var/cache/hearth-systemd-test}
ROOT=$CACHE/root
SHARED=${HEARTH_SHARED:-../shared}
BUILDDIR=${HEARTH_BUILDDIR:-$(pwd)}
SBINDIR=${SBINDIR:-/usr/local/sbin}
BINDIR=${BINDIR:-/usr/local/bin}
SYSCONFDIR=${SYSCONFDIR:-/usr/local/etc}
MACHINE=hearth-systemd-test
RESULTS=${RESULTS:-$BUILDDIR/systemd-test-results.md}
fails=0
rows=()

skip() { echo "check-systemd: cannot run: $*" >&2; exit 77; }
row() { # name, ok|FAIL, detail
	rows+=("| $1 | $2 | $3 |")
	[ "$2" = ok ] || fails=$((fails + 1))
	echo "[$2] $1: $3" >&2
}

[ "$(id -u)" = 0 ] || skip "needs root (debootstrap, systemd-nspawn)"
command -v debootstrap >/dev/null || skip "debootstrap missing (apt-get install debootstrap)"
command -v systemd-nspawn >/dev/null || skip "systemd-nspawn missing (apt-get install systemd-container)"
[ -f "$SHARED/fixtures/fx-qwen3.gguf" ] || skip "no fixtures in $SHARED"

# ---- the root, made once and reused ----
if [ ! -x "$ROOT/usr/lib/systemd/systemd" ]; then
	mkdir -p "$CACHE"
	mirror=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
	[ -n "$mirror" ] || mirror=$(awk '/^deb / { print $2; exit }' /etc/apt/sources.list 2>/dev/null)
	[ -n "$mirror" ] || skip "no Debian mirror in the host's apt sources"
	echo "check-systemd: debootstrap bookworm into $ROOT (once)" >&2
	rm -rf "$ROOT.tmp"
	debootstrap --variant=minbase \
		--include=systemd,systemd-sysv,dbus,libuv1,libmsgpackc2,libnuma1,libsystemd0,libedit2,libjansson4,libmicrohttpd12,procps,iproute2 \
		bookworm "$ROOT.tmp" "$mirror" >"$CACHE/debootstrap.log" 2>&1 ||
		skip "debootstrap failed (see $CACHE/debootstrap.log)"
	mv "$ROOT.tmp" "$ROOT"
fi

# ---- hearth into the root ----
make -C "$BUILDDIR" -s install DESTDIR="$ROOT" >/dev/null || { echo "make install failed" >&2; exit 1; }
mkdir -p "$ROOT/var/lib/hearth-test" "$ROOT$SYSCONFDIR/hearth" "$ROOT/etc/systemd/system/hearthd.service.d"
cp "$SHARED/fixtures/fx-qwen3.gguf" "$ROOT/var/lib/hearth-test/qwen3.gguf"
cp "$SHARED/fixtures/fx-llama.gguf" "$ROOT/var/lib/hearth-test/llama.gguf"
chmod 0644 "$ROOT"/var/lib/hearth-test/*.gguf
conf() {
	cat >"$ROOT$SYSCONFDIR/hearth/hearthd.conf" <<EOF
model = /var/lib/hearth-test/$1.gguf
max_context = 256
kv_budget = 4MiB
weights = w4a16
threads = 2
model_swap = drain
log_level = info
EOF
}
conf qwen3
# The one change to the shipped unit: a short watchdog, so the hang test takes seconds.
cat >"$ROOT/etc/systemd/system/hearthd.service.d/test.conf" <<EOF
[Service]
WatchdogSec=6s
EOF
echo "$MACHINE" >"$ROOT/etc/hostname"

# ---- boot ----
log=$CACHE/nspawn.log
systemd-nspawn -q -D "$ROOT" -M "$MACHINE" --register=no --keep-unit -b --console=pipe \
	</dev/null >"$log" 2>&1 &
nspawn=$!
cleanup() {
	if [ -n "${pid1:-}" ]; then
		nsenter -t "$pid1" -a systemctl poweroff >/dev/null 2>&1
	fi
	for _ in $(seq 1 100); do kill -0 "$nspawn" 2>/dev/null || break; sleep 0.1; done
	kill "$nspawn" 2>/dev/null
	wait "$nspawn" 2>/dev/null
}
trap cleanup EXIT
pid1=
for _ in $(seq 1 100); do
	pid1=$(pgrep -P "$nspawn" -x systemd | head -1)
	[ -n "$pid1" ] && break
	sleep 0.1
done
[ -n "$pid1" ] || skip "systemd-nspawn did not start systemd (see $log)"
ct() { nsenter -t "$pid1" -a "$@"; }
state=
for _ in $(seq 1 300); do
	state=$(ct systemctl is-system-running 2>/dev/null)
	case "$state" in running|degraded) break ;; esac
	sleep 0.1
done
case "$state" in running|degraded) ;; *) skip "the container's systemd never finished booting ($state)" ;; esac
row "systemd is PID 1 in the container" ok "$(ct cat /proc/1/comm), system $state"

ct ldconfig
ct systemd-sysusers >/dev/null 2>&1
ct systemd-tmpfiles --create >/dev/null 2>&1
ct systemctl daemon-reload
ct systemctl enable --now hearthd.socket >/dev/null 2>&1
show() { ct systemctl show -P "$2" "$1"; }
wait_for() { # unit property value seconds
	for _ in $(seq 1 $(($4 * 10))); do
		[ "$(show "$1" "$2")" = "$3" ] && return 0
		sleep 0.1
	done
	return 1
}
HEARTH="$BINDIR/hearth"

# ---- socket activation ----
before=$(show hearthd.service ActiveState)
out=$(ct "$HEARTH" --timeout 60 ping -c 1 2>&1)
# Type=notify: `activating` (STATUS= shows the load) until READY=1, then `active`.
mid=$(show hearthd.service ActiveState)
mid_status=$(show hearthd.service StatusText)
wait_for hearthd.service ActiveState active 60
after=$(show hearthd.service ActiveState)
if [ "$before" = inactive ] && [ "$after" = active ] && [ "$(show hearthd.socket ActiveState)" = active ]; then
	row "socket activation" ok "hearthd.service $before until the first connection (hearth ping: $out), then $mid, then $after"
else
	row "socket activation" FAIL "service $before -> $mid -> $after; ping: $out"
fi

# ---- Type=notify: READY and STATUS ----
sleep 1.5 # one status tick after READY
status=$(show hearthd.service StatusText)
type=$(show hearthd.service Type)
if [ "$type" = notify ] && [ "$after" = active ] && [ -n "$status" ]; then
	row "Type=notify READY=1, STATUS=" ok "Type=$type; while loading: $mid, StatusText=\"$mid_status\"; after READY=1: $after, StatusText=\"$status\""
else
	row "Type=notify READY=1, STATUS=" FAIL "Type=$type $mid (\"$mid_status\") -> $after, StatusText=\"$status\""
fi
ct journalctl -u hearthd --no-pager -o short-monotonic >"$CACHE/journal-start.txt" 2>&1

# ---- hardening in force ----
pid=$(show hearthd.service MainPID)
hard=""
for p in ProtectSystem ProtectHome PrivateNetwork PrivateDevices PrivateTmp NoNewPrivileges \
	MemoryDenyWriteExecute RestrictAddressFamilies SystemCallFilter CapabilityBoundingSet \
	ProtectKernelTunables ProtectControlGroups RestrictNamespaces LockPersonality User; do
	v=$(show hearthd.service "$p" | cut -c1-40)
	hard="$hard$p=$v; "
done
nnp=$(ct awk '/^NoNewPrivs/ { print $2 }' /proc/"$pid"/status)
seccomp=$(ct awk '/^Seccomp:/ { print $2 }' /proc/"$pid"/status)
capbnd=$(ct awk '/^CapBnd/ { print $2 }' /proc/"$pid"/status)
netns_d=$(ct readlink /proc/"$pid"/ns/net)
netns_1=$(ct readlink /proc/1/ns/net)
ro=$(ct nsenter -t "$pid" -m sh -c 'touch /usr/.hearth-probe 2>&1 || true' | head -1)
wx=$(ct awk '$2 ~ /w.x/' /proc/"$pid"/maps | wc -l)
if [ "$nnp" = 1 ] && [ "$seccomp" = 2 ] && [ "$capbnd" = 0000000000000000 ] &&
	[ "$netns_d" != "$netns_1" ] && [ -n "$ro" ] && [ "$wx" = 0 ] &&
	[ "$(show hearthd.service ProtectSystem)" = strict ] &&
	[ "$(show hearthd.service PrivateNetwork)" = yes ] &&
	[ "$(show hearthd.service MemoryDenyWriteExecute)" = yes ]; then
	row "hardening in force" ok "$hard in /proc: NoNewPrivs=$nnp Seccomp=$seccomp CapBnd=$capbnd, own netns ($netns_d vs $netns_1), /usr read-only (\"$ro\"), $wx w+x mappings"
else
	row "hardening in force" FAIL "$hard NoNewPrivs=$nnp Seccomp=$seccomp CapBnd=$capbnd netns $netns_d/$netns_1 ro=\"$ro\" wx=$wx"
fi

# ---- journald priorities ----
prios=$(ct journalctl -u hearthd -o verbose --no-pager 2>/dev/null |
	awk '/PRIORITY=/ { sub(/.*PRIORITY=/, ""); p = $1 } /MESSAGE=/ { sub(/.*MESSAGE=/, ""); print p " " $0 }')
ready_p=$(echo "$prios" | awk '/ ready: / { print $1; exit }')
info_p=$(echo "$prios" | awk '/ loading \// { print $1; exit }')
if [ "$ready_p" = 5 ] && [ "$info_p" = 6 ]; then
	row "journald priorities" ok "\"ready: ...\" at PRIORITY=$ready_p (notice), \"loading ...\" at PRIORITY=$info_p (info)"
else
	row "journald priorities" FAIL "ready at '$ready_p', loading at '$info_p'"
fi

# ---- the watchdog restarts a stopped daemon ----
restarts0=$(show hearthd.service NRestarts)
pid=$(show hearthd.service MainPID)
ct kill -STOP "$pid"
t0=$(date +%s)
ok=
for _ in $(seq 1 300); do
	np=$(show hearthd.service MainPID)
	if [ "$np" != "$pid" ] && [ "$np" != 0 ] && [ "$(show hearthd.service ActiveState)" = active ]; then ok=1; break; fi
	sleep 0.1
done
t1=$(date +%s)
wd=$(ct journalctl -u hearthd --no-pager 2>/dev/null | grep -c -i "watchdog timeout")
if [ -n "$ok" ] && [ "$wd" -ge 1 ]; then
	row "watchdog restarts a hung (SIGSTOPped) daemon" ok "WatchdogSec=6s: pid $pid -> $np after $((t1 - t0)) s, journal: \"Watchdog timeout\", NRestarts $restarts0 -> $(show hearthd.service NRestarts)"
else
	row "watchdog restarts a hung (SIGSTOPped) daemon" FAIL "pid $pid -> $(show hearthd.service MainPID) after $((t1 - t0)) s, watchdog lines $wd"
fi

# ---- Restart= after a crash ----
restarts0=$(show hearthd.service NRestarts)
pid=$(show hearthd.service MainPID)
ct kill -SEGV "$pid"
ok=
for _ in $(seq 1 300); do
	np=$(show hearthd.service MainPID)
	if [ "$np" != "$pid" ] && [ "$np" != 0 ] && [ "$(show hearthd.service ActiveState)" = active ]; then ok=1; break; fi
	sleep 0.1
done
if [ -n "$ok" ]; then
	row "Restart=on-failure after a crash (SIGSEGV)" ok "pid $pid -> $np, NRestarts $restarts0 -> $(show hearthd.service NRestarts), result before restart: $(ct journalctl -u hearthd --no-pager | grep -m1 -o 'Main process exited, code=dumped, status=11/SEGV\|Main process exited, code=killed, status=11/SEGV')"
else
	row "Restart=on-failure after a crash (SIGSEGV)" FAIL "pid $pid -> $(show hearthd.service MainPID)"
fi

# ---- CacheDirectory= keeps what the first start made (imatrix = auto, weights_cache) ----
# The first start self-calibrated and kept the calibration and the rounded weights in
# /var/cache/hearth; the restarts above read both instead of sampling and rounding again.
journal=$(ct journalctl -u hearthd --no-pager 2>/dev/null)
files=$(ct ls -l /var/cache/hearth 2>&1 | awk 'NR > 1 { print $3 ":" $9 }' | tr '\n' ' ')
made=$(echo "$journal" | grep -c "imatrix = self: /var/cache/hearth/.*\.imatrix\.gguf made in")
kept=$(echo "$journal" | grep -c "packed matrices kept in /var/cache/hearth/qwen3-")
read=$(echo "$journal" | grep -c "packed matrices read from /var/cache/hearth/qwen3-")
again=$(echo "$journal" | grep -c "made at an earlier start")
if echo "$journal" | grep -q "imatrix = auto: self-calibrated" && [ "$made" = 1 ] && [ "$kept" = 1 ] &&
	[ "$read" -ge 2 ] && [ "$again" -ge 2 ] &&
	echo "$files" | grep -q "hearth:qwen3-[0-9a-f]*\.weights" && echo "$files" | grep -q "hearth:qwen3-.*\.imatrix\.gguf"; then
	row "CacheDirectory= keeps the calibration and the rounded weights" ok "imatrix = auto self-calibrated once ($made file made, $kept weights file kept), the $read restarts read both; /var/cache/hearth: $files"
else
	row "CacheDirectory= keeps the calibration and the rounded weights" FAIL "made $made, kept $kept, read $read, earlier $again; /var/cache/hearth: $files"
fi

# ---- systemctl reload swaps the model ----
conf llama
ct systemctl reload hearthd.service
ok=
for _ in $(seq 1 300); do
	if ct journalctl -u hearthd --no-pager 2>/dev/null | grep -q "ready: /var/lib/hearth-test/llama.gguf, llama"; then ok=1; break; fi
	sleep 0.1
done
gen=$(ct "$HEARTH" --timeout 60 generate -n 4 --temp 0 "hello" 2>&1 | tr '\n' ' ' | cut -c1-60)
if [ -n "$ok" ] && [ "$(show hearthd.service ActiveState)" = active ]; then
	row "systemctl reload swaps the model" ok "journal: \"ready: .../llama.gguf, llama model\", same pid $(show hearthd.service MainPID), generate after: \"$gen\""
else
	row "systemctl reload swaps the model" FAIL "state $(show hearthd.service ActiveState), generate: $gen"
fi
conf qwen3
ct journalctl -u hearthd --no-pager -o short-monotonic >"$CACHE/journal.txt" 2>&1

{
	echo "| check | result | what was seen |"
	echo "|-------|--------|---------------|"
	printf '%s\n' "${rows[@]}"
} | tee "$RESULTS"
echo "journal: $CACHE/journal.txt" >&2
[ "$fails" = 0 ]
