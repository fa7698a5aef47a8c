#!/bin/sh
# The README's main-job command: installs dependencies, builds, and streams a generation from
# hearthd. MODEL=path/to/file.gguf picks the model; without it a small synthetic model is made.
set -eu
cd "$(dirname "$0")/.."
sh scripts/deps.sh
sh scripts/build.sh
PROMPT=${PROMPT:-"The quick brown fox"}
N=${N:-48}
if [ -z "${MODEL:-}" ]; then
	MODEL=demo-model.gguf
	cat >&2 <<'MSG'
hearth: MODEL is not set, so this run uses a small synthetic model made by tests/mkmodel.
hearth: its weights are RANDOM: the text below is noise, not a bug. For real text run
hearth:   MODEL=/path/to/model.gguf sh scripts/demo.sh   (llama, qwen2 or qwen3 GGUF files)
MSG
	[ -f "$MODEL" ] || ./tests/mkmodel --preset tiny --arch qwen3 --type f16 --seed 1 -o "$MODEL"
fi
exec ./hearthd --model "$MODEL" --prompt "$PROMPT" -n "$N"
