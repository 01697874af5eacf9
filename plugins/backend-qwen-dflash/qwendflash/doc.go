// Package qwendflash implements the qwen-dflash backend: Qwen3 (qwen3) and
// Qwen3.5/3.6/3.8 (qwen35) GGUF models on the native engine, driven by
// sdk/engine's continuous-batching loop.
//
// A request is rendered with the GGUF's chat template, tokenized with the
// GGUF's tokenizer, given the model's defaults (max tokens, sampling preset
// of the family and thinking mode, reasoning budgets), and run by the
// engine. Generated text goes through the family's sdk/chat parser, which
// splits reasoning, visible text and tool calls; whether the template left
// a <think> block open decides where that parser starts.
//
// response_format json_object is constrained decoding in the engine
// (engine.FormatJSONObject): the answer is one JSON object and ends at its
// closing brace. A thinking model still thinks freely first (the prompt's
// open <think>, or the model's own <think> as its first token); the
// constraint starts where the answer does. Control and added tokens never
// appear inside the JSON, so json_object leaves no room for tool calls.
// json_schema is refused for now.
//
// DFlash speculative decoding (--draft FILE): the draft (native arch
// "dflash", read from upstream llama.cpp files and the older spellings)
// proposes a block per decoding sequence from the target's captured hidden
// states, and sdk/engine verifies it in the batched target forward
// (greedy output identical to target-only decoding, sampled output from the
// target's distribution). --spec-tree-budget verifies a tree of the draft's
// likeliest continuations (DDTree) instead of its chain; --spec-sampling draft
// (the default) draws a sampled request's proposals from the draft's
// distribution and keeps them by the speculative-sampling rule; match
// proposes the draft's best candidates, kept while the target samples them.
package qwendflash
