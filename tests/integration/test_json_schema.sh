#!/bin/sh
# JSON Schema validity: 220 random schemas (tests/support/schema_gen.py) and a dozen
# real-world ones (tests/support/schemas/) go through json_schema.c and the grammar engine;
# strings sampled from each grammar by random walks (tests/support/grammar_sample) must all
# parse as JSON and validate under python3-jsonschema (tests/support/schema_check.py).
# Prints TAP, one test per schema.
set -u
: "${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set (make check sets it)}"
: "${HEARTH_SRCDIR:?HEARTH_SRCDIR is not set (make check sets it)}"
PY=/usr/bin/python3
if ! "$PY" -c 'import jsonschema' 2>/dev/null; then
	echo "1..0 # SKIP python3-jsonschema is missing (Debian: apt-get install python3-jsonschema)"
	exit 0
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_json_schema.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
seed=${HEARTH_SEED:-1}
"$PY" "$HEARTH_SRCDIR/tests/support/schema_gen.py" "$TMP" 220 "$seed" || exit 1
"$HEARTH_BUILDDIR/tests/support/grammar_sample" schema 25 "$seed" \
	"$HEARTH_SRCDIR"/tests/support/schemas/*.json "$TMP"/random-*.json > "$TMP/samples" ||
	{ echo "1..1"; echo "not ok 1 - grammar_sample failed"; exit 0; }
"$PY" "$HEARTH_SRCDIR/tests/support/schema_check.py" < "$TMP/samples"
