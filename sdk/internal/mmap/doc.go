// Package mmap maps model files read-only for the sdk's file readers (gguf,
// safetensors), so that tensor data can be handed out as zero-copy slices.
// Where the platform has no mmap the file is read into memory instead, with the
// same signature.
package mmap
