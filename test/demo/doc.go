// Package demo holds the trained demo pair's recipe (PyTorch scripts, see README.md) and the Go checks that tie it
// to the engine: the Go tokenizer encodes exactly as the Python one that trained the model, and the CPU engine
// computes the target's logits and captured layers as PyTorch does.
package demo
