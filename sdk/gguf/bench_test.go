package gguf

import (
	"fmt"
	"path/filepath"
	"testing"
)

// benchFile writes a file shaped like a Qwen3 GGUF header: a 151936-token
// vocabulary with types and 151387 merges, the architecture keys and 311
// tensors (tiny data: parsing cost does not depend on tensor sizes).
func benchFile(b *testing.B) string {
	b.Helper()
	path := filepath.Join(b.TempDir(), "bench.gguf")
	w, err := Create(path)
	if err != nil {
		b.Fatal(err)
	}
	const nTok, nMerge = 151936, 151387
	toks := make([]string, nTok)
	types := make([]int32, nTok)
	for i := range toks {
		toks[i] = fmt.Sprintf("Ġtok%d", i)
		types[i] = 1
	}
	merges := make([]string, nMerge)
	for i := range merges {
		merges[i] = fmt.Sprintf("Ġt ok%d", i)
	}
	kvs := []struct {
		k string
		v any
	}{
		{KeyArchitecture, "qwen3"}, {"general.name", "bench"}, {"qwen3.block_count", uint32(28)},
		{"qwen3.embedding_length", uint32(1024)}, {"qwen3.attention.head_count", uint32(16)},
		{"qwen3.rope.freq_base", float32(1e6)}, {"tokenizer.ggml.model", "gpt2"},
		{"tokenizer.ggml.tokens", toks}, {"tokenizer.ggml.token_type", types}, {"tokenizer.ggml.merges", merges},
		{"tokenizer.chat_template", string(make([]byte, 4096))},
	}
	for _, kv := range kvs {
		if err := w.AddKV(kv.k, kv.v); err != nil {
			b.Fatal(err)
		}
	}
	var names []string
	for i := 0; i < 311; i++ {
		name := fmt.Sprintf("blk.%d.tensor_%d.weight", i/11, i%11)
		names = append(names, name)
		if err := w.AddTensor(name, F32, []uint64{8}); err != nil {
			b.Fatal(err)
		}
	}
	for _, n := range names {
		if err := w.WriteTensorData(n, make([]byte, 32)); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	return path
}

// BenchmarkOpen: mmap and parse the header (arrays are only located).
func BenchmarkOpen(b *testing.B) {
	path := benchFile(b)
	b.ResetTimer()
	for b.Loop() {
		f, err := Open(path)
		if err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

// BenchmarkOpenVocab: Open plus decoding what a tokenizer needs.
func BenchmarkOpenVocab(b *testing.B) {
	path := benchFile(b)
	b.ResetTimer()
	for b.Loop() {
		f, err := Open(path)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := f.Strings("tokenizer.ggml.tokens"); err != nil {
			b.Fatal(err)
		}
		if _, err := f.Strings("tokenizer.ggml.merges"); err != nil {
			b.Fatal(err)
		}
		if _, err := f.Int32s("tokenizer.ggml.token_type"); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

// BenchmarkReadArch: the server CLI's architecture probe.
func BenchmarkReadArch(b *testing.B) {
	path := benchFile(b)
	b.ResetTimer()
	for b.Loop() {
		if _, err := ReadArch(path); err != nil {
			b.Fatal(err)
		}
	}
}
