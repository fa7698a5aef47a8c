#!/bin/sh
# The module boundaries of DESIGN.md, checked on the source tree: the engine never includes a
# serving header, kernels include nothing of daemon/ or client/ and of protocol/ only the
# shared error codes (protocol/error.h), protocol nothing of either side, the benchmarks
# nothing of serving, and intrinsics live only in kernels/. TAP.
set -u
: "${HEARTH_SRCDIR:?HEARTH_SRCDIR is not set (make check sets it)}"
cd "$HEARTH_SRCDIR" || exit 1

n=0
fails=0
allow= # lines matching this (when set) are exempt from the check that follows
check() { # check DESCRIPTION PATTERN DIR...: no file under DIRs includes PATTERN
	desc=$1 pat=$2
	shift 2
	n=$((n + 1))
	hits=$(grep -rHE "$pat" "$@" --include='*.c' --include='*.h' 2>/dev/null |
		{ if [ -n "$allow" ]; then grep -vE ":$allow"; else cat; fi; } | cut -d: -f1 | sort -u)
	if [ -z "$hits" ]; then
		echo "ok $n - $desc"
	else
		fails=$((fails + 1))
		echo "not ok $n - $desc"
		echo "$hits" | sed 's/^/#   /'
	fi
}

echo "1..8"
check "daemon/engine includes no serving header" '#include "daemon/(serve|tools)/' daemon/engine
check "daemon/engine knows no wire types (frames, messages, rings)" \
	'#include "protocol/(msg|msg_fields|frame|ring|fdpass)\.h"' daemon/engine
allow='#include "protocol/error\.h"'
check "kernels/ include nothing of daemon/ or client/, and of protocol/ only error.h" \
	'#include "(daemon|client|protocol)/' kernels
allow=
check "protocol/ includes nothing of daemon/ or client/" '#include "(daemon|client)/' protocol
check "client/ includes nothing of daemon/" '#include "daemon/' client
check "nothing outside hearthd's main includes daemon/serve" '#include "daemon/serve/' \
	daemon/tools kernels protocol client
check "bench/ includes nothing of daemon/serve (it measures the engine)" '#include "daemon/serve/' \
	bench
check "intrinsics live only in kernels/" '#include <(immintrin|x86intrin)\.h>' daemon client protocol
[ "$fails" -eq 0 ]
