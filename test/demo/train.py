#!/usr/bin/env python3
"""Train the demo target (qwen3) or its DFlash draft; see README.md.

  train.py target --data .gpu-demo --out OUT/target --results OUT/results.json
  train.py draft  --data .gpu-demo --target OUT/target --out OUT/draft --results OUT/results.json

Both stop at --time-limit seconds of training (the learning-rate schedule
follows elapsed time, so a faster or slower machine still ends its cosine)
or at --max-steps, then evaluate and export a Hugging Face-style folder
(config.json + model.safetensors). Results are merged into --results.
"""

import argparse
import contextlib
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demomodel as dm  # noqa: E402
import demotok  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

PROMPTS = [
    "package main\n\nimport (\n\t\"fmt\"\n",
    "// Reverse returns a new slice with the elements of s in reverse order.\nfunc Reverse[S ~[]E, E any](s S) S {\n",
    "func (b *Buffer) WriteString(s string) (n int, err error) {\n",
]


def log(*a):
    print("[%s]" % time.strftime("%H:%M:%S"), *a, flush=True)


def setup(seed):
    torch.manual_seed(seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda":
        torch.cuda.manual_seed_all(seed)
    else:
        torch.set_num_threads(max(1, os.cpu_count() or 1))
    return dev


def exact_fp32():
    """Evaluation in true FP32 (no TF32), so that speculative and plain greedy
    decoding, whose forwards have different shapes, agree on near-ties."""
    if hasattr(torch, "set_float32_matmul_precision"):
        torch.set_float32_matmul_precision("highest")
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def autocast(dev):
    if dev.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def lr_at(p, warm, base):
    """Linear warm-up over the first `warm` fraction, then cosine to 10%."""
    if p < warm:
        return base * max(p / warm, 0.01)
    q = min(1.0, (p - warm) / max(1e-9, 1 - warm))
    return base * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * q)))


def batch(tokens, n, T, gen, dev):
    off = torch.randint(0, tokens.numel() - T - 1, (n,), generator=gen)
    idx = off[:, None] + torch.arange(T + 1)
    return tokens[idx].to(dev, non_blocking=True)


def merge_results(path, key, value):
    if not path:
        return
    r = {}
    if os.path.exists(path):
        with open(path) as f:
            r = json.load(f)
    r[key] = value
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(r, f, indent=2)
    os.replace(path + ".tmp", path)


def optimizer(params, lr, wd):
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)


@torch.no_grad()
def heldout_loss(model, tokens, T, dev, max_tokens):
    model.eval()
    n = min(tokens.numel() - 1, max_tokens) // T
    tot, cnt = 0.0, 0
    for i in range(0, n, 16):
        rows = torch.stack([tokens[j * T: j * T + T + 1] for j in range(i, min(n, i + 16))]).to(dev)
        logits, _ = model(rows[:, :-1])
        tot += F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1),
                               reduction="sum").item()
        cnt += rows[:, 1:].numel()
    return tot / max(cnt, 1), cnt


# ------------------------------------------------------------------ target

def cmd_target(a):
    dev = setup(a.seed)
    tok = demotok.Tokenizer.load(a.tokenizer)
    train = dm.load_tokens(os.path.join(a.data, "train.u16.xz"))
    held = dm.load_tokens(os.path.join(a.data, "heldout.u16.xz"))
    if dev.type == "cuda":
        train = train.pin_memory()
    log("target: %d train / %d held-out tokens, device %s, torch %s" % (train.numel(), held.numel(), dev, torch.__version__))
    c = dm.target_config(len(tok), a.hidden, a.layers, a.heads, a.kv_heads, a.head_dim, a.ffn, a.ctx,
                         tok.specials[demotok.EOS])
    model = dm.Qwen3(c).to(dev)
    nparam = sum(p.numel() for p in model.parameters())
    log("target: %d params, config %s" % (nparam, json.dumps({k: c[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size")})))
    opt = optimizer(list(model.parameters()), a.lr, 0.1)
    gen = torch.Generator().manual_seed(a.seed)
    t0, step, seen, ema, wsum, wn = time.time(), 0, 0, None, 0.0, 0
    model.train()
    while True:
        el = time.time() - t0
        p = max(el / a.time_limit, step / a.max_steps if a.max_steps else 0.0)
        if p >= 1.0:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(p, a.warmup, a.lr)
        x = batch(train, a.batch, a.seq, gen, dev)
        with autocast(dev):
            logits, _ = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        seen += x[:, 1:].numel()
        wsum, wn = wsum + loss.detach(), wn + 1
        if step % a.log_every == 0 or step == 1:
            ema = wsum.item() / wn  # mean over the steps since the last log line
            wsum, wn = 0.0, 0
            log("target step %d  %.0fs  loss %.4f  lr %.2e  %.0f tok/s" % (
                step, el, ema, opt.param_groups[0]["lr"], seen / max(time.time() - t0, 1e-9)))
    train_s = time.time() - t0
    with autocast(dev):
        hl, hn = heldout_loss(model, held, a.seq, dev, a.eval_tokens)
    log("target: %d steps, %d tokens in %.0fs; held-out loss %.4f (ppl %.2f) over %d tokens" % (
        step, seen, train_s, hl, math.exp(hl), hn))
    dm.save_hf(a.out, model, c)
    model = dm.load_hf(a.out, dm.Qwen3).to(dev)  # samples from the exported (BF16) weights
    exact_fp32()
    samples = []
    model.eval()
    for pr in PROMPTS:
        ids = tok.encode(pr)
        out = greedy(model, ids, a.sample_tokens, dev, tok.specials[demotok.EOS])
        samples.append({"prompt": pr, "prompt_ids": ids, "completion_ids": out, "completion": tok.decode(out)})
        log("sample: %r -> %r" % (pr, tok.decode(out)))
    merge_results(a.results, "target", {
        "config": c, "params": nparam, "steps": step, "train_tokens": seen, "train_seconds": round(train_s, 1),
        "heldout_loss": round(hl, 4), "heldout_ppl": round(math.exp(hl), 3), "heldout_tokens": hn,
        "final_train_loss": ema, "seed": a.seed, "torch": torch.__version__, "device": str(dev),
        "greedy_samples": samples})


@torch.no_grad()
def greedy(model, ids, n, dev, eos):
    seq = torch.tensor([ids], device=dev)
    out = []
    for _ in range(n):
        logits, _ = model(seq)
        t = int(logits[0, -1].argmax())
        out.append(t)
        if t == eos:
            break
        seq = torch.cat([seq, torch.tensor([[t]], device=dev)], dim=1)
    return out


# ------------------------------------------------------------------- draft

def draft_logits(target, draft, block_ids, block_pos, feats, ctx_pos, mask=None):
    emb = target.model.embed_tokens(block_ids)
    h = draft(emb, block_pos, feats, ctx_pos, mask)
    return target.lm_head(h)


@torch.no_grad()
def spec_generate(target, draft, ids, n, dev, mask_id, B, layer_ids, eos):
    """Greedy chain (spec §3.3) with full recomputation: returns (tokens, per-step AL list)."""
    seq = torch.tensor([ids], device=dev)
    logits, caps = target(seq, capture=layer_ids)
    feats = torch.cat(caps, dim=-1)
    last = int(logits[0, -1].argmax())
    out, als = [], []
    while len(out) < n:
        C = seq.shape[1]
        blk = torch.tensor([[last] + [mask_id] * (B - 1)], device=dev)
        bpos = torch.arange(C, C + B, device=dev)[None]
        cpos = torch.arange(C, device=dev)[None]
        d = draft_logits(target, draft, blk, bpos, feats[:, :C], cpos).argmax(-1)[0].tolist()
        ver = torch.cat([seq, torch.tensor([[last] + d[1:]], device=dev)], dim=1)
        logits, caps = target(ver, capture=layer_ids)
        t = logits[0, C:C + B].argmax(-1).tolist()
        k = 0
        while k < B - 1 and d[k + 1] == t[k]:
            k += 1
        acc = [last] + d[1:k + 1]
        als.append(k + 1)
        seq = torch.cat([seq, torch.tensor([acc], device=dev)], dim=1)
        feats = torch.cat(caps, dim=-1)[:, :seq.shape[1]]
        last = t[k]
        out.extend(acc)
        if eos in acc:
            out = out[:out.index(eos) + 1]
            break
        if len(out) < n and last == eos:
            out.append(last)
            break
    return out[:n], als


@torch.no_grad()
def position_al(target, draft, held, dev, mask_id, B, layer_ids, lengths, n, gen):
    """Mean AL of one chain step at random held-out positions (spec §3.3):
    1 + longest prefix of the draft's proposals equal to the target's greedy
    continuation of the prefix."""
    res = {}
    for L in lengths:
        als = []
        for i in range(0, n, 64):
            m = min(64, n - i)
            off = torch.randint(0, held.numel() - L - 1, (m,), generator=gen)
            pre = held[off[:, None] + torch.arange(L)].to(dev)
            logits, caps = target(pre, capture=layer_ids)
            feats = torch.cat(caps, dim=-1)
            g = [logits[:, -1].argmax(-1)]
            seq = pre
            for _ in range(B - 1):
                seq = torch.cat([seq, g[-1][:, None]], dim=1)
                lg, _ = target(seq)
                g.append(lg[:, -1].argmax(-1))
            g = torch.stack(g, dim=1)                              # [m, B]: g0 .. g15
            blk = torch.full((m, B), mask_id, device=dev)
            blk[:, 0] = g[:, 0]
            bpos = torch.arange(L, L + B, device=dev)[None].expand(m, B)
            cpos = torch.arange(L, device=dev)[None].expand(m, L)
            d = draft_logits(target, draft, blk, bpos, feats, cpos).argmax(-1)
            ok = (d[:, 1:] == g[:, 1:]).long().cumprod(dim=1).sum(dim=1)
            als.extend((ok + 1).tolist())
        res[str(L)] = sum(als) / len(als)
    return res


def cmd_draft(a):
    dev = setup(a.seed)
    tok = demotok.Tokenizer.load(a.tokenizer)
    mask_id, eos = tok.specials[demotok.MASK], tok.specials[demotok.EOS]
    train = dm.load_tokens(os.path.join(a.data, "train.u16.xz"))
    held = dm.load_tokens(os.path.join(a.data, "heldout.u16.xz"))
    target = dm.load_hf(a.target, dm.Qwen3).to(dev).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    c = dm.draft_config(target.c, a.layers, a.n_target, mask_id, a.block)
    layer_ids = c["dflash_config"]["target_layer_ids"]
    draft = dm.DFlashDraft(c).to(dev)
    nparam = sum(p.numel() for p in draft.parameters())
    log("draft: %d params, %d layers, target layers %s, mask id %d, block %d, device %s" % (
        nparam, a.layers, layer_ids, mask_id, a.block, dev))
    opt = optimizer(list(draft.parameters()), a.lr, 0.01)
    gen = torch.Generator().manual_seed(a.seed + 1)
    B, K, T = a.block, a.anchors, a.seq
    w = torch.exp(-torch.arange(B - 1, dtype=torch.float32) / a.gamma).to(dev)  # positions 1..B-1
    kk = torch.arange(B, device=dev)
    t0, step, ema, wsum, wn = time.time(), 0, None, 0.0, 0
    while True:
        el = time.time() - t0
        p = max(el / a.time_limit, step / a.max_steps if a.max_steps else 0.0)
        if p >= 1.0:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(p, a.warmup, a.lr)
        x = batch(train, a.batch, T - 1, gen, dev)                   # [n, T]
        n = x.shape[0]
        with torch.no_grad(), autocast(dev):
            logits, caps = target(x, capture=layer_ids)
            labels = logits.argmax(-1)                               # labels[p]: target's greedy token for p+1
            feats = torch.cat(caps, dim=-1)
        anc = torch.randint(1, T - B + 1, (n, K), generator=gen).to(dev)   # block at anc..anc+B-1
        blk = torch.full((n, K, B), mask_id, device=dev)
        blk[:, :, 0] = x.gather(1, anc)
        bpos = (anc[:, :, None] + kk).reshape(n, K * B)
        tgt = labels.gather(1, (anc[:, :, None] + kk[1:] - 1).reshape(n, -1)).reshape(n, K, B - 1)
        cpos = torch.arange(T, device=dev)
        ctx_ok = (cpos[None, None, :] < anc[:, :, None])[:, :, None, :].expand(n, K, B, T).reshape(n, K * B, T)
        same = torch.arange(K, device=dev).repeat_interleave(B)
        blk_ok = (same[:, None] == same[None, :])[None].expand(n, K * B, K * B)
        mask = torch.cat([ctx_ok, blk_ok], dim=2)[:, None]
        with autocast(dev):
            lg = draft_logits(target, draft, blk.reshape(n, K * B), bpos, feats, cpos[None].expand(n, T), mask)
        lg = lg.float().reshape(n, K, B, -1)[:, :, 1:]
        ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1), reduction="none").reshape(n, K, B - 1)
        loss = (ce * w).sum() / (w.sum() * n * K)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        step += 1
        wsum, wn = wsum + loss.detach(), wn + 1
        if step % a.log_every == 0 or step == 1:
            with torch.no_grad():
                acc = (lg.argmax(-1) == tgt).long().cumprod(dim=2).sum(dim=2).float().mean().item() + 1
            ema = wsum.item() / wn  # mean over the steps since the last log line
            wsum, wn = 0.0, 0
            log("draft step %d  %.0fs  loss %.4f  teacher-forced AL (this batch) %.2f  lr %.2e" % (
                step, el, ema, acc, opt.param_groups[0]["lr"]))
    train_s = time.time() - t0
    draft = draft.float().eval()
    dm.save_hf(a.out, draft, c)
    log("draft: %d steps in %.0fs; wrote %s" % (step, train_s, a.out))
    exact_fp32()
    ev = torch.Generator().manual_seed(a.seed + 2)
    pal = position_al(target, draft, held, dev, mask_id, B, layer_ids, a.al_lengths, a.al_positions, ev)
    log("draft: per-position AL (prefix length -> mean AL): %s" % pal)
    # chains over held-out prompts: first 64 tokens of held-out windows
    chain_tokens, chain_steps = 0, 0
    for i in range(a.chain_prompts):
        off = int(torch.randint(0, held.numel() - 65, (1,), generator=ev))
        out, als = spec_generate(target, draft, held[off:off + 64].tolist(), a.chain_new, dev, mask_id, B, layer_ids, eos)
        chain_tokens += sum(als)
        chain_steps += len(als)
    chain_al = chain_tokens / max(chain_steps, 1)
    log("draft: greedy-chain AL over %d held-out prompts: %.3f (%d tokens / %d steps)" % (
        a.chain_prompts, chain_al, chain_tokens, chain_steps))
    samples = []
    for pr in PROMPTS:
        ids = tok.encode(pr)
        out, als = spec_generate(target, draft, ids, a.sample_tokens, dev, mask_id, B, layer_ids, eos)
        ref = greedy(target, ids, a.sample_tokens, dev, eos)
        samples.append({"prompt": pr, "completion": tok.decode(out), "completion_ids": out,
                        "al": round(sum(als) / len(als), 3), "steps": len(als),
                        "equals_plain_greedy": out == ref[:len(out)] and len(out) == len(ref)})
        log("spec sample (AL %.2f, lossless %s): %r" % (samples[-1]["al"], samples[-1]["equals_plain_greedy"], tok.decode(out)))
    merge_results(a.results, "draft", {
        "config": c, "params": nparam, "steps": step, "train_seconds": round(train_s, 1),
        "final_train_loss": ema, "loss_target": "target greedy (teacher-forced argmax) at block positions 1..%d" % (B - 1),
        "gamma": a.gamma, "per_position_al": pal, "al_positions_per_length": a.al_positions,
        "chain_al": round(chain_al, 4), "chain_prompts": a.chain_prompts, "chain_new_tokens": a.chain_new,
        "spec_samples": samples, "seed": a.seed, "device": str(dev)})


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("target", "draft"):
        s = sub.add_parser(name)
        s.add_argument("--data", default=".gpu-demo")
        s.add_argument("--tokenizer", default=os.path.join(HERE, "tokenizer"))
        s.add_argument("--out", required=True)
        s.add_argument("--results", default="")
        s.add_argument("--seed", type=int, default=1234)
        s.add_argument("--time-limit", type=float, default=200)
        s.add_argument("--max-steps", type=int, default=0)
        s.add_argument("--seq", type=int, default=512)
        s.add_argument("--log-every", type=int, default=100)
        s.add_argument("--sample-tokens", type=int, default=96)
        s.add_argument("--warmup", type=float, default=0.03, help="fraction of the run")
    t = sub.choices["target"]
    t.add_argument("--hidden", type=int, default=256)
    t.add_argument("--layers", type=int, default=8)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--kv-heads", type=int, default=2)
    t.add_argument("--head-dim", type=int, default=64)
    t.add_argument("--ffn", type=int, default=768)
    t.add_argument("--ctx", type=int, default=4096, help="max_position_embeddings written to config.json")
    t.add_argument("--batch", type=int, default=64)
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--eval-tokens", type=int, default=1 << 20)
    d = sub.choices["draft"]
    d.add_argument("--target", required=True)
    d.add_argument("--layers", type=int, default=2)
    d.add_argument("--n-target", type=int, default=3)
    d.add_argument("--block", type=int, default=16)
    d.add_argument("--batch", type=int, default=32)
    d.add_argument("--anchors", type=int, default=32)
    d.add_argument("--gamma", type=float, default=7.0, help="loss weight exp(-(k-1)/gamma) at block position k")
    d.add_argument("--lr", type=float, default=2e-3)
    d.add_argument("--al-lengths", type=int, nargs="+", default=[32, 128, 384])
    d.add_argument("--al-positions", type=int, default=256)
    d.add_argument("--chain-prompts", type=int, default=32)
    d.add_argument("--chain-new", type=int, default=128)
    a = ap.parse_args()
    {"target": cmd_target, "draft": cmd_draft}[a.cmd](a)


if __name__ == "__main__":
    main()
