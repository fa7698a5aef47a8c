#!/bin/sh
# `hearthd-tool render-template` end to end: reference pairs from shared/chat render byte for
# byte through the tool (conversation files, --tools, --no-generation-prompt, --var, --now),
# a template's raise_exception and syntax errors go to stderr with exit 1 and the line, and
# bad options, files and JSON are refused. TAP.
set -u

: "${HEARTH_BUILDDIR:?HEARTH_BUILDDIR is not set (make check sets it)}"
: "${HEARTH_SHARED:?HEARTH_SHARED is not set (make check sets it)}"
TOOL="$HEARTH_BUILDDIR/hearthd-tool"
CHAT="$HEARTH_SHARED/chat"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/test_render_template.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT

n=0
fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"; }
expect() { if [ "$2" -eq 0 ]; then ok "$1"; else not_ok "$1"; fi; }

# the conversations as the tool's input files
/usr/bin/python3 - "$CHAT/conversations.json" "$TMP" <<'PY' || { echo "Bail out! cannot split conversations"; exit 1; }
import json, sys
for c in json.load(open(sys.argv[1])):
    json.dump(c["messages"], open(f"{sys.argv[2]}/{c['name']}.json", "w"))
    if "tools" in c:
        json.dump(c["tools"], open(f"{sys.argv[2]}/{c['name']}.tools.json", "w"))
PY

echo "1..10"
V="--var bos_token=\"<s>\" --var eos_token=\"</s>\" --now 2026-12-03T12:00:00"

# render TEMPLATE CONVERSATION [extra options]: the tool's output against the reference
render() {
	t=$1 c=$2
	shift 2
	# shellcheck disable=SC2086
	"$TOOL" render-template --template "$CHAT/templates/$t.jinja" --messages "$TMP/$c.json" $V "$@" \
		>"$TMP/out" 2>"$TMP/err" && cmp -s "$TMP/out" "$CHAT/expected/${t}__$c.txt"
}
render Qwen-Qwen3-0.6B tools_call --tools "$TMP/tools_call.tools.json"
expect "Qwen3 with a tool call renders as transformers does" $?
render meta-llama-Llama-3.1-8B-Instruct multi_turn
expect "Llama 3.1 multi-turn (strftime_now fixed by --now) renders as transformers does" $?
render openai-gpt-oss-120b no_generation_prompt --no-generation-prompt
expect "gpt-oss without a generation prompt renders as transformers does" $?
render google-gemma-4-31B-it unicode_and_braces
expect "Gemma 4 with unicode and braces in the message renders as transformers does" $?

"$TOOL" render-template --template "$CHAT/templates/google-gemma-2-2b-it.jinja" \
	--messages "$TMP/system_user.json" >"$TMP/out" 2>"$TMP/err"
rc=$?
[ $rc -eq 1 ] && [ ! -s "$TMP/out" ] &&
	grep -q "google-gemma-2-2b-it.jinja:1:[0-9]*: TemplateError: System role not supported" "$TMP/err"
expect "raise_exception goes to stderr with exit 1, naming the template line" $?

printf 'ok\n{%% if %%}\n' >"$TMP/bad.jinja"
"$TOOL" render-template --template "$TMP/bad.jinja" --messages "$TMP/user_only.json" >"$TMP/out" 2>"$TMP/err"
[ $? -eq 1 ] && grep -q "bad.jinja:2:7: TemplateSyntaxError" "$TMP/err"
expect "a syntax error names line and column" $?

printf '{{ greeting }} {{ n + 1 }}' >"$TMP/vars.jinja"
out=$("$TOOL" render-template --template "$TMP/vars.jinja" --messages "$TMP/user_only.json" \
	--var 'greeting="hi"' --var n=41)
[ "$out" = "hi 42" ]
expect "--var sets variables from JSON" $?

printf '[{"role": ' >"$TMP/broken.json"
"$TOOL" render-template --template "$TMP/vars.jinja" --messages "$TMP/broken.json" >/dev/null 2>"$TMP/err"
[ $? -eq 1 ] && grep -q "broken.json" "$TMP/err"
expect "malformed messages JSON is refused with the file named" $?

"$TOOL" render-template --messages "$TMP/user_only.json" >/dev/null 2>&1
[ $? -eq 2 ]
e1=$?
"$TOOL" render-template --template "$TMP/vars.jinja" --messages "$TMP/user_only.json" --var nokey >/dev/null 2>&1
[ $? -eq 2 ] && [ $e1 -eq 0 ]
expect "missing --template/--model and a --var without = are usage errors (exit 2)" $?

"$TOOL" render-template --model "$HEARTH_SHARED/vocab/ggml-vocab-phi-3.gguf" --template-name none \
	--messages "$TMP/user_only.json" >/dev/null 2>"$TMP/err"
[ $? -eq 1 ] && grep -q "no tokenizer.chat_template.none" "$TMP/err"
expect "a model without the named template is refused" $?

[ "$fails" -eq 0 ]
