// llama.cpp's side of `make bench`: pp and tg tokens/s on GGUF files with the CPU build that
// node-llama-cpp@3.21.1 ships, measured the way hearthd-tool bench measures hearth (a random
// prompt of PP tokens in one batch with the last token's logits, then TG greedy decode steps,
// median of REPS fresh sequences after one warm-up).
// usage: node bench/llama_bench.mjs [--threads 2] [--reps 3] [--pp 512] [--tg 128]
//                                   [--fa auto|on|off] [--json] MODEL.gguf...
// --json prints one JSON object per model on its own line; otherwise a table.
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import { parseArgs as parseArgsShared } from "./bench_args.mjs";

function parseArgs(argv) {
	const o = parseArgsShared(argv, { threads: 2, reps: 3, pp: 512, tg: 128, fa: "auto", json: false },
		{ ints: ["threads", "reps", "pp", "tg"], strings: ["fa"], flags: ["json"] });
	o.models = o.args;
	if (!o.models.length)
		throw new Error("usage: node bench/llama_bench.mjs [--threads N] [--reps N] [--pp N] " +
			"[--tg N] [--fa auto|on|off] [--json] MODEL.gguf...");
	if (!["auto", "on", "off"].includes(o.fa))
		throw new Error(`--fa ${o.fa} is not auto, on or off`);
	return o;
}

function stat(v) {
	const s = [...v].sort((a, b) => a - b);
	const n = s.length;
	const med = n % 2 ? s[(n - 1) / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
	return { median: med, min: s[0], max: s[n - 1] };
}

// xorshift: prompts differ between repetitions, so no run reuses another's cached state
function randomTokens(n, nVocab, seed) {
	let x = BigInt(seed) * 0x9E3779B97F4A7C15n + 1n;
	const mask = (1n << 64n) - 1n;
	const out = [];
	for (let i = 0; i < n; i++) {
		x ^= x >> 12n; x ^= (x << 25n) & mask; x ^= x >> 27n;
		out.push(Number(((x * 0x2545F4914F6CDD1Dn) & mask) % BigInt(nVocab)));
	}
	return out;
}

// One fresh sequence: pp tokens in one batch (the first yield is the token sampled from the
// last prompt position's logits), then tg decode steps (each yield one more step).
async function once(context, pp, tg, nVocab, seed) {
	const seq = context.getSequence();
	try {
		const prompt = randomTokens(pp, nVocab, seed);
		const gen = seq.evaluate(prompt, { temperature: 0 });
		const t0 = performance.now();
		let r = await gen.next();
		const t1 = performance.now();
		for (let i = 0; i < tg && !r.done; i++)
			r = await gen.next();
		const t2 = performance.now();
		await gen.return();
		return { pp_s: (t1 - t0) / 1e3, tg_s: (t2 - t1) / 1e3 };
	} finally {
		seq.dispose();
	}
}

function paramCount(model) {
	const info = model.fileInfo.fullTensorInfo ?? model.fileInfo.tensorInfo ?? [];
	let n = 0;
	for (const t of info)
		n += t.dimensions.reduce((a, d) => a * Number(d), 1);
	return n;
}

async function benchModel(llama, path, o) {
	const t0 = performance.now();
	const model = await llama.loadModel({ modelPath: path });
	const ctxSize = Math.ceil((o.pp + o.tg + 16) / 256) * 256;
	const context = await model.createContext({
		contextSize: ctxSize, batchSize: o.pp, threads: { ideal: o.threads, min: o.threads },
		flashAttention: o.fa === "auto" ? "auto" : o.fa === "on", sequences: 1,
	});
	const loadS = (performance.now() - t0) / 1e3;
	const nVocab = model.fileInfo.metadata?.tokenizer?.ggml?.tokens?.length;
	if (!nVocab)
		throw new Error(`${path}: cannot tell the vocabulary size`);
	await once(context, 64, 8, nVocab, 999);   // warm-up: page faults, thread start, frequency
	const pp = [], tg = [];
	for (let r = 0; r < o.reps; r++) {
		const m = await once(context, o.pp, o.tg, nVocab, r + 1);
		pp.push(o.pp / m.pp_s);
		tg.push(o.tg / m.tg_s);
	}
	const nParams = paramCount(model);
	const res = {
		engine: "llama.cpp", model: path, threads: o.threads, fa: o.fa,
		flash_attention: context.flashAttention ?? null,
		size_bytes: model.size, n_params: nParams,
		bpw: nParams ? 8 * model.size / nParams : null,
		load_s: loadS, reps: o.reps, pp: o.pp, tg: o.tg,
		pp_tps: stat(pp), tg_tps: stat(tg),
	};
	await context.dispose();
	await model.dispose();
	return res;
}

const o = parseArgs(process.argv.slice(2));
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error,
	maxThreads: o.threads });
let failed = false;
if (!o.json)
	console.log(`llama.cpp (node-llama-cpp ${llama.llamaCppRelease?.release ?? "?"} CPU build), ` +
		`${o.threads} threads, ${o.reps} reps, fa ${o.fa}\n` +
		"model                                      bpw   pp tok/s median (min-max)   " +
		"tg tok/s median (min-max)");
for (const path of o.models) {
	try {
		const r = await benchModel(llama, path, o);
		if (o.json) {
			console.log(JSON.stringify(r));
		} else {
			const f = (s, d) => `${s.median.toFixed(d)} (${s.min.toFixed(d)}-${s.max.toFixed(d)})`;
			console.log(`${path.padEnd(42)} ${(r.bpw ?? 0).toFixed(2).padStart(5)}   ` +
				`pp${o.pp} ${f(r.pp_tps, 1).padEnd(22)}  tg${o.tg} ${f(r.tg_tps, 2)}`);
		}
	} catch (e) {
		failed = true;
		const msg = String(e?.message ?? e);
		if (o.json)
			console.log(JSON.stringify({ engine: "llama.cpp", model: path, error: msg }));
		else
			console.error(`llama_bench: ${path}: ${msg}`);
	}
}
await llama.dispose();
process.exit(failed ? 1 : 0);
