// Second oracle: upstream llama.cpp's next-token distribution.
//
// Reads {"model": PATH, "prompts": [TEXT, ...] or "seqs": [[id, ...], ...], "top": N, "batch": B} on stdin and
// writes, for each prompt or id sequence, the token ids llama.cpp evaluated (a prompt's tokens, special tokens parsed)
// and the N most likely next tokens with their natural-log probabilities: [{"ids": [...], "top": [[id, logprob],
// ...]}, ...]. Probabilities are the softmax of the raw logits (temperature 0, no sampler changes them); batch, when
// given, is the context's batch size.
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
const seqs = input.seqs || (input.prompts || []).map((text) => [...model.tokenize(text, true)]);
const out = [];
for (const ids of seqs) {
    const context = await model.createContext({contextSize: Math.max(64, ids.length + 8), batchSize: input.batch});
    const seq = context.getSequence();
    // yieldEogToken: an end-of-generation token may be the most likely next one; its probabilities still count
    const it = seq.evaluateWithMetadata(ids, {probabilities: true}, {temperature: 0, yieldEogToken: true});
    const {value} = await it.next();
    await it.return();
    const top = [...value.probabilities.entries()].slice(0, input.top).map(([id, p]) => [id, Math.log(p)]);
    out.push({ids, top});
    await context.dispose();
}
await model.dispose();
await llama.dispose();
process.stdout.write(JSON.stringify(out) + "\n");
