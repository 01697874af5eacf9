// Command dflash-model inspects, converts and generates GGUF model files.
//
//	dflash-model inspect FILE
//	dflash-model convert HF_DIR OUT.gguf [--type f32|f16|bf16|q8_0|q4_0|q4_K|q6_K]
//	dflash-model mk ARCH OUT.gguf --tokenizer PATH [shape flags] [--type T --seed S]
//	dflash-model mk dflash OUT.gguf --target TARGET.gguf [draft flags]
//
// convert turns a Hugging Face safetensors checkpoint (Qwen3, Qwen3.5,
// DFlash and DFlash2 drafts) into a GGUF file with llama.cpp's tensor names
// and conventions (drafts: upstream llama.cpp's "dflash" architecture, with
// the target's tokenizer from --target); mk writes a
// random-weight model of any size with a real tokenizer, for tests, demos
// and benchmarks. Both stream tensors to disk row by row.
//
// inspect also reads the other draft dialects (llama.cpp's pre-merge branch,
// Lucebox's dflash-draft / qwen35-dflash-draft) and prints what a draft
// captures in one numbering.
//
// Architectures are described once, in qwen3.go, qwen35.go and dflash.go:
// hyperparameters → metadata keys and a tensor plan (GGUF name, ggml dims,
// random init for mk, Hugging Face source and value changes for convert).
// inspect checks files against the same plans.
package main
