package main

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/hashicorp/go-multierror"
)

// dflash-draft: a DFlash v1 block-diffusion draft (HF DFlashDraftModel) in
// the Lucebox GGUF dialect (dflash spec §2.1/2.2). The draft is a stack of
// Qwen3 layers plus fc (concatenated target features → hidden) and
// hidden_norm; it has no embedding and no head (both are the target's).
// Norms are plain Qwen3 norms: nothing is added, nothing is reordered.
const draftArch = "dflash-draft"

func init() {
	register(&layout{
		arch: draftArch,
		defaults: hparams{
			Layers: 2, Hidden: 128, Heads: 4, KVHeads: 2, HeadDim: 32, FFN: 256,
			Context: 4096, RMSEps: 1e-6, RopeTheta: 1e7, BlockSize: 16, MaskTokenID: -1,
		},
		validate: validateDraft,
		keys:     draftKeys,
		tensors:  draftTensors,
		fromGGUF: draftFromGGUF,
		fromHF:   draftFromHF,
	})
}

// targetLayerIDs is the reference rule for drafts without an explicit list:
// round(1 + i·(L − 4)/(N − 1)) for i < N (first 1, last L − 3; N = 1 → L/2).
func targetLayerIDs(targetLayers, n int) []int32 {
	if n == 1 {
		return []int32{int32(targetLayers / 2)}
	}
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(math.Round(1 + float64(i)*float64(targetLayers-4)/float64(n-1)))
	}
	return out
}

func validateDraft(hp hparams) error {
	err := positive("layers", hp.Layers, "hidden", hp.Hidden, "heads", hp.Heads, "kv-heads", hp.KVHeads,
		"head-dim", hp.HeadDim, "ffn", hp.FFN, "vocab", hp.Vocab, "context", hp.Context,
		"target-hidden", hp.TargetHidden, "block-size", hp.BlockSize, "target layers", len(hp.TargetLayerIDs))
	if err != nil {
		return err
	}
	var errs *multierror.Error
	if hp.Heads%hp.KVHeads != 0 {
		errs = multierror.Append(errs, fmt.Errorf("heads (%d) must be a multiple of kv-heads (%d)", hp.Heads, hp.KVHeads))
	}
	if hp.MaskTokenID < 0 || hp.MaskTokenID >= hp.Vocab {
		errs = multierror.Append(errs, fmt.Errorf("mask token id %d is outside the vocabulary of %d", hp.MaskTokenID, hp.Vocab))
	}
	for _, id := range hp.TargetLayerIDs {
		if id < 0 {
			errs = multierror.Append(errs, fmt.Errorf("target layer ids %v must not be negative", hp.TargetLayerIDs))
			break
		}
	}
	if hp.SlidingWindow > 0 && len(hp.SlidingLayers) != hp.Layers {
		errs = multierror.Append(errs, fmt.Errorf("sliding-window pattern has %d entries for %d layers", len(hp.SlidingLayers), hp.Layers))
	}
	return errs.ErrorOrNil()
}

func draftKeys(hp hparams) []kv {
	p := draftArch + "."
	keys := commonKeys(draftArch, hp)
	keys = append(keys,
		kv{p + "vocab_size", u32(hp.Vocab)},
		kv{p + "dflash.block_size", u32(hp.BlockSize)},
		kv{p + "dflash.mask_token_id", u32(hp.MaskTokenID)},
		kv{p + "dflash.n_target_layers", u32(len(hp.TargetLayerIDs))},
		kv{p + "dflash.target_layer_ids", append([]int32(nil), hp.TargetLayerIDs...)},
		kv{p + "dflash.n_target_features", u32(len(hp.TargetLayerIDs) * hp.TargetHidden)},
	)
	if hp.SlidingWindow > 0 {
		keys = append(keys,
			kv{p + "attention.sliding_window", u32(hp.SlidingWindow)},
			kv{p + "attention.sliding_window_pattern", append([]bool(nil), hp.SlidingLayers...)},
		)
	}
	return keys
}

func draftTensors(hp hparams) []tensorPlan {
	H, F, hd := hp.Hidden, hp.FFN, hp.HeadDim
	q, kvw := hp.Heads*hd, hp.KVHeads*hd
	feat := len(hp.TargetLayerIDs) * hp.TargetHidden
	ps := []tensorPlan{
		{Name: "dflash.fc.weight", Dims: dims(feat, H), HF: hfRule{Name: "fc.weight", Shape: torch(H, feat)}},
		{Name: "dflash.hidden_norm.weight", Dims: dims(H), Init: initNorm, HF: hfRule{Name: "hidden_norm.weight", Shape: torch(H)}},
		{Name: "output_norm.weight", Dims: dims(H), Init: initNorm, HF: hfRule{Name: "norm.weight", Shape: torch(H)}},
	}
	for i := 0; i < hp.Layers; i++ {
		blk, hf := layerNames(i)
		ps = append(ps,
			tensorPlan{Name: blk("attn_norm.weight"), Dims: dims(H), Init: initNorm, HF: hf("input_layernorm.weight", H)},
			tensorPlan{Name: blk("ffn_norm.weight"), Dims: dims(H), Init: initNorm, HF: hf("post_attention_layernorm.weight", H)},
			tensorPlan{Name: blk("attn_q.weight"), Dims: dims(H, q), HF: hf("self_attn.q_proj.weight", q, H)},
			tensorPlan{Name: blk("attn_k.weight"), Dims: dims(H, kvw), HF: hf("self_attn.k_proj.weight", kvw, H)},
			tensorPlan{Name: blk("attn_v.weight"), Dims: dims(H, kvw), HF: hf("self_attn.v_proj.weight", kvw, H)},
			tensorPlan{Name: blk("attn_output.weight"), Dims: dims(q, H), HF: hf("self_attn.o_proj.weight", H, q)},
			tensorPlan{Name: blk("attn_q_norm.weight"), Dims: dims(hd), Init: initNorm, HF: hf("self_attn.q_norm.weight", hd)},
			tensorPlan{Name: blk("attn_k_norm.weight"), Dims: dims(hd), Init: initNorm, HF: hf("self_attn.k_norm.weight", hd)},
			tensorPlan{Name: blk("ffn_gate.weight"), Dims: dims(H, F), HF: hf("mlp.gate_proj.weight", F, H)},
			tensorPlan{Name: blk("ffn_up.weight"), Dims: dims(H, F), HF: hf("mlp.up_proj.weight", F, H)},
			tensorPlan{Name: blk("ffn_down.weight"), Dims: dims(F, H), HF: hf("mlp.down_proj.weight", H, F)},
		)
	}
	return ps
}

func draftFromGGUF(f *gguf.File) (hparams, error) {
	hp, err := commonFromGGUF(f)
	var errs *multierror.Error
	errs = multierror.Append(errs, err)
	p := draftArch + "."
	hp.Tied = true
	if ids, err := f.Int32s(p + "dflash.target_layer_ids"); err == nil {
		hp.TargetLayerIDs = ids
	} else if n, err2 := f.Uint32(p + "dflash.n_target_layers"); err2 == nil {
		hp.TargetLayerIDs = make([]int32, n)
	} else {
		errs = multierror.Append(errs, err)
	}
	if feat, err := f.Uint32(p + "dflash.n_target_features"); err == nil && len(hp.TargetLayerIDs) > 0 {
		hp.TargetHidden = int(feat) / len(hp.TargetLayerIDs)
	} else {
		hp.TargetHidden = hp.Hidden
	}
	if v, err := f.Uint32(p + "dflash.block_size"); err == nil {
		hp.BlockSize = int(v)
	} else {
		errs = multierror.Append(errs, err)
	}
	hp.MaskTokenID = 0
	if v, err := f.Uint32(p + "dflash.mask_token_id"); err == nil {
		hp.MaskTokenID = int(v)
	}
	if v, err := f.Uint32(p + "attention.sliding_window"); err == nil {
		hp.SlidingWindow = int(v)
		if pat, ok := f.Meta(p + "attention.sliding_window_pattern"); ok {
			hp.SlidingLayers, _ = pat.([]bool)
		}
	}
	return hp, errs.ErrorOrNil()
}

// draftFromHF reads a DFlashDraftModel config.json (dflash spec §1.8).
func draftFromHF(c hfConfig) (hparams, error) {
	var errs *multierror.Error
	hp := qwen3HParams(c, 32768, &errs)
	hp.Tied = true // no head of its own: the target's is used
	hp.TargetHidden = c.intOr("target_hidden_size", hp.Hidden)

	var dc struct {
		TargetLayerIDs []int32 `json:"target_layer_ids"`
		MaskTokenID    *int    `json:"mask_token_id"`
		BlockSize      int     `json:"block_size"`
	}
	if raw, ok := c.raw("dflash_config"); ok {
		if err := json.Unmarshal(raw, &dc); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("config.json: dflash_config: %w", err))
		}
	}
	hp.BlockSize = dc.BlockSize
	if hp.BlockSize == 0 {
		hp.BlockSize = c.intOr("block_size", 16)
	}
	hp.TargetLayerIDs = dc.TargetLayerIDs
	if hp.TargetLayerIDs == nil {
		n := c.intOr("num_target_layers", 0)
		depth := c.intOr("target_num_hidden_layers", 0)
		if n == 0 || depth == 0 {
			errs = multierror.Append(errs, fmt.Errorf("config.json: no dflash_config.target_layer_ids (and no num_target_layers with target_num_hidden_layers to derive them)"))
		} else {
			hp.TargetLayerIDs = targetLayerIDs(depth, n)
		}
	}
	if dc.MaskTokenID != nil {
		hp.MaskTokenID = *dc.MaskTokenID
	} else if id := c.intOr("mask_token_id", -1); id >= 0 {
		hp.MaskTokenID = id
	} else {
		errs = multierror.Append(errs, fmt.Errorf("config.json: no dflash_config.mask_token_id"))
	}
	if types := c.strings("layer_types"); types != nil {
		if len(types) != hp.Layers {
			errs = multierror.Append(errs, fmt.Errorf("config.json: layer_types has %d entries for %d layers", len(types), hp.Layers))
		}
		sliding := false
		for _, t := range types {
			hp.SlidingLayers = append(hp.SlidingLayers, t == "sliding_attention")
			sliding = sliding || t == "sliding_attention"
		}
		if sliding {
			hp.SlidingWindow = c.intOr("sliding_window", 0)
			if hp.SlidingWindow <= 0 {
				errs = multierror.Append(errs, fmt.Errorf("config.json: sliding_attention layers but no sliding_window"))
			}
		} else {
			hp.SlidingLayers = nil
		}
	}
	if !c.boolOr("is_causal", true) {
		errs = multierror.Append(errs, fmt.Errorf("config.json: is_causal = false (DFlash2-style bidirectional windows) is not supported"))
	}
	return hp, errs.ErrorOrNil()
}
