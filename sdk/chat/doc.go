// Package chat turns conversations into prompt text and generated text back
// into typed pieces, the two model-specific steps around the engine.
//
// Rendering runs the model's own Jinja chat template (tokenizer.chat_template
// from the GGUF, or a file from the operator) on the package's own Jinja
// engine (internal/jinja), which evaluates with Python's semantics, and with
// the variables Hugging Face transformers' apply_chat_template passes, so
// prompts match the reference byte for byte; testdata/goldens holds outputs
// rendered by transformers 5.17 (see test/parity/chat).
//
// Parsing is incremental: a Parser takes generated text in arbitrary pieces
// and returns reasoning text, visible text and tool calls (start, then JSON
// argument fragments) as soon as they are unambiguous. Text that could be the
// start of a tag is held back until the next piece decides it, so a partial
// tag never reaches a client.
package chat
