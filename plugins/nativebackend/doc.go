// Package nativebackend is the wiring every backend plugin on the native
// engine shares: opening the engine library for a device, mapping the GGUF,
// building its tokenizer and chat template, the capacity and engine-option
// defaults (in one place, defaults.go), the engine options every such
// backend declares, loading the weights and starting sdk/engine's
// continuous-batching loop over them, the adapters from the native model
// and the chat parsers to sdk/engine, the checks of a request's settings,
// and Runner, which answers the sdk.Backend calls that are the same for
// every native backend (Start, Tokenize, Detokenize, CountTokens, Stats,
// Shutdown).
//
// A backend (qwen-dflash, ds4) keeps only what is specific to its
// models: Info, ValidateOptions and Load; its own options; how a request is
// rendered and prepared (Model), its sampling presets and its model
// family's quirks.
package nativebackend
