"""Plain-torch Qwen3 target and DFlash draft for the demo pair.

Works on torch 1.13 (CPU) and 2.x (CUDA). The target matches Hugging Face's
Qwen3ForCausalLM (pre-norm RMSNorm eps 1e-6, per-head q_norm/k_norm before
NeoX RoPE, SwiGLU, GQA, tied embeddings); the draft follows the DFlash spec
§1.5: Qwen3-style layers whose keys and values also cover the projected
target features (KV injection), non-causal over the block, the target's
embedding and LM head (frozen, not part of the draft's weights).
"""

import ctypes
import json
import lzma
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

_SDPA = getattr(F, "scaled_dot_product_attention", None)


def attention(q, k, v, mask=None, causal=False):
    """q [B,h,Q,d], k/v [B,h,K,d]; mask bool [B|1,1,Q,K] (True = attend)."""
    if _SDPA is not None:
        return _SDPA(q, k, v, attn_mask=mask, is_causal=causal and mask is None)
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal and mask is None:
        Q, K = q.shape[-2], k.shape[-2]
        mask = torch.ones(Q, K, dtype=torch.bool, device=q.device).tril(K - Q)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(s.float(), dim=-1).to(v.dtype), v)


class RMSNorm(nn.Module):
    def __init__(self, n, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rope_cos_sin(pos, head_dim, theta):
    """pos [B,T] (int) -> cos, sin [B,1,T,head_dim] (NeoX: halves repeated)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float32) / head_dim))
    f = pos.float()[..., None] * inv
    e = torch.cat([f, f], dim=-1)[:, None]
    return e.cos(), e.sin()


def apply_rope(x, cos, sin):
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


def repeat_kv(x, n):
    if n == 1:
        return x
    B, h, T, d = x.shape
    return x[:, :, None].expand(B, h, n, T, d).reshape(B, h * n, T, d)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, hd = c["hidden_size"], c["head_dim"]
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], hd
        self.q_proj = nn.Linear(H, self.nh * hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, H, bias=False)
        self.q_norm = RMSNorm(hd, c["rms_norm_eps"])
        self.k_norm = RMSNorm(hd, c["rms_norm_eps"])

    def heads(self, proj, x, n):
        B, T, _ = x.shape
        return proj(x).view(B, T, n, self.hd).transpose(1, 2)

    def forward(self, x, cos, sin, ctx=None, ctx_cos=None, ctx_sin=None, mask=None, causal=True):
        q = apply_rope(self.q_norm(self.heads(self.q_proj, x, self.nh)), cos, sin)
        k = apply_rope(self.k_norm(self.heads(self.k_proj, x, self.nkv)), cos, sin)
        v = self.heads(self.v_proj, x, self.nkv)
        if ctx is not None:  # DFlash KV injection: context rows first, then the block
            kc = apply_rope(self.k_norm(self.heads(self.k_proj, ctx, self.nkv)), ctx_cos, ctx_sin)
            vc = self.heads(self.v_proj, ctx, self.nkv)
            k, v = torch.cat([kc, k], dim=2), torch.cat([vc, v], dim=2)
        r = self.nh // self.nkv
        o = attention(q, repeat_kv(k, r), repeat_kv(v, r), mask=mask, causal=causal)
        B, _, T, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, Fd = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(H, Fd, bias=False)
        self.up_proj = nn.Linear(H, Fd, bias=False)
        self.down_proj = nn.Linear(Fd, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, **kw):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, **kw)
        return x + self.mlp(self.post_attention_layernorm(x))


def init_weights(module, n_layers):
    for name, p in module.named_parameters():
        if name.endswith("norm.weight"):
            nn.init.ones_(p)
        elif p.dim() == 2:
            std = 0.02
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                std = 0.02 / math.sqrt(2 * n_layers)
            nn.init.normal_(p, 0.0, std)


class Qwen3Inner(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class Qwen3(nn.Module):
    """Qwen3ForCausalLM with tied embeddings; tensor names as HF's."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Qwen3Inner(c)
        init_weights(self, c["num_hidden_layers"])

    def lm_head(self, h):
        return F.linear(h, self.model.embed_tokens.weight)

    def forward(self, ids, capture=(), logits=True):
        """ids [B,T] -> (logits [B,T,V] or final hidden, [outputs of layers in capture])."""
        B, T = ids.shape
        pos = torch.arange(T, device=ids.device)[None].expand(B, T)
        cos, sin = rope_cos_sin(pos, self.c["head_dim"], self.c["rope_theta"])
        h = self.model.embed_tokens(ids)
        caps = {}
        for i, layer in enumerate(self.model.layers):
            h = layer(h, cos, sin, causal=True)
            if i in capture:
                caps[i] = h
        h = self.model.norm(h)
        return (self.lm_head(h) if logits else h), [caps[i] for i in capture]


class DFlashDraft(nn.Module):
    """DFlash v1 draft (spec §1.5); tensor names as z-lab's checkpoints."""

    def __init__(self, c):
        super().__init__()
        self.c = c
        H = c["hidden_size"]
        n = len(c["dflash_config"]["target_layer_ids"])
        self.fc = nn.Linear(n * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, c["rms_norm_eps"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(H, c["rms_norm_eps"])
        init_weights(self, c["num_hidden_layers"])

    def forward(self, block_emb, block_pos, feats, ctx_pos, mask=None):
        """block_emb [B,Q,H] (target embeddings of [tok, MASK...]), block_pos [B,Q];
        feats [B,C,N*H] concatenated target features, ctx_pos [B,C];
        mask bool [B,1,Q,C+Q] or None (all visible). Returns normed hidden [B,Q,H]."""
        hd, th = self.c["head_dim"], self.c["rope_theta"]
        ctx = self.hidden_norm(self.fc(feats))
        cos, sin = rope_cos_sin(block_pos, hd, th)
        ccos, csin = rope_cos_sin(ctx_pos, hd, th)
        h = block_emb
        for layer in self.layers:
            h = layer(h, cos, sin, ctx=ctx, ctx_cos=ccos, ctx_sin=csin, mask=mask, causal=False)
        return self.norm(h)


def target_layer_ids(n_layers, n):
    if n == 1:
        return [n_layers // 2]
    return [int(math.floor(1 + i * (n_layers - 4) / (n - 1) + 0.5)) for i in range(n)]


# ---------------------------------------------------------------- configs

def target_config(vocab, hidden, layers, heads, kv_heads, head_dim, ffn, ctx, eos_id):
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": ffn,
        "hidden_act": "silu",
        "max_position_embeddings": ctx,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "bfloat16",
    }


def draft_config(tc, layers, n_target, mask_id, block):
    ids = target_layer_ids(tc["num_hidden_layers"], n_target)
    c = {k: tc[k] for k in ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads",
                            "head_dim", "intermediate_size", "hidden_act", "max_position_embeddings",
                            "rms_norm_eps", "rope_theta", "attention_bias", "attention_dropout")}
    c.update({
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "num_hidden_layers": layers,
        "num_target_layers": n_target,
        "target_num_hidden_layers": tc["num_hidden_layers"],
        "layer_types": ["full_attention"] * layers,
        "use_sliding_window": False,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "block_size": block,
        "dflash_config": {"target_layer_ids": ids, "mask_token_id": mask_id, "block_size": block},
        "torch_dtype": "bfloat16",
    })
    return c


# ------------------------------------------------------------ safetensors

_DT = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
_TD = {v: k for k, v in _DT.items()}


def save_safetensors(path, tensors, dtype=torch.bfloat16, keep_f32=lambda name: False):
    """Write {name: tensor} as safetensors (stdlib only). Norm weights can stay F32."""
    items, header, off = [], {}, 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu")
        t = t.to(torch.float32 if keep_f32(name) else dtype).contiguous()
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _DT[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + n]}
        items.append(t)
        off += n
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for t in items:
            f.write(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, m in header.items():
        if name == "__metadata__":
            continue
        a, b = m["data_offsets"]
        dt = _TD[m["dtype"]]
        buf = bytearray(data[a:b])
        t = torch.frombuffer(buf, dtype=dt) if b > a else torch.empty(0, dtype=dt)
        out[name] = t.reshape(m["shape"]).clone()
    return out


def save_hf(folder, model, config):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    save_safetensors(os.path.join(folder, "model.safetensors"), model.state_dict(),
                     keep_f32=lambda n: n.endswith("norm.weight"))


def load_hf(folder, cls):
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    m = cls(c)
    sd = {k: v.float() for k, v in load_safetensors(os.path.join(folder, "model.safetensors")).items()}
    m.load_state_dict(sd)
    return m


# ------------------------------------------------------------------ data

def load_tokens(path):
    """uint16 little-endian token ids (xz) -> int64 tensor."""
    with lzma.open(path, "rb") as f:
        b = bytearray(f.read())
    return (torch.frombuffer(b, dtype=torch.int16).to(torch.int64) & 0xFFFF)
