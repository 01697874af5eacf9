// Loads a DFlash draft GGUF with upstream llama.cpp (the prebuilt CPU build
// of node-llama-cpp) and reports how far it gets.
//
// Reads {"model": PATH} on stdin and writes {"loaded": bool, "error": TEXT,
// "vocab": N, "embd": N, "context": bool, "contextError": TEXT, "log": [TEXT, ...]} (log: the
// library's warnings and errors). Loading checks every key and tensor of the
// dflash architecture; a context is also tried, though llama.cpp refuses one
// for a draft alone: it borrows the target's embedding and head through the
// target's context (llama_context_params.ctx_other), which node-llama-cpp
// does not pass.
import {getLlama} from "node-llama-cpp";

const input = JSON.parse(await new Promise((resolve, reject) => {
    let s = "";
    process.stdin.setEncoding("utf8");
    process.stdin.on("data", (d) => { s += d; });
    process.stdin.on("end", () => resolve(s));
    process.stdin.on("error", reject);
}));

const out = {loaded: false, log: []};
const llama = await getLlama({
    gpu: false, build: "never", logLevel: "warn",
    logger: (level, message) => {
        const m = String(message).trim();
        if (!out.log.includes(m)) out.log.push(m); // memory fitting retries repeat themselves
    },
});
try {
    const model = await llama.loadModel({modelPath: input.model});
    out.loaded = true;
    out.embd = model.embeddingVectorSize;
    out.vocab = model.fileInfo.metadata?.tokenizer?.ggml?.tokens?.length;
    try {
        const context = await model.createContext({contextSize: 64});
        out.context = true;
        await context.dispose();
    } catch (err) {
        out.context = false;
        out.contextError = String(err?.message ?? err);
    }
    await model.dispose();
} catch (err) {
    out.error = String(err?.message ?? err);
}
await llama.dispose();
process.stdout.write(JSON.stringify(out) + "\n");
