// Loads a model GGUF with upstream llama.cpp (the prebuilt CPU build of
// node-llama-cpp), creates a context and evaluates one token, reporting
// how far it gets. Nothing is compared.
//
// Reads {"model": PATH} on stdin and writes {"loaded": bool, "error": TEXT,
// "vocab": N, "embd": N, "context": bool, "contextError": TEXT,
// "evaluated": bool, "evalError": TEXT, "top": [id, prob], "log": [TEXT, ...]}
// (log: the library's warnings and errors).
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
        if (!out.log.includes(m)) out.log.push(m);
    },
});
try {
    const model = await llama.loadModel({modelPath: input.model});
    out.loaded = true;
    process.stderr.write("stage: loaded\n");
    out.embd = model.embeddingVectorSize;
    out.vocab = model.fileInfo.metadata?.tokenizer?.ggml?.tokens?.length;
    let context;
    try {
        context = await model.createContext({contextSize: 64});
        out.context = true;
        process.stderr.write("stage: context\n");
    } catch (err) {
        out.context = false;
        out.contextError = String(err?.message ?? err);
    }
    if (context) {
        try {
            const seq = context.getSequence();
            const it = seq.evaluateWithMetadata([1], {probabilities: true}, {temperature: 0});
            const {value} = await it.next();
            await it.return();
            const best = [...value.probabilities.entries()][0];
            out.evaluated = true;
            out.top = best;
        } catch (err) {
            out.evaluated = false;
            out.evalError = String(err?.message ?? err);
        }
        await context.dispose();
    }
    await model.dispose();
} catch (err) {
    out.error = String(err?.message ?? err);
}
await llama.dispose();
process.stdout.write(JSON.stringify(out) + "\n");
