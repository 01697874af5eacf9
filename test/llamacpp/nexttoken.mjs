// Second oracle: upstream llama.cpp's next-token distribution.
//
// Reads {"model": PATH, "prompts": [TEXT, ...], "top": N} on stdin and
// writes, for each prompt, the token ids llama.cpp makes of it (special
// tokens parsed) and the N most likely next tokens with their natural-log
// probabilities: [{"ids": [...], "top": [[id, logprob], ...]}, ...].
// Probabilities are the softmax of the raw logits (no sampler changes them).
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
for (const text of input.prompts) {
    const ids = [...model.tokenize(text, true)];
    const context = await model.createContext({contextSize: Math.max(64, ids.length + 8)});
    const seq = context.getSequence();
    const it = seq.evaluateWithMetadata(ids, {probabilities: true}, {temperature: 0});
    const {value} = await it.next();
    await it.return();
    const top = [...value.probabilities.entries()].slice(0, input.top).map(([id, p]) => [id, Math.log(p)]);
    out.push({ids, top});
    await context.dispose();
}
await model.dispose();
await llama.dispose();
process.stdout.write(JSON.stringify(out) + "\n");
