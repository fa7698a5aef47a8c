#!/bin/sh
# The systemd side of the install, checked offline (no systemd PID 1 needed): the units
# pass `systemd-analyze verify` and the offline security review, carry the settings the
# daemon relies on, sysusers/tmpfiles create the user and /run/hearth, and the man pages
# render without warnings. TAP output.
set -u

srcdir=${HEARTH_SRCDIR:-}
builddir=${HEARTH_BUILDDIR:-}
if [ -z "$srcdir" ]; then
	echo "Bail out! HEARTH_SRCDIR is not set: run through make check or set it to the source tree"
	exit 1
fi

tmp=$(mktemp -d /tmp/hearth-test-units-XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT

n=0
failed=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); failed=1; echo "not ok $n - $1"; [ -n "${2:-}" ] && printf '%s\n' "$2" | sed 's/^/# /'; }
skip() { n=$((n + 1)); echo "ok $n - $1 # SKIP $2"; }

echo "1..14"

# verify checks that Exec*= binaries exist and are executable and that Documentation=
# man pages resolve, so give it a stand-in hearthd and our own pages on MANPATH.
mkdir -p "$tmp/sbin" "$tmp/units" "$tmp/man/man1" "$tmp/man/man5" "$tmp/man/man8"
cp /bin/true "$tmp/sbin/hearthd"
cp "$srcdir/doc/hearth.1" "$tmp/man/man1/"
cp "$srcdir/doc/hearthd.conf.5" "$tmp/man/man5/"
cp "$srcdir/doc/hearthd.8" "$tmp/man/man8/"
sed -e "s|@sbindir@|$tmp/sbin|g" -e "s|@sysconfdir@|/etc|g" \
	"$srcdir/systemd/hearthd.service.in" > "$tmp/units/hearthd.service"
cp "$srcdir/systemd/hearthd.socket" "$tmp/units/"

# Warnings (unknown keys, bad values) leave verify's exit status at 0, so any output at
# all counts as a failure.
verify() {
	out=$(cd "$1" && MANPATH="$tmp/man" systemd-analyze verify ./hearthd.socket ./hearthd.service 2>&1)
	rc=$?
	[ $rc -eq 0 ] && [ -z "$out" ]
}

if grep -q '@[a-z_]*@' "$tmp/units/hearthd.service"; then
	not_ok "hearthd.service.in: every @var@ is substituted" "$(grep -n '@[a-z_]*@' "$tmp/units/hearthd.service")"
else
	ok "hearthd.service.in: every @var@ is substituted"
fi

if ! command -v systemd-analyze >/dev/null 2>&1; then
	for t in 2 3 4 5; do skip "systemd-analyze check $t" "systemd-analyze missing (Debian package systemd)"; done
else
	if verify "$tmp/units"; then
		ok "systemd-analyze verify hearthd.socket hearthd.service"
	else
		not_ok "systemd-analyze verify hearthd.socket hearthd.service" "$out"
	fi

	# The check must be able to fail: a misspelt value and an unknown key are reported.
	mkdir -p "$tmp/broken"
	sed -e 's/^Type=notify$/Type=notfy/' -e 's/^WatchdogSec=.*/WatchdogSecs=30s/' \
		"$tmp/units/hearthd.service" > "$tmp/broken/hearthd.service"
	cp "$tmp/units/hearthd.socket" "$tmp/broken/"
	if verify "$tmp/broken"; then
		not_ok "verify reports a broken unit (control)"
	elif printf '%s' "$out" | grep -q 'notfy' && printf '%s' "$out" | grep -q 'WatchdogSecs'; then
		ok "verify reports a broken unit (control)"
	else
		not_ok "verify reports a broken unit (control)" "$out"
	fi

	# The unit make builds: same checks with ExecStart pointed at the stand-in.
	if [ -n "$builddir" ] && [ -f "$builddir/systemd/hearthd.service" ]; then
		mkdir -p "$tmp/built"
		sed -e "s|^ExecStart=.*/hearthd|ExecStart=$tmp/sbin/hearthd|" \
			"$builddir/systemd/hearthd.service" > "$tmp/built/hearthd.service"
		cp "$tmp/units/hearthd.socket" "$tmp/built/"
		if grep -q '@[a-z_]*@' "$builddir/systemd/hearthd.service"; then
			not_ok "built hearthd.service verifies" "$(grep -n '@[a-z_]*@' "$builddir/systemd/hearthd.service")"
		elif ! grep -q '^ExecStart=/.*/hearthd$' "$builddir/systemd/hearthd.service"; then
			not_ok "built hearthd.service verifies" "$(grep -n '^ExecStart' "$builddir/systemd/hearthd.service")"
		elif verify "$tmp/built"; then
			ok "built hearthd.service verifies"
		else
			not_ok "built hearthd.service verifies" "$out"
		fi
	else
		skip "built hearthd.service verifies" "no built unit in HEARTH_BUILDDIR"
	fi

	# Exposure 0.0 (locked down) .. 10.0 (unprotected); the shipped unit scores 0.8.
	out=$(cd "$tmp/units" && systemd-analyze security --offline=yes --threshold=20 ./hearthd.service 2>&1)
	if [ $? -eq 0 ]; then
		ok "systemd-analyze security: exposure at most 2.0 ($(printf '%s' "$out" | grep -o 'level for hearthd.service: [0-9.]*' | sed 's/.*: //'))"
	else
		not_ok "systemd-analyze security: exposure at most 2.0" "$(printf '%s' "$out" | tail -3)"
	fi
fi

# The settings the daemon's design depends on (see DESIGN.md and hearthd(8)).
missing=""
for line in 'Type=notify' 'NotifyAccess=main' 'ExecReload=/bin/kill -HUP $MAINPID' \
	'WatchdogSec=30s' 'Restart=on-failure' 'User=hearth' 'Group=hearth' \
	'RuntimeDirectory=hearth' 'RuntimeDirectoryPreserve=yes' 'LimitMEMLOCK=infinity' \
	'NoNewPrivileges=yes' 'ProtectSystem=strict' 'ProtectHome=yes' 'PrivateTmp=yes' \
	'PrivateDevices=yes' 'RestrictAddressFamilies=AF_UNIX' 'MemoryDenyWriteExecute=yes' \
	'SystemCallFilter=@system-service' 'Requires=hearthd.socket'; do
	grep -qxF "$line" "$tmp/units/hearthd.service" || missing="$missing
$line"
done
if [ -z "$missing" ]; then ok "hearthd.service has the required settings"; else not_ok "hearthd.service has the required settings" "missing:$missing"; fi

# PrivateUsers= would map every client uid to nobody in SO_PEERCRED.
if grep -q '^PrivateUsers=' "$tmp/units/hearthd.service"; then
	not_ok "hearthd.service does not set PrivateUsers= (it would defeat allow_users)"
else
	ok "hearthd.service does not set PrivateUsers= (it would defeat allow_users)"
fi

missing=""
for line in 'ListenStream=/run/hearth/hearth.sock' 'SocketMode=0660' 'SocketGroup=hearth' \
	'WantedBy=sockets.target'; do
	grep -qxF "$line" "$tmp/units/hearthd.socket" || missing="$missing
$line"
done
if [ -z "$missing" ]; then ok "hearthd.socket has the required settings"; else not_ok "hearthd.socket has the required settings" "missing:$missing"; fi

# The socket path of the unit is the config's default.
if grep -q '^#socket = /run/hearth/hearth.sock$' "$srcdir/systemd/hearthd.conf.example"; then
	ok "hearthd.socket and the config default agree on the socket path"
else
	not_ok "hearthd.socket and the config default agree on the socket path"
fi

# sysusers and tmpfiles against a scratch root: needs root to chown.
if [ "$(id -u)" -ne 0 ] || ! command -v systemd-sysusers >/dev/null 2>&1; then
	skip "sysusers creates user and group hearth" "needs root and systemd-sysusers"
	skip "tmpfiles creates /run/hearth 0755 hearth:hearth" "needs root and systemd-tmpfiles"
else
	mkdir -p "$tmp/root/etc"
	out=$(systemd-sysusers --root="$tmp/root" "$srcdir/systemd/hearth.sysusers" 2>&1)
	if [ $? -eq 0 ] && grep -q '^hearth:x:[0-9]*:[0-9]*:.*:/usr/sbin/nologin$' "$tmp/root/etc/passwd" &&
		grep -q '^hearth:x:[0-9]*:$' "$tmp/root/etc/group"; then
		ok "sysusers creates user and group hearth"
	else
		not_ok "sysusers creates user and group hearth" "$out"
	fi
	out=$(systemd-tmpfiles --root="$tmp/root" --create "$srcdir/systemd/hearth.tmpfiles" 2>&1)
	uid=$(grep '^hearth:' "$tmp/root/etc/passwd" | cut -d: -f3)
	gid=$(grep '^hearth:' "$tmp/root/etc/group" | cut -d: -f3)
	got=$(stat -c '%a %u %g' "$tmp/root/run/hearth" 2>/dev/null)
	if [ -n "$uid" ] && [ "$got" = "755 $uid $gid" ]; then
		ok "tmpfiles creates /run/hearth 0755 hearth:hearth"
	else
		not_ok "tmpfiles creates /run/hearth 0755 hearth:hearth" "got '$got' $out"
	fi
fi

# Man pages: groff's own warnings (-ww), which catch bad requests and escapes.
for page in hearthd.8 hearth.1 hearthd.conf.5; do
	out=$(groff -man -ww -z "$srcdir/doc/$page" 2>&1)
	if [ $? -eq 0 ] && [ -z "$out" ]; then ok "man page $page renders without warnings"; else not_ok "man page $page renders without warnings" "$out"; fi
done

exit $failed
