// Package safetensors reads Hugging Face .safetensors checkpoints: a JSON
// header (tensor name → dtype, shape, byte range) followed by raw
// little-endian tensor data. Files are memory-mapped and tensor bytes are
// handed out without copying; rows can be decoded to float32 one at a time so
// that converting a large checkpoint never needs a whole tensor in memory.
//
// OpenDir opens a checkpoint folder: a single model.safetensors or the shards
// listed in model.safetensors.index.json (or, failing that, every
// *.safetensors file in the folder).
package safetensors
