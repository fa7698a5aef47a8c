#!/bin/sh
# The documentation is documentation, not a lab notebook: no session or date narrative and no
# paths of the machine it was written on, in doc/*.md, the man pages, README.md and
# CHANGELOG.md (whose release dates are the one place a date belongs). History is in git log.
# Also: the in-process tools are hearthd-tool's, so no page may send a reader to
# `hearthd --bench` or `hearthd --prompt`. TAP.
set -u
: "${HEARTH_SRCDIR:?HEARTH_SRCDIR is not set (make check sets it)}"
cd "$HEARTH_SRCDIR" || exit 1

# Man pages carry their date in .TH, as man pages do; the other checks cover them too.
md="doc/*.md README.md"
docs="$md doc/*.[0-9]"
n=0
fails=0
check() { # check DESCRIPTION ERE FILES...: no line of FILES matches ERE
	desc=$1 pat=$2
	shift 2
	n=$((n + 1))
	# shellcheck disable=SC2086
	hits=$(grep -nE -- "$pat" "$@" 2>/dev/null)
	if [ -z "$hits" ]; then
		echo "ok $n - $desc"
	else
		fails=$((fails + 1))
		echo "not ok $n - $desc"
		echo "$hits" | head -20 | sed 's/^/#   /'
	fi
}

# shellcheck disable=SC2086
check "no session narrative" '[Ss]ession[ -]?[0-9]|[Ss]ession [A-Z]|this session|last session' $docs CHANGELOG.md
# shellcheck disable=SC2086
check "no wall-clock times or time zones" '\bUTC\b|\b[0-2][0-9]:[0-5][0-9]( UTC|-[0-2][0-9]:[0-5][0-9])' $docs CHANGELOG.md
# shellcheck disable=SC2086
check "no dates outside the changelog and the man pages' headers" '\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b' $md
# shellcheck disable=SC2086
check "no machine paths" '/work/|/home/|/root/|/tmp/(b-|sb-|q17|hearth-bench)|\$TMPDIR/hearth-bench-speed/results-' $docs CHANGELOG.md
# shellcheck disable=SC2086
check "no run narrative" "other agents|agents' jobs|helper's jobs|jobs (were )?stopped|[Bb]efore this (work|change|session)|for the record|\bI (did|found|suspected)\b" $docs CHANGELOG.md
# shellcheck disable=SC2086
check "the in-process tools are hearthd-tool's" '(^|[^-a-z])hearthd [^#|]*(--|\\-\\-)(bench|prompt)([^-a-z]|$)' $docs
n=$((n + 1))
if [ -f CHANGELOG.md ] && grep -q '^## \[Unreleased\]' CHANGELOG.md; then
	echo "ok $n - CHANGELOG.md has an [Unreleased] section"
else
	fails=$((fails + 1))
	echo "not ok $n - CHANGELOG.md has an [Unreleased] section"
fi
echo "1..$n"
[ "$fails" = 0 ]
