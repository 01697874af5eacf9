#!/usr/bin/env python3
"""The PyTorch column of the CUDA engine's benchmark (docs/PERFORMANCE.md): the same model shapes as our GGUF presets,
run by Hugging Face transformers in bf16 on the GPU with a static KV cache and torch.compile, random weights.

Prints, per shape: prefill tokens/s for 512 and 4096 tokens, and greedy decode tokens/s at batch 1, 8 and 32 (a
16-token prompt, then `--steps` decode steps through the compiled forward). The weights of an 8B model in bf16 are
16 GB, so its decode bound is about twice ours in q8_0.

Usage: torch_bench.py [--shape qwen3-8b|qwen3.5-27b] [--steps 64] [--no-compile]
"""

import argparse
import time

import torch
import transformers

SHAPES = {
    "qwen3-8b": dict(model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                     rope_theta=1e6, max_position_embeddings=8192, tie_word_embeddings=False),
}


def build(shape):
    cfg = dict(SHAPES[shape])
    mt = cfg.pop("model_type")
    config = transformers.AutoConfig.for_model(mt, **cfg)
    config.torch_dtype = torch.bfloat16
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    model.eval()
    return model


def static_cache(config, batch, length):
    # transformers 5 sizes the cache's batch and device at its first update; 4.x wanted them up front
    try:
        return transformers.StaticCache(config=config, max_cache_len=length)
    except TypeError:
        return transformers.StaticCache(config=config, max_batch_size=batch, max_cache_len=length, device="cuda",
                                        dtype=torch.bfloat16)


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


@torch.inference_mode()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--no-compile", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = build(args.shape)
    vocab = model.config.vocab_size
    print(f"torch {torch.__version__} transformers {transformers.__version__} {torch.cuda.get_device_name()}")

    for n in (512, 4096):
        ids = torch.randint(0, vocab, (1, n), device="cuda")
        dt = timed(lambda: model(ids, use_cache=False, logits_to_keep=1), 3)
        print(f"{args.shape} bf16 pp{n}: {n / dt:.0f} tok/s")

    for b in (1, 8, 32):
        cache = static_cache(model.config, b, 16 + args.steps + 8)
        step = model.forward
        if not args.no_compile:
            step = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        ids = torch.randint(0, vocab, (b, 16), device="cuda")
        pos = torch.arange(16, device="cuda")
        out = model(ids, past_key_values=cache, cache_position=pos, use_cache=True, logits_to_keep=1)
        tok = out.logits[:, -1:].argmax(-1)

        def run(k0, k1):
            nonlocal tok
            for k in range(k0, k1):
                p = torch.tensor([16 + k], device="cuda")
                o = step(tok, past_key_values=cache, cache_position=p, use_cache=True)
                tok = o.logits[:, -1:].argmax(-1)

        try:
            run(0, 4)  # compile and warm the graphs
        except Exception as e:  # a transformers/torch combination that does not compile still gets an eager figure
            print(f"torch.compile failed ({type(e).__name__}: {str(e)[:200]}); eager")
            step = model.forward
            run(0, 4)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run(4, args.steps)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        print(f"{args.shape} bf16 tg batch {b}: {b * (args.steps - 4) / dt:.0f} tok/s")


if __name__ == "__main__":
    main()
