// Turns one bench/run.sh result directory (hearthd-tool bench JSON, llama_bench.mjs JSON lines)
// into the comparison table and the ratios the kernels issue asks for.
// usage: node bench/bench_report.mjs RESULT_DIR
import { existsSync, readFileSync } from "node:fs";
import { basename, join } from "node:path";

const dir = process.argv[2];
if (!dir) {
	console.error("usage: node bench/bench_report.mjs RESULT_DIR");
	process.exit(2);
}
const read = (f) => existsSync(join(dir, f)) ? readFileSync(join(dir, f), "utf8").trim() : null;
const ours = ["hearth_bf16.json", "hearth_bf16_g32.json", "hearth_bf16_g32_q8.json", "hearth_q4_0.json",
	"hearth_gemma3_q4_0.json"].map(read).filter(Boolean).map(JSON.parse);
const llama = (read("llama.json") ?? "").split("\n").filter(Boolean).map(JSON.parse);
if (!ours.length || !llama.length) {
	console.error(`bench_report: ${dir} lacks hearth_bf16.json or llama.json`);
	process.exit(1);
}
const probe = ours.find((o) => o.probe_gbs)?.probe_gbs;
// The model a file is of (qwen3-1.7b-q4_0.gguf -> qwen3-1.7b), and the KV bytes tg tokens after
// pp positions read by hearth's figures for that model (sliding layers: the last window only).
const family = (m) => basename(m).replace(/-[A-Za-z0-9_]+\.gguf$/, "");
const kvRead = (o, pp, tg) => {
	let s = 0;
	for (let i = 0; i < tg; i++)
		s += (pp + i + 1) * o.kv_bytes_per_pos + Math.min(pp + i + 1, o.window ?? 0) * (o.kv_sliding_bytes_per_pos ?? 0);
	return s;
};

const f1 = (s) => `${s.median.toFixed(1)} (${s.min.toFixed(1)}-${s.max.toFixed(1)})`;
const f2 = (s) => `${s.median.toFixed(2)} (${s.min.toFixed(2)}-${s.max.toFixed(2)})`;
const pct = (g) => probe ? `${(100 * g / probe.median).toFixed(0)}%` : "-";
const rows = [];
for (const o of ours) {
	for (const r of o.runs) {
		rows.push({
			name: `hearth ${r.act === "a8" ? "W4A8" : "W4A16"}`, file: `${basename(o.model)} ${o.layout}`,
			layout: o.layout, bpw: o.bpw, pp: r.pp_tps, tg: r.tg_tps, gbs: r.tg_gbs.median,
			paired: r.tg_pct_paired,
		});
	}
}
// llama.cpp's decode reads (about) the whole model per token; tied head = token_embd.
for (const l of llama.filter((r) => !r.error)) {
	const kv = kvRead(ours.find((o) => family(o.model) === family(l.model)) ?? ours[0], l.pp, l.tg);
	const gbs = (l.tg * l.size_bytes + kv) / (l.tg / l.tg_tps.median) * 1e-9;
	rows.push({ name: l.engine ?? "llama.cpp", file: basename(l.model), layout: "-", bpw: l.bpw, pp: l.pp_tps,
		tg: l.tg_tps, gbs });
}

const date = read("date") ?? "?";
console.log(`\nhearth vs ${[...new Set(llama.map((l) => l.engine ?? "llama.cpp"))].join(", ")}, ${ours[0].threads} threads, ${ours[0].reps} reps, ${date}; ` +
	`load average before ${read("load_before") ?? "?"}, after ${read("load_after") ?? "?"}`);
if (probe)
	console.log(`stream probe (${ours[0].probe_mib} MiB on the pool threads): median ` +
		`${probe.median.toFixed(1)} GB/s (min ${probe.min.toFixed(1)}, max ${probe.max.toFixed(1)})`);
const pad = (s, n) => String(s).padEnd(n);
console.log(`\n${pad("engine", 14)}${pad("file", 44)}${pad("bpw", 6)}${pad(`pp${ours[0].pp} tok/s`, 24)}` +
	`${pad(`tg${ours[0].tg} tok/s`, 22)}${pad("decode GB/s", 12)}${pad("% probe", 9)}% paired`);
// % paired: each repetition's decode against probe slices read between its tokens (hearth only).
const paired = (s) => s ? `${s.median.toFixed(0)}% (${s.min.toFixed(0)}-${s.max.toFixed(0)}%)` : "-";
for (const r of rows)
	console.log(`${pad(r.name, 14)}${pad(r.file, 44)}${pad(r.bpw.toFixed(2), 6)}${pad(f1(r.pp), 24)}` +
		`${pad(f2(r.tg), 22)}${pad(r.gbs.toFixed(1), 12)}${pad(pct(r.gbs), 9)}${paired(r.paired)}`);

const ratio = (a, b) => (a / b).toFixed(2);
console.log("\nratios (medians; hearth on the BF16 file unless named):");
const main = ours[0];
const run = (o, act) => o.runs.find((r) => r.act === act);
const line = (what, a, b, target) => {
	if (!a || !b)
		return;
	const v = a / b;
	const verdict = target ? (v >= target ? `  meets >= ${target}` : `  short of ${target}`) : "";
	console.log(`  ${pad(what, 56)} ${ratio(a, b)}x${verdict}`);
};
// Goals: against the strongest anchor measured (ik_llama.cpp when present), decode >= 1.3x and
// prefill >= 2x on the same Q4_0 file; against the others the figures are for reference.
const engines = [...new Set(llama.filter((r) => !r.error).map((r) => r.engine ?? "llama.cpp"))];
const strongest = engines.includes("ik_llama.cpp") ? "ik_llama.cpp" : null;
for (const eng of engines) {
	const goal = (g) => eng === strongest ? g : null;
	for (const o of ours) {
		// each hearth file against the anchors' files of the same model
		const of = (re) => llama.find((r) => (r.engine ?? "llama.cpp") === eng && re.test(r.model) && !r.error &&
			family(r.model) === family(o.model));
		const q40 = of(/q4_0/i), q4km = of(/q4_k_m/i);
		const tag = o === main ? "" : ` [${basename(o.model)} ${o.layout}]`;
		if (q40) {
			line(`decode W4A16${tag} / ${eng} Q4_0`, run(o, "a16")?.tg_tps.median, q40.tg_tps.median, goal(1.3));
			line(`decode W4A8${tag} / ${eng} Q4_0`, run(o, "a8")?.tg_tps.median, q40.tg_tps.median, goal(1.3));
			line(`prefill W4A8${tag} / ${eng} Q4_0`, run(o, "a8")?.pp_tps.median, q40.pp_tps.median, goal(2));
			line(`prefill W4A16${tag} / ${eng} Q4_0`, run(o, "a16")?.pp_tps.median, q40.pp_tps.median);
		}
		if (q4km) {
			line(`decode W4A8${tag} / ${eng} Q4_K_M`, run(o, "a8")?.tg_tps.median, q4km.tg_tps.median);
			line(`prefill W4A8${tag} / ${eng} Q4_K_M`, run(o, "a8")?.pp_tps.median, q4km.pp_tps.median);
		}
	}
}
if (probe) {
	for (const r of main.runs)
		console.log(`  ${pad(`decode ${r.act === "a8" ? "W4A8" : "W4A16"} bandwidth / stream probe`, 56)} ` +
			`${(100 * r.tg_gbs.median / probe.median).toFixed(0)}%${r.tg_gbs.median / probe.median >= 0.9 ? "  meets >= 90%" : "  short of 90%"}`);
	for (const r of main.runs.filter((r) => r.tg_pct_paired))
		console.log(`  ${pad(`decode ${r.act === "a8" ? "W4A8" : "W4A16"} bandwidth / probe between its tokens (paired)`, 56)} ` +
			`${r.tg_pct_paired.median.toFixed(0)}%${r.tg_pct_paired.median >= 90 ? "  meets >= 90%" : "  short of 90%"}`);
}
