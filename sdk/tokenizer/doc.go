// Package tokenizer implements the byte-level BPE tokenizers of the models
// dflash_server serves (Qwen3: pre-tokenizer "qwen2"; Qwen3.5+: "qwen35";
// DeepSeek V3: "deepseek-v3"; DeepSeek V4 GGUFs: "joyai-llm", the same
// split), built from GGUF metadata (tokenizer.ggml.*) and matching the
// Hugging Face tokenizers token for token.
//
// Encoding follows the llama.cpp conventions for GGUF vocabularies: special
// tokens are cut out of the text first (control tokens only when the caller
// asks to parse specials, user-defined tokens always), each remaining
// fragment is normalised as the original tokenizer did (NFC for the Qwen
// families), split by a hand-written scanner equivalent to the model's
// pre-tokenizer regex, and every piece is BPE-merged over raw bytes.
//
// HFMetadata converts a Hugging Face tokenizer.json into the same GGUF
// metadata the llama.cpp converter writes, so tools can build GGUF files
// and tests can compare against reference tokenizers.
//
// Invalid UTF-8 in the input is replaced by U+FFFD per maximal ill-formed
// subsequence (the WHATWG / Python "replace" rule), which is what a caller
// of the reference tokenizers gets after decoding bytes to a string.
// Decode and StreamDecoder apply the same rule to their output, so they
// always return valid UTF-8.
package tokenizer
