#!/usr/bin/env python3
"""Self-checks of the PyTorch code (CPU, seconds): the target is causal,
and the draft's batched training forward (many anchors per sequence, one
masked attention) gives the same logits as the inference forward of spec
§3.3 (context = features of positions < anchor, block at anchor..anchor+15,
no mask)."""
import os, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import demomodel as dm

torch.manual_seed(0)
V, B, T, K = 512, 16, 96, 5
tc = dm.target_config(V, 64, 8, 4, 2, 32, 128, 4096, 0)
target = dm.Qwen3(tc).eval()
with torch.no_grad():
    for n, p in target.named_parameters():
        p.normal_(0, 0.1) if p.dim() == 2 else p.uniform_(0.5, 1.5)
dc = dm.draft_config(tc, 2, 3, V - 1, B)
ids_l = dc["dflash_config"]["target_layer_ids"]
assert ids_l == [1, 3, 5], ids_l
draft = dm.DFlashDraft(dc).eval()
with torch.no_grad():
    for n, p in draft.named_parameters():
        p.normal_(0, 0.1) if p.dim() == 2 else p.uniform_(0.5, 1.5)
x = torch.randint(0, V - 1, (2, T))
with torch.no_grad():
    full, caps = target(x, capture=ids_l)
    pre, _ = target(x[:, :40])
    assert torch.allclose(full[:, :40], pre, atol=1e-4), "target is not causal"
    feats = torch.cat(caps, -1)
    anc = torch.tensor([[1, 7, 30, 50, T - B], [3, 3, 44, 60, 79]])
    kk = torch.arange(B)
    blk = torch.full((2, K, B), V - 1)
    blk[:, :, 0] = x.gather(1, anc)
    bpos = (anc[:, :, None] + kk).reshape(2, K * B)
    cpos = torch.arange(T)
    ctx_ok = (cpos[None, None, :] < anc[:, :, None])[:, :, None, :].expand(2, K, B, T).reshape(2, K * B, T)
    same = torch.arange(K).repeat_interleave(B)
    mask = torch.cat([ctx_ok, (same[:, None] == same[None, :])[None].expand(2, K * B, K * B)], 2)[:, None]
    h = draft(target.model.embed_tokens(blk.reshape(2, K * B)), bpos, feats, cpos[None].expand(2, T), mask)
    lg_train = target.lm_head(h).reshape(2, K, B, V)
    worst = 0.0
    for s in range(2):
        for k in range(K):
            a = int(anc[s, k])
            hi = draft(target.model.embed_tokens(blk[s, k][None]), torch.arange(a, a + B)[None],
                       feats[s:s + 1, :a], torch.arange(a)[None])
            worst = max(worst, (target.lm_head(hi)[0] - lg_train[s, k]).abs().max().item())
    print("max |train-batched - inference| logits: %.2e" % worst)
    assert worst < 1e-4
print("ok")
