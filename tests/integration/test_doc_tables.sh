#!/bin/sh
# bench/doc_tables.py, the writer `make bench` runs after each benchmark: fed each bench's own
# result format (fixtures in doc_tables/), it must replace exactly the marked sections of a
# document, leave every other byte alone, refuse a document without the markers, and the real
# docs must carry every marker a bench target writes. TAP.
set -u
: "${HEARTH_SRCDIR:?HEARTH_SRCDIR is not set (make check sets it)}"
py=/usr/bin/python3
writer=$HEARTH_SRCDIR/bench/doc_tables.py
fx=$HEARTH_SRCDIR/tests/integration/doc_tables
tmp=$(mktemp -d "${TMPDIR:-/tmp}/test_doc_tables.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

n=0
fails=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
notok() { n=$((n + 1)); fails=$((fails + 1)); echo "not ok $n - $1"; }

# A document with text before, between and after the sections, stale rows inside them.
mkdoc() { # mkdoc FILE SECTION...
	f=$1
	shift
	printf '# Title\n\nProse before, with a | pipe and <!-- a comment -->.\n\n' >"$f"
	for s in "$@"; do
		printf '## %s\n\n<!-- bench:%s begin -->\n| stale | table |\n|---|---|\n| 1 | 2 |\n<!-- bench:%s end -->\n\nProse after %s.\n\n' \
			"$s" "$s" "$s" "$s" >>"$f"
	done
	printf 'The end, no newline after it.' >>"$f"
}

# Everything outside the sections, markers included: must be the same before and after.
outside() { # outside FILE
	awk '/<!-- bench:.* begin -->/ { print; skip = 1; next }
	     /<!-- bench:.* end -->/ { skip = 0 }
	     !skip { print }' "$1"
}

check_kind() { # check_kind KIND RESULT "SECTIONS" EXPECTED-LINE...
	kind=$1 result=$2 sections=$3
	shift 3
	doc=$tmp/$kind.md
	# shellcheck disable=SC2086
	mkdoc "$doc" $sections
	outside "$doc" >"$tmp/$kind.before"
	if "$py" "$writer" "$kind" "$doc" "$result" >"$tmp/$kind.out" 2>"$tmp/$kind.err"; then
		ok "$kind: the writer accepts the bench's result"
	else
		notok "$kind: the writer accepts the bench's result"
		sed 's/^/#   /' "$tmp/$kind.err"
		return
	fi
	outside "$doc" >"$tmp/$kind.after"
	if cmp -s "$tmp/$kind.before" "$tmp/$kind.after"; then
		ok "$kind: text outside the marked sections is untouched"
	else
		notok "$kind: text outside the marked sections is untouched"
		diff "$tmp/$kind.before" "$tmp/$kind.after" | sed 's/^/#   /'
	fi
	if grep -q '| stale | table |' "$doc"; then
		notok "$kind: the stale rows are gone"
	else
		ok "$kind: the stale rows are gone"
	fi
	for want in "$@"; do
		if grep -qF -- "$want" "$doc"; then
			ok "$kind: section holds '$want'"
		else
			notok "$kind: section holds '$want'"
		fi
	done
	cp "$doc" "$tmp/$kind.once"
	"$py" "$writer" "$kind" "$doc" "$result" >/dev/null 2>&1
	if cmp -s "$doc" "$tmp/$kind.once"; then
		ok "$kind: a second run writes the same document"
	else
		notok "$kind: a second run writes the same document"
	fi
}

check_kind speed "$fx/speed" "speed" \
	'| hearth W4A8 | bf16 / q4_g128 | 4.25 | 196.5 (195.3-203.6) | 27.45 (26.62-27.50) | 26.9 | 79 % | 96 % (85-107 %) |' \
	'| hearth W4A16 | bf16 / q4_g32 | 4.50 | 102.6 | 25.83 | 26.7 | 78 % | 81 % (81-119 %) |' \
	'| llama.cpp | Q4_0 | 4.87 | 88.9 (86.1-90.7) | 17.95 (17.38-18.24) | 20.0 | 59 % | - |' \
	'| ik_llama.cpp | Q4_0 | 4.87 | 125.0 (121.0-127.5) | 25.40 (25.10-25.90) | 28.3 | 83 % | - |' \
	'median 34.1 GB/s (min 33.2, max 34.7)' 'decode W4A8 1.53x' 'pp W4A8 2.21x' \
	'Ratios to ik_llama.cpp Q4_0 (hearth q4_0 / q4_g32+head_g128, medians): decode W4A8 1.21x' \
	'| hearth W4A8 | gemma-3-1b q4_0 / q4_g32 | 4.50 | 95.3 (94.3-96.3) | 9.87 (9.77-9.97) |' \
	'| ik_llama.cpp | gemma-3-1b Q4_0 | 4.50 | 60.2 (58.0-61.0) | 7.50 (7.20-7.90) | 4.3 | 13 % | - |' \
	'Ratios to ik_llama.cpp gemma-3-1b Q4_0 (hearth gemma-3-1b q4_0 / q4_g32, medians): decode W4A8 1.32x'
check_kind grammar "$fx/grammar" "grammar grammar-jump grammar-masks" \
	'| hearth | 24.24 (10.55-26.31) | 23.39 (11.43-25.59) | 0.968x (0.848-1.464x) |' \
	'| with jump-forward | 128 | 31 | 25.55 (8.13-30.94) |' \
	'| ten_properties.json | 14.3 | 7853 | 1 | 46 | 0.13 |'
check_kind serving "$fx/serving.json" "serving" \
	'| 8 | 212.9 | 26.7 / 26.6 | 35.2 | 291.8 | 1339 / 1340 | 37 / 137 / 216 |' \
	'aggregate(8) / aggregate(1) = 3.30x' 'same cpu p50 5.4 / p99 15.9 µs'
check_kind memory "$fx/memory.txt" "memory memory-ledger" \
	'| settled RSS <= packed + KV budget + 48 MiB | 1111.1 MiB <= 871.6 + 192.0 + 48 = 1111.6 MiB (margin +0.6 MiB) | met |' \
	'| weights.q4g128 | 714.0 MiB | 714.0 MiB |' '| norms | 484 KiB | 484 KiB |' \
	'**1111.1 MiB / 1111.1 MiB**'
check_kind fidelity "$fx/fidelity" "fidelity fidelity-ablation" \
	'| fx-quant-f16 (256) | llama.cpp Q4_0 (14 q4_0, 1 q6_k) | 6.31 | 0.391 | 0.091 | 0.164 | 0.184 |' \
	'| qwen3-0.6b-bf16 (128) | hearth W4A8 (q4_g32+head_q8) | 5.48 | - | 0.078 | - | - |' \
	'| qwen3-0.6b-bf16 (128) | hearth W4A16 (q4_g32) | 4.50 | 0.242 | 0.0926 | 0.128 | 0.134 |' \
	'| weights in the f32 engine | fx-qwen3 | fx-quant-f16 | qwen3-0.6b-bf16 |' \
	'| int4 embedding/head, exact layers | 0.033 (0.61) | 0.052 (0.57) | 0.024 (0.55) |' \
	'| activation rounding alone, W4A8 | 0.0006 (0.95) | 0.0007 (0.91) | 0.0005 (0.93) |'
check_kind train "$fx/train" "train" \
	'| hearth-kjv | 2.89M | 256 x 4, 4/2 heads, ff 512 | 560 | 1290 s | 3.628 | 37.6 | 0.218 |' \
	'- And the LORD said unto Moses, Behold,'
check_kind fidelity-trained-large "$fx/fidelity" "fidelity-trained-large" \
	'held-out positions.'
check_kind kernels "$fx/kernels.txt" "kernels" \
	'| plain streaming read | 18.1 GB/s | 26.7 GB/s |' \
	'| GEMM 512 tok W4A8 6144x2048 | 282.0 GOP/s | 563.0 GOP/s |'
check_kind openai "$fx/openai.jsonl" "openai" \
	'| libhearth (`hearth bench --clients 8`) | 150.0 (140.0-160.0) |' \
	'| hearth-openai, streaming /v1/chat/completions | 147.0 (144.0-147.0) |' \
	'| hearth-openai / libhearth | 0.98x (0.90-1.05) | ≥ 0.95x |' \
	'| hearth-openai / llama-server (mainline llama.cpp) | 2.10x (2.00-2.45) | ≥ 2x |' \
	'| hearth-openai / llama-server (ik_llama.cpp) | 2.94x (2.67-3.00) | ≥ 2x |' \
	'3 alternating rounds, 8 concurrent streams'
check_kind spec "$fx/spec" "spec" \
	'| Qwen3-1.7B shape, Q4_0 (random weights) | rewrite | 23.7 (23.0-24.2) | 77.1 (76.6-83.2) | 3.26x (3.17-3.62x) | 100 % of 150 | yes |' \
	'| Qwen3-1.7B shape, Q4_0 (random weights) | sampled | 21.0 (13.4-24.0) | 21.2 (12.1-23.7) | 0.99x (0.91-1.01x) | no draft | yes |' \
	'| quote | 13.6 (13.2-13.7) | 21.3 (19.7-23.3) | 1.62x (1.43-1.72x) | 43 % (43-43 %) |' \
	'3 alternating rounds of 64 tokens each' \
	'| demo model, itself as draft | quote | 5413 (5346-10496) | 6582 (6418-14984) | 4409 (2722-8551) | 5984 (4570-8932) | 0.81x (0.51-0.81x) | 100 % of 168 | 84 % of 147 | yes |' \
	'| Qwen3-1.7B shape Q4_0, tiny random draft | sampled | 7.2 (4.4-10.3) | 6.4 (6.4-6.7) | 6.3 (6.3-6.7) | 5.7 (5.3-6.3) | 0.93x (0.61-1.43x) | 0 % of 198 | no draft | yes |' \
	'| larger trained target, demo model as draft | json | 1637 (1484-2491) | 2187 (2177-2445) | 1254 (1241-1373) | 2603 (2542-2912) | 0.76x (0.55-0.85x) | 32 % of 234 | 79 % of 129 | yes |' \
	'| demo model, itself as draft | quote | hearth (`draft` model) | 5413 (5346-10496) | 4409 (2722-8551) | 0.81x (0.51-0.81x) | 100 % of 168 | yes | - |' \
	'| demo model, itself as draft | quote | ik_llama.cpp llama-server | 197 (191-1790) | 350 (235-351) | 1.19x (0.20-1.84x) | 100 % of 168 | **no** | 12.56x (7.78-36.44x) |' \
	'| larger trained target, demo model as draft | json | mainline llama.cpp llama-server | 324 (319-353) | 54 (19-66) | 0.17x (0.06-0.19x) | 11 % of 798 | yes | 25.53x (19.14-64.76x) |' \
	'mainline llama.cpp llama-server: `-md hearth-kjv-q8_0.gguf --spec-type draft-simple --spec-draft-n-max 8 --spec-draft-n-min 0 --spec-draft-p-min 0.0`, 2 threads, context 256, OMP_WAIT_POLICY=passive.'

# bench_kernels' small-batch lines (8 tokens from memory) are rows of their own.
cat >"$tmp/kernels8.txt" <<'EOF2'
kernels avx512, group 128 asym, budget 300 ms per number (shared machine: noisy)
2048x6144 (6.68 MB, 4.250 bpw, 26 copies)
  gemm W4A8  1 thr:  148.3 GOP/s wall,    4.9 GB/s of weights (8 tokens from memory, 1357.4 us)
  gemm W4A8  2 thr:  605.6 GOP/s wall,   20.2 GB/s of weights (8 tokens from memory, 331.1 us)
EOF2
check_kind kernels "$tmp/kernels8.txt" "kernels" \
	'| GEMM 8 tok from memory W4A8 2048x6144 | 148.3 GOP/s | 605.6 GOP/s |'

# The sections must keep their order relative to each other and the rows their run order.
if awk '/^\| fx-qwen3/ { q = NR } /^\| fx-quant/ && !f { f = NR } END { exit !(q && f && q < f) }' \
	"$tmp/fidelity.md"; then
	ok "fidelity: models in the order they were run"
else
	notok "fidelity: models in the order they were run"
fi

# A document without the section: an error naming the marker, and the document unchanged.
mkdoc "$tmp/none.md" other
cp "$tmp/none.md" "$tmp/none.orig"
if "$py" "$writer" serving "$tmp/none.md" "$fx/serving.json" >/dev/null 2>"$tmp/none.err"; then
	notok "a document without the marker is refused"
else
	ok "a document without the marker is refused"
fi
if grep -q 'bench:serving begin' "$tmp/none.err" && cmp -s "$tmp/none.md" "$tmp/none.orig"; then
	ok "the refusal names the marker and leaves the document as it was"
else
	notok "the refusal names the marker and leaves the document as it was"
fi
# Twice the same section is as ambiguous as none.
mkdoc "$tmp/twice.md" serving serving
if "$py" "$writer" serving "$tmp/twice.md" "$fx/serving.json" >/dev/null 2>&1; then
	notok "a document with the section twice is refused"
else
	ok "a document with the section twice is refused"
fi
# A result without what the writer needs is an error, not an empty table.
printf 'hearthd did not start\n' >"$tmp/empty.json"
mkdoc "$tmp/empty.md" serving
if "$py" "$writer" serving "$tmp/empty.md" "$tmp/empty.json" >/dev/null 2>&1; then
	notok "a result file with no result in it is refused"
else
	ok "a result file with no result in it is refused"
fi

# The real documents carry the sections their bench targets write (Makefile.am, bench section).
for pair in benchmarks.md:speed benchmarks.md:serving benchmarks.md:fidelity \
	benchmarks.md:fidelity-ablation benchmarks.md:grammar benchmarks.md:grammar-jump \
	benchmarks.md:grammar-masks memory.md:memory memory.md:memory-ledger kernels.md:kernels benchmarks.md:openai benchmarks.md:spec \
	benchmarks.md:fidelity-trained benchmarks.md:fidelity-trained-large benchmarks.md:train; do
	doc=$HEARTH_SRCDIR/doc/${pair%%:*} s=${pair#*:}
	if [ "$(grep -c "^<!-- bench:$s begin -->\$" "$doc")" = 1 ] &&
		[ "$(grep -c "^<!-- bench:$s end -->\$" "$doc")" = 1 ]; then
		ok "doc/${pair%%:*} has one bench:$s section"
	else
		notok "doc/${pair%%:*} has one bench:$s section"
	fi
done

echo "1..$n"
[ "$fails" = 0 ]
