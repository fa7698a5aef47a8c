#!/bin/sh
# Jump-forward through the daemon: a real hearthd on the fx-qwen3 fixture generates under
# JSON Schemas with long fixed keys, with and without jump-forward, greedy and at
# temperature 1. Checks: every finished output validates (python3-jsonschema, through
# tests/support/schema_check.py); forced tokens were fed (done.n_forced > 0 with it, 0
# without, 0 when logprobs are asked); the stream stays coherent (one event per counted
# token, indexes 0..n_gen-1, forced tokens' logprob absent); and greedy output with and
# without it is compared (reported, not required equal: the forced text's tokenization
# may differ from the model's own, and then so may what follows). TAP.
set -u
: "${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set (make check sets it)}"
: "${HEARTH_SRCDIR:?HEARTH_SRCDIR is not set (make check sets it)}"
: "${HEARTH_SHARED:?HEARTH_SHARED is not set (make check sets it)}"
PY=/usr/bin/python3
S=$HEARTH_SRCDIR/tests/support
if ! "$PY" -c 'import jsonschema, msgpack' 2>/dev/null; then
	echo "Bail out! python3-jsonschema and python3-msgpack are missing (scripts/deps.sh installs them)"
	exit 1
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_jump.XXXXXX") || exit 1
HPID=
trap '[ -n "$HPID" ] && kill $HPID 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT

"$HEARTH_BUILDDIR/hearthd" --model="$HEARTH_SHARED/fixtures/fx-qwen3.gguf" --socket="$TMP/h.sock" \
	--max-context=1024 --kv-budget=16MiB --threads=2 --log-level=warning >"$TMP/hearthd.log" 2>&1 &
HPID=$!

cat >"$TMP/drive.py" <<'EOF'
import os, sys, time
sys.path.insert(0, os.environ["HEARTH_PY"])
import hearth
sock, out_path = sys.argv[1], sys.argv[2]
files = sys.argv[3:]
for _ in range(300):
    try:
        c = hearth.Client(sock, name="jump")
        break
    except hearth.HearthError:
        time.sleep(0.1)
n = 0
fails = 0
def check(ok, what):
    global n, fails
    n += 1
    if not ok:
        fails += 1
    print("%sok %d - %s" % ("" if ok else "not ", n, what))

forced_total = 0
same = compared = 0
with open(out_path, "w") as out:
    for f in files:
        name = os.path.basename(f)
        schema = open(f, encoding="utf-8").read()
        greedy = {}
        for jump in (True, False):
            for temp, seed in ((0.0, 1), (1.0, 1), (1.0, 2)):
                g = c.generate("Output:", max_tokens=300, temperature=temp, seed=seed, json_schema=schema,
                               jump_forward=jump).wait()
                d = g.done
                tag = "%s jump=%s temp=%g seed=%d" % (name, jump, temp, seed)
                forced = d.get("n_forced", 0)
                check(len(g.tokens) == d["n_gen"], "%s: one token event per generated token (%d, %d)"
                      % (tag, len(g.tokens), d["n_gen"]))
                if jump:
                    forced_total += forced
                    check(forced > 0 or d["finish"] != "stop", "%s: %d forced tokens fed" % (tag, forced))
                    check(all(t.logprob is None for t in g.tokens), "%s: no logprobs unasked" % tag)
                else:
                    check(forced == 0, "%s: nothing forced when turned off" % tag)
                if d["finish"] == "stop":
                    out.write("%s\t%s\n" % (f, b"".join(t.text for t in g.tokens).hex()))
                if temp == 0.0:
                    greedy[jump] = b"".join(t.text for t in g.tokens)
        compared += 1
        same += greedy[True] == greedy[False]
        print("# %s greedy: %s with and without jump-forward" % (name, "the same text" if greedy[True] == greedy[False] else "different texts"))
    # logprobs need the distribution at every position: nothing is jumped
    g = c.generate("Output:", max_tokens=120, temperature=0.0, json_schema=open(files[0]).read(), logprobs=True).wait()
    check(g.done.get("n_forced", 0) == 0 and len(g.tokens) == g.done["n_gen"]
          and any(t.logprob is not None for t in g.tokens),
          "with logprobs every token is sampled (nothing forced) and logprobs come")
    check(forced_total > 0, "jump-forward fed %d tokens in all" % forced_total)
print("# greedy outputs identical with and without jump-forward: %d of %d schemas" % (same, compared))
print("PLAN %d %d" % (n, fails))
EOF
HEARTH_PY="$HEARTH_SRCDIR/client/python" "$PY" "$TMP/drive.py" "$TMP/h.sock" "$TMP/s.txt" \
	"$S"/schemas/long_keys.json "$S"/schemas/ten_properties.json "$S"/schemas/tool_call.json \
	"$S"/schemas/order.json >"$TMP/d.tap" || { cat "$TMP/d.tap"; echo "Bail out! the client failed"; exit 1; }
n=$(sed -n 's/^PLAN \([0-9]*\) .*/\1/p' "$TMP/d.tap")
fails=$(sed -n 's/^PLAN [0-9]* \([0-9]*\)/\1/p' "$TMP/d.tap")
grep -v '^PLAN' "$TMP/d.tap"
"$PY" "$S/schema_check.py" <"$TMP/s.txt" >"$TMP/s.tap"
while IFS= read -r line; do
	case "$line" in
	"ok "*) n=$((n + 1)); echo "ok $n - valid: ${line#* - }" ;;
	"not ok "*) n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - valid: ${line#* - }" ;;
	"#"*) echo "$line" ;;
	esac
done <"$TMP/s.tap"
n=$((n + 1))
if [ -s "$TMP/s.txt" ]; then
	echo "ok $n - the schemas gave finished outputs to check"
else
	fails=$((fails + 1))
	echo "not ok $n - the schemas gave finished outputs to check"
fi
echo "1..$n"
[ "$fails" -eq 0 ]
