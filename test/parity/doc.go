// Package parity checks the native engine against Hugging Face transformers.
//
// make_goldens.py (run by run.sh on a machine with PyTorch and transformers 5.17) builds tiny random-weight qwen3 and
// qwen3_5 models, converts them with dflash-model convert, and writes testdata/<case>.gguf plus testdata/<case>.json
// holding the prompt token ids, transformers' logits for every prefill position and for 32 greedy decode steps, and
// the greedy tokens. The Go test compares the CPU engine (bin/lib/libdflash_cpu.so, or $DFLASH_LIB_DIR) with those
// files on every `make test`, without torch: max relative error per logits row <= 1e-4 and identical greedy tokens,
// alone and in a batch.
//
// make_goldens_ds4.py does the same for DeepSeek V4 (transformers deepseek_v4, the tiny recipe of the deepseek4 spec
// §11.3: window-only, CSA and HCA layers, hash and routed MoE, a wrapping ring, indexer pruning with 32 heads, YaRN
// compress rope; every constant-initialised parameter drawn again), 64 greedy decode steps, in two cases: deepseek4
// (index_topk 4) and deepseek4_clamp (pruning off, SwiGLU limit 0.5 so the clamp fires).
package parity
