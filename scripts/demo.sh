#!/bin/sh
# The README's main-job command: installs dependencies, builds, starts hearthd on a model and
# streams a generation from it with the hearth client. MODEL=path/to/file.gguf picks the
# model; without it the committed demo model (models/, trained on the King James Bible) runs.
set -eu
cd "$(dirname "$0")/.."
sh scripts/deps.sh
sh scripts/build.sh
if [ -z "${MODEL:-}" ]; then
	MODEL=models/hearth-kjv-q8_0.gguf
	# the demo model knows only the KJV and was trained on 256 positions
	PROMPT=${PROMPT:-"And it came to pass, when the king"}
	MAX_CONTEXT=${MAX_CONTEXT:-256}
	# rounded by GPTQ against its own samples (hearthd.conf(5) imatrix = self): seconds for
	# this model, and its int4 copy nearly a third closer to the unquantized one (KL 0.0228
	# against 0.0328, doc/benchmarks.md)
	IMATRIX=${IMATRIX-self}
	cat >&2 <<'MSG'
hearth: MODEL is not set, so this run uses the demo model in models/: 2.9M parameters
hearth: trained on the King James Bible alone, so it writes Bible-like prose and nothing else.
hearth: For your own model run   MODEL=/path/to/model.gguf sh scripts/demo.sh
MSG
fi
PROMPT=${PROMPT:-"The quick brown fox"}
N=${N:-48}
dir=$(mktemp -d)
sock="$dir/hearth.sock"
./hearthd --model="$MODEL" --socket="$sock" --max-context=${MAX_CONTEXT:-2048} \
	--kv-budget=${KV_BUDGET:-256MiB} --log-level=notice ${IMATRIX:+-o imatrix="$IMATRIX"} &
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
