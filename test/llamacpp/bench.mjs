// Upstream llama.cpp's CPU speed on a GGUF file, shaped like native/engine BenchmarkGGUF so the two compare:
// pp: one sequence evaluates a prompt of N random tokens (one batch), timed; tg: a fresh sequence evaluates a
// CONTEXT-token prompt (16 unless given; DFLASH_BENCH_CONTEXT on our side), then generates M tokens greedily, one
// forward each, timed.
//
//   node bench.mjs MODEL.gguf THREADS [PROMPT=512] [GEN=128] [REPEAT=1] [CONTEXT=16]
// prints one JSON line per repeat: {"pp_tok_s": ..., "tg_tok_s": ...}
import {getLlama} from "node-llama-cpp";

const [model_path, threads_arg, prompt_arg, gen_arg, repeat_arg, context_arg] = process.argv.slice(2);
const threads = Number(threads_arg), n_prompt = Number(prompt_arg ?? 512), n_gen = Number(gen_arg ?? 128);
const repeat = Number(repeat_arg ?? 1), n_ctx = Number(context_arg ?? 16);

// The prebuilt CPU binary only: never a GPU, never a local build.
const llama = await getLlama({gpu: false, build: "never", logLevel: "error", maxThreads: threads});
const model = await llama.loadModel({modelPath: model_path});
const context = await model.createContext({
    contextSize: Math.max(n_prompt, n_ctx) + n_gen + 64, batchSize: n_prompt, threads: {ideal: threads, min: threads},
});
const seq = context.getSequence();

// Deterministic pseudo-random token ids (the model is random too; the text does not matter for speed).
let state = 7;
function random_tokens(n) {
    const out = [];
    for (let i = 0; i < n; i++) {
        state = (state * 1103515245 + 12345) % 2147483648;
        out.push(1000 + (state % 100000));
    }
    return out;
}

for (let r = 0; r < repeat; r++) {
    await seq.clearHistory();
    const prompt = random_tokens(n_prompt);
    let t0 = process.hrtime.bigint();
    await seq.evaluateWithoutGeneratingNewTokens(prompt);
    const pp = n_prompt / (Number(process.hrtime.bigint() - t0) / 1e9);

    await seq.clearHistory();
    await seq.evaluateWithoutGeneratingNewTokens(random_tokens(n_ctx));
    let generated = 0;
    t0 = process.hrtime.bigint();
    for await (const token of seq.evaluate(random_tokens(1), {temperature: 0})) {
        if (++generated >= n_gen) break;
    }
    const tg = n_gen / (Number(process.hrtime.bigint() - t0) / 1e9);
    process.stdout.write(JSON.stringify({pp_tok_s: pp, tg_tok_s: tg}) + "\n");
}
await context.dispose();
await model.dispose();
await llama.dispose();
