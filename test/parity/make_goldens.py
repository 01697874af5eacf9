#!/usr/bin/env python3
"""Writes the parity goldens of the native engine.

For each case it builds a tiny random-weight model with Hugging Face transformers (qwen3 / qwen3_5, every weight drawn
again, see qwen-targets §6.3), saves it as a safetensors checkpoint, converts it with `dflash-model convert`, and runs
transformers on fixed prompts (token ids fed directly): logits of every prefill position, then 32 greedy decode steps
through the model's own cache (Gated DeltaNet: chunked prefill, recurrent decode). Outputs, per case:

    OUT/<case>.gguf   the converted model (weights are f16-exact, stored as f16; 1-D tensors f32)
    OUT/<case>.json   input ids, transformers' logits (base64 little-endian f32) and greedy tokens

The Go test in test/parity compares the CPU engine with these files; it needs neither torch nor this script.

Usage: make_goldens.py --out DIR --convert bin/dflash-model [--case NAME]
Needs PyTorch and transformers >= 5.2 (goldens were made with 5.17). Runs on the CPU in float32.
"""

import argparse
import base64
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import torch
import transformers

VOCAB = 256
HIDDEN = 64
FF = 96
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32
PROMPT_LENS = (70, 128)  # one length not a multiple of the DeltaNet chunk (64), one that is
DECODE_STEPS = 32
MIN_MARGIN = 2e-3  # greedy decisions closer than this are re-drawn with another seed

CASES = {
    # name: (model type, layers, tied embeddings, first seed)
    "qwen3": ("qwen3", 8, False, 1000),
    "qwen3_tied": ("qwen3", 2, True, 2000),
    "qwen35": ("qwen3_5", 8, False, 3000),
}

HERE = os.path.dirname(os.path.abspath(__file__))


def make_config(kind, layers, tied):
    if kind == "qwen3":
        return transformers.Qwen3Config(
            vocab_size=VOCAB,
            hidden_size=HIDDEN,
            intermediate_size=FF,
            num_hidden_layers=layers,
            num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS,
            head_dim=HEAD_DIM,
            rms_norm_eps=1e-6,
            max_position_embeddings=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6},  # always explicit (§6.2)
            tie_word_embeddings=tied,
        )
    return transformers.Qwen3_5TextConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FF,
        num_hidden_layers=layers,  # layers 3 and 7 are full attention, the rest Gated DeltaNet
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        linear_num_key_heads=2,
        linear_num_value_heads=4,  # n_v / n_k = 2 exercises the value-head grouping and the GGUF reorder
        linear_key_head_dim=16,
        linear_value_head_dim=32,  # d_k != d_v catches mix-ups
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1e7,
            "partial_rotary_factor": 0.25,  # 8 of 32 dims rotate: 4 frequency slots
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
        },
        tie_word_embeddings=tied,
    )


def make_model(kind, cfg):
    cls = transformers.Qwen3ForCausalLM if kind == "qwen3" else transformers.Qwen3_5ForCausalLM
    try:
        model = cls._from_config(cfg, attn_implementation="eager")
    except (TypeError, ValueError, AttributeError) as e:
        print(f"_from_config(attn_implementation=eager) failed ({e}); using the default attention", flush=True)
        model = cls(cfg)
    return model.float().eval()


def rerandomise(model, kind, gen):
    """Draws every parameter again (HF init hides bugs: zero-centred norms start at 0, dt_bias at 1, ...) and rounds it
    to f16 so that an f16 GGUF holds exactly the weights transformers computes with."""
    names = []
    with torch.no_grad():
        for name, p in model.named_parameters():
            n = p.numel()
            randn = lambda std: torch.randn(p.shape, generator=gen) * std
            if name.endswith("norm.weight"):
                zero_centred = kind == "qwen3_5" and "linear_attn.norm" not in name
                v = randn(0.1) if zero_centred else 1 + randn(0.1)
            elif name.endswith("A_log"):
                v = torch.log(0.5 + 3.5 * torch.rand(p.shape, generator=gen))
            elif name.endswith("dt_bias"):
                v = randn(0.5)
            elif "conv1d" in name:
                v = randn(0.3)
            elif "embed_tokens" in name:
                v = randn(0.5)
            elif "lm_head" in name:
                v = randn(0.1)
            else:
                v = randn(0.05)
            p.copy_(v.to(torch.float16).to(torch.float32))
            names.append((name, list(p.shape), n))
    return names


def f32_b64(t):
    t = t.detach().to(torch.float32).contiguous().cpu()
    return base64.b64encode(struct.pack("<%df" % t.numel(), *t.flatten().tolist())).decode("ascii")


def prefill_and_decode(model, prompts, steps):
    """Logits of every position of each prompt (no cache); greedy decode of `steps` tokens through the model's cache
    after the first prompt, with the smallest top-2 margin of the greedy choices."""
    out = {"prompts": []}
    with torch.no_grad():
        for ids in prompts:
            r = model(input_ids=torch.tensor([ids]), use_cache=False)
            out["prompts"].append({"ids": ids, "logits": r.logits[0]})
        r = model(input_ids=torch.tensor([prompts[0]]), use_cache=True)
        cache = r.past_key_values
        last = r.logits[0, -1]
        tokens, rows, margins = [], [], []
        for step in range(steps + 1):
            top = torch.topk(last, 2)
            margins.append(float(top.values[0] - top.values[1]))
            tok = int(torch.argmax(last))
            tokens.append(tok)
            if step == steps:
                break
            r = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
            cache = r.past_key_values
            last = r.logits[0, -1]
            rows.append(last)
    out["decode"] = {"prompt": 0, "tokens": tokens, "logits": torch.stack(rows)}
    out["min_margin"] = min(margins)
    return out


def run_hf(model, prompts):
    """Prefill logits of every prompt; greedy decode of DECODE_STEPS tokens after the first prompt."""
    out = prefill_and_decode(model, prompts, DECODE_STEPS)
    tokens, rows = out["decode"]["tokens"], out["decode"]["logits"]
    with torch.no_grad():
        # HF self-check (§6.5): the first decode step (recurrent DeltaNet path) against an uncached forward of the
        # prompt plus that token (chunked path)
        r = model(input_ids=torch.tensor([prompts[0] + tokens[:1]]), use_cache=False)
        self_err = float((r.logits[0, -1] - rows[0]).abs().max())
    out["hf_self_err"] = self_err
    return out


def convert(tool, hf_dir, gguf_path):
    cmd = [tool, "convert", hf_dir, gguf_path, "--type", "f16"]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def build_case(name, tool, out_dir):
    kind, layers, tied, seed0 = CASES[name]
    cfg = make_config(kind, layers, tied)
    for attempt in range(20):
        seed = seed0 + attempt
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        model = make_model(kind, cfg)
        params = rerandomise(model, kind, gen)
        prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in PROMPT_LENS]
        res = run_hf(model, prompts)
        print(f"{name}: seed {seed}: min greedy margin {res['min_margin']:.3g}", flush=True)
        if res["min_margin"] >= MIN_MARGIN:
            break
    else:
        raise SystemExit(f"{name}: no seed gave greedy margins >= {MIN_MARGIN}")

    with tempfile.TemporaryDirectory() as hf_dir:
        model.save_pretrained(hf_dir, safe_serialization=True)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(HERE, "hf_tokenizer", f), hf_dir)
        with open(os.path.join(hf_dir, "config.json")) as fh:
            hf_config = json.load(fh)
        gguf_path = os.path.join(out_dir, name + ".gguf")
        convert(tool, hf_dir, gguf_path)

    write_golden(out_dir, name, hf_config, res, seed=seed, vocab=VOCAB, layers=layers, tied=tied)
    n_params = sum(n for _, _, n in params)
    print(f"{name}: {n_params} parameters, gguf {os.path.getsize(gguf_path)} bytes, tokens {res['decode']['tokens']}")


def write_golden(out_dir, name, hf_config, res, **fields):
    """OUT/<name>.json: the case's facts (fields: seed, vocab, layers, ...) and transformers' prompts, logits and greedy
    tokens, in the layout parity_test.go reads."""
    golden = {"case": name, "hf_model_type": hf_config.get("model_type"), "transformers": transformers.__version__,
              "torch": torch.__version__}
    golden.update(fields)
    golden.update({
        "min_greedy_margin": res["min_margin"],
        "hf_self_err": res["hf_self_err"],
        "config": hf_config,
        "prompts": [{"ids": p["ids"], "logits": f32_b64(p["logits"])} for p in res["prompts"]],
        "decode": {
            "prompt": 0,
            "tokens": res["decode"]["tokens"],
            "logits": f32_b64(res["decode"]["logits"]),
        },
    })
    with open(os.path.join(out_dir, name + ".json"), "w") as fh:
        json.dump(golden, fh, indent=1)
        fh.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--convert", required=True, help="path of the dflash-model binary")
    ap.add_argument("--case", action="append", choices=sorted(CASES), help="only these cases (default: all)")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    torch.use_deterministic_algorithms(True)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    for name in args.case or sorted(CASES):
        build_case(name, args.convert, args.out)


if __name__ == "__main__":
    sys.exit(main())
