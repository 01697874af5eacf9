// Command dflash-model inspects, converts and generates GGUF model files.
//
//	dflash-model inspect FILE
//	dflash-model convert HF_DIR OUT.gguf [--type f32|f16|bf16|q8_0|q4_0|q4_K|q6_K]
//	dflash-model mk ARCH OUT.gguf --tokenizer PATH [shape flags] [--type T --seed S]
//
// convert turns a Hugging Face safetensors checkpoint (Qwen3, Qwen3.5,
// DFlash v1 drafts) into a GGUF file with llama.cpp's tensor names and
// conventions (drafts: the Lucebox "dflash-draft" dialect); mk writes a
// random-weight model of any size with a real tokenizer, for tests, demos
// and benchmarks. Both stream tensors to disk row by row.
//
// Architectures are described once, in qwen3.go, qwen35.go and dflash.go:
// hyperparameters → metadata keys and a tensor plan (GGUF name, ggml dims,
// random init for mk, Hugging Face source and value changes for convert).
// inspect checks files against the same plans.
package main
