// Package nativebackend is the wiring every backend plugin on the native
// engine shares: opening the engine library for a device, mapping the GGUF,
// building its tokenizer and chat template, the capacity and engine-option
// defaults (in one place, defaults.go), the engine options every such
// backend declares, loading the weights and starting sdk/engine's
// continuous-batching loop over them, and the adapters from the native
// model and the chat parsers to sdk/engine.
//
// A backend (qwen-dflash, and later ds4) keeps only what is specific to its
// models: its name and architectures, its own options, how a request is
// rendered and sampled, and its model family's quirks.
package nativebackend
