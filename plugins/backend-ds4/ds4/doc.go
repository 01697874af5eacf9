// Package ds4 implements the ds4 backend: DeepSeek V4 (GGUF architecture
// deepseek4) models on the native engine, driven by sdk/engine's
// continuous-batching loop through plugins/nativebackend, as the Qwen
// backend is.
//
// A request is rendered with the GGUF's chat template (DeepSeek's encoding:
// <｜User｜>/<｜Assistant｜> turns, a generation prompt that opens <think>
// only when the request enables thinking), tokenized with the GGUF's
// tokenizer and run by the engine; generated text goes through sdk/chat's
// DeepSeek V4 parser, which splits reasoning, visible text and DSML tool
// calls. A tool_choice that forces a call is refused: a DSML call cannot be
// held to a JSON schema by the engine's constraint.
//
// The --ds4-* options reach the native model as metadata overrides before
// the weights load (nativebackend.Spec.Configure):
//
//   - --ds4-expert-top-k N sets deepseek4.expert_used_count (fewer routed
//     experts than trained is an approximation and logged as one; more is
//     refused);
//   - --ds4-prefill sparse|exact|dense sets deepseek4.engine.prefill
//     (sparse, the default, is the batched prefill of the model's own
//     attention; exact is token by token through the decode path);
//   - --ds4-fused-decode (CUDA only: graph-captured decode steps) sets
//     deepseek4.engine.fused_decode; a block on another device is refused
//     when its options are validated.
//
// The disk prefix cache (--disk-prefix-cache on) stores a prompt's native
// state (KV rows and the compressor state the engine exports for the
// sequence) up to its generation prompt, as for Qwen.
package ds4
