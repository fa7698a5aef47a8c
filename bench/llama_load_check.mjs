// Loads a GGUF file with llama.cpp (the prebuilt CPU build that the npm package
// node-llama-cpp@3.21.1 ships) and generates greedy tokens: proof that a file is one
// llama.cpp accepts, and a reference to compare hearth's output with.
// usage: node bench/llama_load_check.mjs MODEL.gguf [N_TOKENS] [PROMPT]
// Prints one JSON line: {"ok":true,"arch":...,"prompt_tokens":[...],
// "tokens":[...],"text":"...","ms_load":...,"ms_gen":...}; exits 1 with the error otherwise.
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const [modelPath, nArg, promptArg] = process.argv.slice(2);
if (!modelPath) {
	console.error("usage: node bench/llama_load_check.mjs MODEL.gguf [N_TOKENS] [PROMPT]");
	process.exit(2);
}
const nTokens = Number(nArg ?? 16);
const prompt = promptArg ?? "The keeper wrote in the log";

try {
	// gpu:false and build:"never": use the shipped CPU binaries, never compile or download
	const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error });
	const t0 = performance.now();
	const model = await llama.loadModel({ modelPath });
	const context = await model.createContext({ contextSize: 256, threads: 2 });
	const t1 = performance.now();
	const sequence = context.getSequence();
	// tokenize() never adds BOS; llama.cpp's own tools (and hearth) do when the file asks
	const promptTokens = model.tokenize(prompt);
	if (model.tokens.shouldPrependBosToken && model.tokens.bos != null)
		promptTokens.unshift(model.tokens.bos);
	const tokens = [];
	for await (const token of sequence.evaluate(promptTokens, { temperature: 0 })) {
		tokens.push(token);
		if (tokens.length >= nTokens)
			break;
	}
	const t2 = performance.now();
	console.log(JSON.stringify({
		ok: true,
		arch: model.fileInfo.metadata.general.architecture,
		prompt_tokens: promptTokens,
		tokens,
		text: model.detokenize(tokens),
		ms_load: Math.round(t1 - t0),
		ms_gen: Math.round(t2 - t1),
	}));
	await context.dispose();
	await model.dispose();
	await llama.dispose();
} catch (e) {
	console.log(JSON.stringify({ ok: false, error: String(e?.message ?? e) }));
	process.exit(1);
}
