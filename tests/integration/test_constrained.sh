#!/bin/sh
# Structured output through the daemon, as a client gets it: a real hearthd on the fx-qwen3
# fixture samples at temperature 1 with several seeds under (1) every GBNF grammar of
# shared/grammars, checked by the independent recognizer (tests/support/gbnf_check.py), and
# (2) random JSON Schemas (tests/support/schema_gen.py) plus the real-world ones of
# tests/support/schemas, validated by python3-jsonschema (tests/support/schema_check.py).
# Random weights put about 1/n_vocab on closing an unbounded string, so an output may reach
# max_tokens first: those are counted and left out (a cut-off output is no claim of the
# grammar); every output the model finished must be valid. TAP.
#   HEARTH_CONSTRAINED_SCHEMAS=220 HEARTH_CONSTRAINED_SEEDS=3 HEARTH_CONSTRAINED_MAX_TOKENS=384
#   for the full run (make check-constrained).
set -u
: "${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set (make check sets it)}"
: "${HEARTH_SRCDIR:?HEARTH_SRCDIR is not set (make check sets it)}"
: "${HEARTH_SHARED:?HEARTH_SHARED is not set (make check sets it)}"
PY=/usr/bin/python3
N_SCHEMAS=${HEARTH_CONSTRAINED_SCHEMAS:-8}
N_SEEDS=${HEARTH_CONSTRAINED_SEEDS:-1}
MAX_TOKENS=${HEARTH_CONSTRAINED_MAX_TOKENS:-160}
S=$HEARTH_SRCDIR/tests/support
if ! "$PY" -c 'import jsonschema, msgpack' 2>/dev/null; then
	echo "Bail out! python3-jsonschema and python3-msgpack are missing (scripts/deps.sh installs them)"
	exit 1
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_constrained.XXXXXX") || exit 1
HPID=
trap '[ -n "$HPID" ] && kill $HPID 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT

"$HEARTH_BUILDDIR/hearthd" --model="$HEARTH_SHARED/fixtures/fx-qwen3.gguf" --socket="$TMP/h.sock" \
	--max-context=1024 --kv-budget=16MiB --threads=2 --log-level=warning >"$TMP/hearthd.log" 2>&1 &
HPID=$!
"$PY" "$S/schema_gen.py" "$TMP" "$N_SCHEMAS" 7 || exit 1

# One client, every request in turn: (file, kind) -> "FILE<TAB>HEX" lines for finished outputs.
cat >"$TMP/drive.py" <<'EOF'
import os, sys, time
sys.path.insert(0, os.environ["HEARTH_PY"])
import hearth
sock, kind, seeds, max_tokens, out_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
files = sys.argv[6:]
for _ in range(300):
    try:
        c = hearth.Client(sock, name="constrained")
        break
    except hearth.HearthError:
        time.sleep(0.1)
finished = cut = 0
with open(out_path, "w") as out:
    for f in files:
        text = open(f, encoding="utf-8").read()
        for seed in range(1, seeds + 1):
            kw = {"grammar": text} if kind == "gbnf" else {"json_schema": text}
            try:
                g = c.generate("Output:", max_tokens=max_tokens, temperature=1.0, seed=seed, **kw).wait()
            except hearth.HearthError as e:
                out.write("%s\terror: %s\n" % (f, e))
                continue
            if g.done["finish"] == "stop":
                finished += 1
                out.write("%s\t%s%s\n" % (f, b"".join(t.text for t in g.tokens).hex(), "\t1" if kind == "gbnf" else ""))
            else:
                cut += 1
print("# %s: %d outputs finished, %d reached max_tokens (left out)" % (kind, finished, cut))
EOF
HEARTH_PY="$HEARTH_SRCDIR/client/python" "$PY" "$TMP/drive.py" "$TMP/h.sock" gbnf "$N_SEEDS" "$MAX_TOKENS" "$TMP/g.txt" \
	"$HEARTH_SHARED"/grammars/*.gbnf
HEARTH_PY="$HEARTH_SRCDIR/client/python" "$PY" "$TMP/drive.py" "$TMP/h.sock" schema "$N_SEEDS" "$MAX_TOKENS" "$TMP/s.txt" \
	"$S"/schemas/*.json "$TMP"/random-*.json

# The two checkers' TAP, renumbered into one stream.
n=0
fails=0
emit() {
	while IFS= read -r line; do
		case "$line" in
		"ok "*) n=$((n + 1)); echo "ok $n - $1: ${line#* - }" ;;
		"not ok "*) n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1: ${line#* - }" ;;
		"#"*) echo "$line" ;;
		esac
	done
}
"$PY" "$S/gbnf_check.py" <"$TMP/g.txt" >"$TMP/g.tap"
emit grammar <"$TMP/g.tap"
"$PY" "$S/schema_check.py" <"$TMP/s.txt" >"$TMP/s.tap"
emit schema <"$TMP/s.tap"
n=$((n + 1))
if [ -s "$TMP/s.txt" ]; then
	echo "ok $n - the schemas gave finished outputs to check"
else
	fails=$((fails + 1))
	echo "not ok $n - the schemas gave finished outputs to check"
fi
echo "1..$n"
[ "$fails" -eq 0 ]
