package main

import (
	"fmt"

	"github.com/hashicorp/go-multierror"
)

// qwen3: dense Qwen3 (HF model_type "qwen3"); see qwen-targets spec §2.3/2.4.
// GGUF Q/K weights are not permuted (NeoX RoPE) and norms are stored as
// they are, so the conversion is a pure renaming.
func init() {
	register(&layout{
		arch: "qwen3",
		defaults: hparams{
			Layers: 2, Hidden: 128, Heads: 4, KVHeads: 2, HeadDim: 32, FFN: 256,
			Context: 4096, RMSEps: 1e-6, RopeTheta: 1e6,
		},
		validate: validateQwen3,
		keys:     func(hp hparams) []kv { return commonKeys("qwen3", hp) },
		tensors:  qwen3Tensors,
		fromGGUF: commonFromGGUF,
		fromHF:   qwen3FromHF,
	})
}

func validateQwen3(hp hparams) error {
	err := positive("layers", hp.Layers, "hidden", hp.Hidden, "heads", hp.Heads, "kv-heads", hp.KVHeads,
		"head-dim", hp.HeadDim, "ffn", hp.FFN, "vocab", hp.Vocab, "context", hp.Context)
	if err != nil {
		return err
	}
	if hp.Heads%hp.KVHeads != 0 {
		return fmt.Errorf("heads (%d) must be a multiple of kv-heads (%d)", hp.Heads, hp.KVHeads)
	}
	return nil
}

// embeddingAndHead are the global tensors of llama-style layouts.
func embeddingAndHead(hp hparams, normPlusOne bool) []tensorPlan {
	H, V := hp.Hidden, hp.Vocab
	ps := []tensorPlan{
		{Name: "token_embd.weight", Dims: dims(H, V), HF: hfRule{Name: "embed_tokens.weight", Shape: torch(V, H)}},
		{Name: "output_norm.weight", Dims: dims(H), Init: initNorm, HF: hfRule{Name: "norm.weight", Shape: torch(H), PlusOne: normPlusOne}},
	}
	if !hp.Tied {
		ps = append(ps, tensorPlan{Name: "output.weight", Dims: dims(H, V), HF: hfRule{Name: "lm_head.weight", Top: true, Shape: torch(V, H)}})
	}
	return ps
}

func qwen3Tensors(hp hparams) []tensorPlan {
	H, F, hd := hp.Hidden, hp.FFN, hp.HeadDim
	q, kv := hp.Heads*hd, hp.KVHeads*hd
	ps := embeddingAndHead(hp, false)
	for i := 0; i < hp.Layers; i++ {
		blk, hf := layerNames(i)
		ps = append(ps,
			tensorPlan{Name: blk("attn_norm.weight"), Dims: dims(H), Init: initNorm, HF: hf("input_layernorm.weight", H)},
			tensorPlan{Name: blk("attn_q.weight"), Dims: dims(H, q), HF: hf("self_attn.q_proj.weight", q, H)},
			tensorPlan{Name: blk("attn_k.weight"), Dims: dims(H, kv), HF: hf("self_attn.k_proj.weight", kv, H)},
			tensorPlan{Name: blk("attn_v.weight"), Dims: dims(H, kv), HF: hf("self_attn.v_proj.weight", kv, H)},
			tensorPlan{Name: blk("attn_q_norm.weight"), Dims: dims(hd), Init: initNorm, HF: hf("self_attn.q_norm.weight", hd)},
			tensorPlan{Name: blk("attn_k_norm.weight"), Dims: dims(hd), Init: initNorm, HF: hf("self_attn.k_norm.weight", hd)},
			tensorPlan{Name: blk("attn_output.weight"), Dims: dims(q, H), HF: hf("self_attn.o_proj.weight", H, q)},
			tensorPlan{Name: blk("ffn_norm.weight"), Dims: dims(H), Init: initNorm, HF: hf("post_attention_layernorm.weight", H)},
			tensorPlan{Name: blk("ffn_gate.weight"), Dims: dims(H, F), HF: hf("mlp.gate_proj.weight", F, H)},
			tensorPlan{Name: blk("ffn_up.weight"), Dims: dims(H, F), HF: hf("mlp.up_proj.weight", F, H)},
			tensorPlan{Name: blk("ffn_down.weight"), Dims: dims(F, H), HF: hf("mlp.down_proj.weight", H, F)},
		)
	}
	return ps
}

// qwen3FromHF reads a Qwen3Config.
func qwen3FromHF(c hfConfig) (hparams, error) {
	var errs *multierror.Error
	hp := qwen3HParams(c, 40960, &errs)
	hp.Tied = c.boolOr("tie_word_embeddings", false)
	return hp, errs.ErrorOrNil()
}

// qwen3HParams reads the config keys of a stack of Qwen3 layers, which the
// Qwen3 target and the DFlash draft share; context is the default
// max_position_embeddings.
func qwen3HParams(c hfConfig, context int, errs **multierror.Error) hparams {
	hp := hparams{
		Layers:  c.int("num_hidden_layers", errs),
		Hidden:  c.int("hidden_size", errs),
		Heads:   c.int("num_attention_heads", errs),
		FFN:     c.int("intermediate_size", errs),
		Vocab:   c.int("vocab_size", errs),
		Context: c.intOr("max_position_embeddings", context),
		RMSEps:  float32(c.floatOr("rms_norm_eps", 1e-6)),
	}
	hp.KVHeads = c.intOr("num_key_value_heads", hp.Heads)
	if hp.Heads > 0 {
		hp.HeadDim = c.intOr("head_dim", hp.Hidden/hp.Heads)
	}
	hp.RopeTheta = float32(c.ropeFloat("rope_theta", 10000))
	c.plainRope(errs)
	return hp
}
