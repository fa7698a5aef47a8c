#!/bin/sh
# Random walks of every shared GBNF grammar (tests/support/grammar_sample) checked by an
# independent recognizer (tests/support/gbnf_check.py: its own GBNF parser and matcher), which
# must also agree with the engine's accept/reject verdict on mutated strings. Prints TAP.
set -u
: "${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set (make check sets it)}"
: "${HEARTH_SRCDIR:?HEARTH_SRCDIR is not set (make check sets it)}"
: "${HEARTH_SHARED:?HEARTH_SHARED is not set (make check sets it)}"
PY=/usr/bin/python3
if ! "$PY" -c 'import sys' 2>/dev/null; then
	echo "1..0 # SKIP $PY is missing"
	exit 0
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_grammar.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
"$HEARTH_BUILDDIR/tests/support/grammar_sample" gbnf 200 "${HEARTH_SEED:-11}" \
	"$HEARTH_SHARED"/grammars/*.gbnf > "$TMP/samples" || { echo "1..1"; echo "not ok 1 - grammar_sample failed"; exit 0; }
"$PY" "$HEARTH_SRCDIR/tests/support/gbnf_check.py" < "$TMP/samples"
