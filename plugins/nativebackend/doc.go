// Package nativebackend is the wiring every backend plugin on the native
// engine shares: opening the engine library for a device, mapping the GGUF,
// building its tokenizer and chat template, the capacity and engine-option
// defaults (in one place, defaults.go), the engine and cache options every
// such backend declares, loading the weights (after the backend's
// Spec.Configure has edited the native model spec, e.g. metadata overrides
// from its own options) and starting sdk/engine's continuous-batching loop
// over them, the adapters from the native model and the chat parsers to
// sdk/engine, the checks of a request's settings, ChatModel, which turns a
// chat request into engine work (template, tokens, defaults, parser), and
// Runner, which answers the sdk.Backend calls that are the same for every
// native backend (Start, Tokenize, Detokenize, CountTokens, Stats,
// Shutdown) and loads a chat model (LoadChat).
//
// A backend (qwen-dflash, ds4) keeps only what is specific to its models:
// Info, ValidateOptions and Load; its own options; its family's Chat (the
// token that opens the generation prompt, whether a request thinks by
// default, the sampling presets, how a tool call is forced) and its model
// family's quirks.
package nativebackend
