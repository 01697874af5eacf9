// Second oracle on token ids: upstream llama.cpp's next-token distribution after each given id sequence.
//
// Reads {"model": PATH, "seqs": [[id, ...], ...], "top": N} on stdin and writes, for each sequence, the N most likely
// next tokens with their natural-log probabilities: [{"top": [[id, logprob], ...]}, ...]. Probabilities are the
// softmax of the raw logits (temperature 0, no sampler changes them).
import {getLlama} from "node-llama-cpp";

const input = JSON.parse(await new Promise((resolve, reject) => {
    let s = "";
    process.stdin.setEncoding("utf8");
    process.stdin.on("data", (d) => { s += d; });
    process.stdin.on("end", () => resolve(s));
    process.stdin.on("error", reject);
}));

// The prebuilt CPU binary only: never a GPU, never a local build.
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath: input.model});
const out = [];
for (const ids of input.seqs) {
    const context = await model.createContext({contextSize: Math.max(64, ids.length + 8), batchSize: input.batch || 512});
    const seq = context.getSequence();
    const it = seq.evaluateWithMetadata(ids, {probabilities: true}, {temperature: 0, yieldEogToken: true});
    const {value} = await it.next();
    await it.return();
    const top = [...value.probabilities.entries()].slice(0, input.top).map(([id, p]) => [id, Math.log(p)]);
    out.push({top});
    await context.dispose();
}
await model.dispose();
await llama.dispose();
process.stdout.write(JSON.stringify(out) + "\n");
