#!/bin/sh
# The README's main-job command: installs dependencies, builds, starts hearthd on a model and
# streams a generation from it with the hearth client. MODEL=path/to/file.gguf picks the
# model; without it a small synthetic model is made (its text is noise, and we say so).
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
dir=$(mktemp -d)
sock="$dir/hearth.sock"
./hearthd --model="$MODEL" --socket="$sock" --max-context=${MAX_CONTEXT:-2048} \
	--kv-budget=${KV_BUDGET:-256MiB} --log-level=notice &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT INT TERM
# The socket answers while the model loads; generate waits for it (hello -> loading -> welcome).
i=0
while [ ! -S "$sock" ]; do
	kill -0 $pid 2>/dev/null || { echo "hearth: hearthd exited before listening" >&2; exit 1; }
	i=$((i + 1)); [ $i -lt 600 ] || { echo "hearth: hearthd did not listen" >&2; exit 1; }
	sleep 0.1
done
./hearth --socket "$sock" -v generate -n "$N" "$PROMPT"
echo
./hearth --socket "$sock" stats
