#!/bin/sh
# The Python client's pytest suite (client/python/tests) against a real hearthd, reported as
# TAP: one line per pytest case, so make check counts each of them.
set -u
: "${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set (make check sets it)}"
: "${HEARTH_SRCDIR:?HEARTH_SRCDIR is not set (make check sets it)}"
PY=/usr/bin/python3
if ! "$PY" -c 'import msgpack, pytest' 2>/dev/null; then
	echo "Bail out! python3-msgpack and python3-pytest are missing (scripts/deps.sh installs them)"
	exit 1
fi
out=$(mktemp "${TMPDIR:-/tmp}/test_python.XXXXXX") || exit 1
trap 'rm -f "$out"' EXIT
cd "$HEARTH_SRCDIR/client/python" || exit 1
PYTHONPATH="$HEARTH_SRCDIR/client/python" PYTHONDONTWRITEBYTECODE=1 \
	"$PY" -m pytest -v -p no:cacheprovider tests >"$out" 2>&1
rc=$?
awk '
	/ (PASSED|FAILED|ERROR)( |$)/ {
		n++
		name = $1; sub(/^.*::/, "", name)
		if ($0 ~ / PASSED/) print "ok " n " - " name; else { print "not ok " n " - " name; bad = 1 }
	}
	END { print "1.." n }
' "$out"
[ "$rc" -eq 0 ] || sed 's/^/# /' "$out" | tail -n 60
exit "$rc"
