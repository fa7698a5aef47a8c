# Sourced by the speculative-decoding tests (test_speculate.sh, test_draft_model.sh),
# test_imatrix.sh and test_imatrix_self.sh: a hearthd on $SOCK, generations through `hearth
# generate --json` ($GEN_TOKENS tokens), the daemon's draft counters and quantization name,
# and TAP lines. The caller sets B (the
# build directory), TMP and SOCK, and HPID= before its EXIT trap.
GEN_TOKENS=${GEN_TOKENS:-64}
n=0
fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"; }
check() { # status description
	if [ "$1" = 0 ]; then ok "$2"; else not_ok "$2"; fi
}

# The served model's quantization name (stats' model.quant).
quant() {
	"$B/hearth" --socket "$SOCK" stats --json 2>/dev/null | sed -n 's/.*"model":{[^}]*"quant":"\([^"]*\)".*/\1/p'
}

# start LOG HEARTHD-OPTION...: a hearthd on $SOCK, waited for until it answers.
start() {
	log=$1
	shift
	"$B/hearthd" --socket="$SOCK" --threads=2 --log-level=warning "$@" >"$TMP/$log" 2>&1 &
	HPID=$!
	for _ in $(seq 100); do
		"$B/hearth" --socket "$SOCK" ping -c 1 >/dev/null 2>&1 && break
		sleep 0.1
	done
}

# refused_at_load WORDS DESCRIPTION HEARTHD-OPTION...: a hearthd that must exit on its own
# (its load refused) with WORDS in its log; one TAP line (check, from the caller).
refused_at_load() {
	words=$1 desc=$2
	shift 2
	"$B/hearthd" --socket="$SOCK" --threads=2 "$@" >"$TMP/refused.log" 2>&1 &
	rpid=$!
	for _ in $(seq 100); do kill -0 $rpid 2>/dev/null || break; sleep 0.1; done
	kill $rpid 2>/dev/null
	wait $rpid
	rc=$?
	grep -q -- "$words" "$TMP/refused.log" && [ $rc != 0 ]
	refused=$?
	[ $refused = 0 ] || sed 's/^/# /' "$TMP/refused.log"
	check $refused "$desc"
}

stop() {
	kill $HPID
	wait $HPID 2>/dev/null
	HPID=
	rm -f "$SOCK"
}

# The daemon's draft counters since it started: all drafts, and the draft model's.
drafts() {
	stats=$("$B/hearth" --socket "$SOCK" stats --json)
	drafted=$(echo "$stats" | sed -n 's/.*"draft_tokens":\([0-9]*\).*/\1/p')
	accepted=$(echo "$stats" | sed -n 's/.*"draft_accepted":\([0-9]*\).*/\1/p')
	model_drafted=$(echo "$stats" | sed -n 's/.*"draft_model_tokens":\([0-9]*\).*/\1/p')
	model_accepted=$(echo "$stats" | sed -n 's/.*"draft_model_accepted":\([0-9]*\).*/\1/p')
}

# The token ids a generation printed, one a line.
gen() { # out prompt args...
	out=$1 prompt=$2
	shift 2
	"$B/hearth" --socket "$SOCK" generate --json -n "$GEN_TOKENS" "$@" "$prompt" >"$out.json" 2>"$out.err" &&
		sed -n 's/.*"token":\([0-9]*\).*/\1/p' "$out.json" >"$out"
}
