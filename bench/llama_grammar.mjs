// llama.cpp's side of `make bench-grammar`: greedy decode tokens/s with and without a JSON
// Schema grammar (node-llama-cpp@3.21.1's CPU build: llama.cpp's own grammar sampler over the
// whole vocabulary), in alternating rounds like bench/grammar_drive.py does for hearth.
// usage: node bench/llama_grammar.mjs [--threads 2] [--rounds 5] [--tokens 128] MODEL.gguf SCHEMA.json
// Prints one JSON object: per kind the decode tokens/s (tokens after the first over the time
// after the first, as hearthd's done.decode_tps), and per round the schema / plain ratio.
import { readFileSync } from "node:fs";
import { getLlama, LlamaLogLevel, LlamaGrammarEvaluationState } from "node-llama-cpp";
import { parseArgs as parseArgsShared } from "./bench_args.mjs";

function parseArgs(argv) {
	const o = parseArgsShared(argv, { threads: 2, rounds: 5, tokens: 128 },
		{ ints: ["threads", "rounds", "tokens"] });
	o.files = o.args;
	if (o.files.length !== 2)
		throw new Error("usage: node bench/llama_grammar.mjs [--threads N] [--rounds N] [--tokens N] MODEL.gguf SCHEMA.json");
	return o;
}

const PROMPT = "Output:";

// One fresh sequence: the prompt, then up to `tokens` greedy tokens (an end-of-generation
// token, which the grammar allows only once the object is complete, ends it early).
async function once(model, context, tokens, grammar) {
	const seq = context.getSequence();
	try {
		const state = grammar ? new LlamaGrammarEvaluationState({ model, grammar }) : undefined;
		const gen = seq.evaluate(model.tokenize(PROMPT), { temperature: 0, grammarEvaluationState: state });
		const t0 = performance.now();
		let r = await gen.next();
		const t1 = performance.now();
		let n = 1;
		const eog = (t) => model.isEogToken ? model.isEogToken(t) : t === model.tokens.eos;
		while (!r.done && n < tokens && !eog(r.value)) {
			r = await gen.next();
			n++;
		}
		const t2 = performance.now();
		await gen.return();
		return { decode_tps: n > 1 ? (n - 1) / ((t2 - t1) / 1e3) : 0, n_gen: n, ms: t2 - t0 };
	} finally {
		seq.dispose();
	}
}

const o = parseArgs(process.argv.slice(2));
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, maxThreads: o.threads });
const model = await llama.loadModel({ modelPath: o.files[0] });
const context = await model.createContext({
	contextSize: Math.ceil((o.tokens + 64) / 256) * 256, batchSize: 64,
	threads: { ideal: o.threads, min: o.threads }, sequences: 1,
});
const schema = JSON.parse(readFileSync(o.files[1], "utf8"));
const tc = performance.now();
const grammar = await llama.createGrammarForJsonSchema(schema);
const compileMs = performance.now() - tc;
await once(model, context, 8, null);
await once(model, context, 8, grammar);
const runs = { plain: [], schema: [] };
for (let r = 0; r < o.rounds; r++) {
	const order = r % 2 === 0 ? ["plain", "schema"] : ["schema", "plain"];
	for (const k of order)
		runs[k].push(await once(model, context, o.tokens, k === "schema" ? grammar : null));
	console.error(`llama_grammar: round ${r + 1}/${o.rounds}: plain ${runs.plain.at(-1).decode_tps.toFixed(2)}, ` +
		`schema ${runs.schema.at(-1).decode_tps.toFixed(2)} tok/s`);
}
console.log(JSON.stringify({
	engine: "llama.cpp", release: llama.llamaCppRelease?.release ?? null, rounds: o.rounds, tokens: o.tokens,
	grammar_compile_ms: compileMs, runs,
	ratio_schema: runs.schema.map((s, i) => s.decode_tps / runs.plain[i].decode_tps),
}));
await context.dispose();
await model.dispose();
await llama.dispose();
