// Package parity checks the native engine against Hugging Face transformers.
//
// make_goldens.py (run by run.sh on a machine with PyTorch and transformers 5.17) builds tiny random-weight qwen3 and
// qwen3_5 models, converts them with dflash-model convert, and writes testdata/<case>.gguf plus testdata/<case>.json
// holding the prompt token ids, transformers' logits for every prefill position and for 32 greedy decode steps, and
// the greedy tokens. The Go test compares the CPU engine (bin/lib/libdflash_cpu.so, or $DFLASH_LIB_DIR) with those
// files on every `make test`, without torch: max relative error per logits row <= 1e-4 and identical greedy tokens,
// alone and in a batch.
package parity
