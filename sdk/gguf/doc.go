// Package gguf reads and writes GGUF v3 model files (the llama.cpp / ggml
// container format).
//
// Reading memory-maps the file and parses only the header: metadata scalars
// are decoded at Open, metadata arrays (the vocabulary can hold a quarter of a
// million strings) are located at Open and decoded on demand by Meta, and
// tensor data is handed out as zero-copy slices of the mapping. Every count,
// length and offset is checked against the file's size before it is used, so
// a corrupt or hostile file yields an error naming the culprit, never a panic
// or a huge allocation.
//
// Writing is streaming: declare all metadata and tensors first (the header
// carries every tensor's offset, which follows from the declared shapes), then
// write each tensor's bytes in declaration order; no tensor has to be held in
// memory whole.
//
// Tensor shapes are always in ggml order: Dims[0] (ne0) is the innermost,
// contiguous dimension, the reverse of a PyTorch/NumPy shape.
package gguf
