package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"

	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/hashicorp/go-multierror"
)

// DFlash block-diffusion drafts (HF DFlashDraftModel / DFlash2DraftModel,
// dflash spec §1, §2, §5.1): a stack of Qwen3 layers plus fc (concatenated
// target features → hidden) and hidden_norm; no embedding and no head (both
// are the target's). Norms are plain Qwen3 norms: nothing is added, nothing
// is reordered.
//
// Three GGUF dialects are met in the wild and all three are described here:
//
//   - "dflash" (upstream llama.cpp, spec §2.3): what users download and what
//     mk and convert write. Capture layers are stored as dflash.target_layers
//     = HF target_layer_ids + 1 (the layer whose input is captured); the mask
//     token is tokenizer.ggml.mask_token_id; tensors fc.weight and
//     enc.output_norm.weight; the target's full tokenizer is in the file.
//   - the pre-merge branch of the same arch ("dflash-premerge"): keys
//     dflash.target_layer_ids (already +1) and dflash.mask_token_id, tensor
//     hidden_norm.weight. Upstream refuses these files; inspect reads them.
//   - Lucebox (spec §2.1/2.2), arch dflash-draft or qwen35-dflash-draft: keys
//     under <arch>.dflash.*, layer ids NOT shifted, tensors dflash.fc.weight
//     and dflash.hidden_norm.weight. mk still writes it on request (mk
//     dflash-draft) for tests of readers.
const (
	draftArch     = "dflash"
	luceboxArch   = "dflash-draft"
	luceboxArch35 = "qwen35-dflash-draft"
)

// Dialect names, as hparams.Dialect and native/engine's DraftInfo spell them.
const (
	dialectUpstream  = "dflash"
	dialectPremerge  = "dflash-premerge"
	dialectLucebox   = "lucebox"
	defaultBlockSize = 16
)

// dflash2Params are the DFlash2 extras (spec §5.1): a grouped dynamic causal
// convolution around every sublayer and a candidate selector. Zero Kernel
// means a plain DFlash v1 draft.
type dflash2Params struct {
	Kernel       int // conv_kernel_size
	Group        int // conv_group_size: channels per group
	SelectorRank int
	SelectorTopK int
}

func init() {
	defaults := hparams{
		Layers: 2, Hidden: 128, Heads: 4, KVHeads: 2, HeadDim: 32, FFN: 256,
		Context: 4096, RMSEps: 1e-6, RopeTheta: 1e7, BlockSize: defaultBlockSize, MaskTokenID: -1,
	}
	up := defaults
	up.Dialect = dialectUpstream
	register(&layout{
		arch:     draftArch,
		defaults: up,
		validate: validateDraft,
		keys:     upstreamKeys,
		tensors:  draftTensors,
		fromGGUF: upstreamFromGGUF,
		fromHF:   draftFromHF,
	})
	for _, arch := range []string{luceboxArch, luceboxArch35} {
		lb := defaults
		lb.Dialect = dialectLucebox
		register(&layout{
			arch:     arch,
			defaults: lb,
			validate: validateDraft,
			keys:     func(hp hparams) []kv { return luceboxKeys(arch, hp) },
			tensors:  draftTensors,
			fromGGUF: func(f *gguf.File) (hparams, error) { return luceboxFromGGUF(arch, f) },
			fromHF:   draftFromHF,
		})
	}
}

// isDraftArch says whether arch is one of the draft layouts above.
func isDraftArch(arch string) bool {
	return arch == draftArch || arch == luceboxArch || arch == luceboxArch35
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
	// Upstream sizes fc's input as n_target_layers · n_embd of the draft, so
	// a draft whose target is wider or narrower cannot be written in it.
	if hp.Dialect != dialectLucebox && hp.TargetHidden != hp.Hidden {
		errs = multierror.Append(errs, fmt.Errorf("target hidden size %d differs from the draft's %d (the dflash format needs them equal)", hp.TargetHidden, hp.Hidden))
	}
	if hp.SlidingWindow > 0 && len(hp.SlidingLayers) != hp.Layers {
		errs = multierror.Append(errs, fmt.Errorf("sliding-window pattern has %d entries for %d layers", len(hp.SlidingLayers), hp.Layers))
	}
	if d := hp.D2; d.Kernel != 0 {
		if hp.Dialect == dialectLucebox {
			errs = multierror.Append(errs, fmt.Errorf("DFlash2 drafts are written in the dflash format only"))
		}
		if e := positive("conv kernel", d.Kernel, "conv group", d.Group, "selector rank", d.SelectorRank, "selector top-k", d.SelectorTopK); e != nil {
			errs = multierror.Append(errs, e)
		} else {
			if hp.Hidden%d.Group != 0 {
				errs = multierror.Append(errs, fmt.Errorf("hidden size %d is not a multiple of the conv group size %d", hp.Hidden, d.Group))
			}
			// llama.cpp lays the selector lattice (top-k ids, then top-k × top-k
			// scores) out in one hidden-sized row.
			if hp.Hidden < d.SelectorTopK*(d.SelectorTopK+1) {
				errs = multierror.Append(errs, fmt.Errorf("hidden size %d is too small for selector top-k %d (needs k·(k+1) = %d)", hp.Hidden, d.SelectorTopK, d.SelectorTopK*(d.SelectorTopK+1)))
			}
		}
	}
	return errs.ErrorOrNil()
}

// shiftedIDs are HF target_layer_ids + 1: upstream names the layer whose
// input is captured, which is the previous layer's output.
func shiftedIDs(ids []int32) []int32 {
	out := make([]int32, len(ids))
	for i, id := range ids {
		out[i] = id + 1
	}
	return out
}

func slidingKeys(p string, hp hparams) []kv {
	if hp.SlidingWindow <= 0 {
		return nil
	}
	return []kv{
		{p + "attention.sliding_window", u32(hp.SlidingWindow)},
		{p + "attention.sliding_window_pattern", append([]bool(nil), hp.SlidingLayers...)},
	}
}

// upstreamKeys are the keys llama.cpp's converter writes for a dflash draft.
// The mask token is a tokenizer key (it wins over one in the tokenizer
// metadata; see modelFile.write).
func upstreamKeys(hp hparams) []kv {
	p := draftArch + "."
	keys := commonKeys(draftArch, hp)
	keys = append(keys,
		kv{p + "vocab_size", u32(hp.Vocab)},
		kv{p + "block_size", u32(hp.BlockSize)},
		kv{p + "target_layers", shiftedIDs(hp.TargetLayerIDs)},
	)
	if d := hp.D2; d.Kernel != 0 {
		keys = append(keys,
			kv{p + "conv_kernel_size", u32(d.Kernel)},
			kv{p + "conv_group_size", u32(d.Group)},
			kv{p + "selector_rank", u32(d.SelectorRank)},
			kv{p + "selector_top_k", u32(d.SelectorTopK)},
		)
	}
	keys = append(keys, slidingKeys(p, hp)...)
	if hp.NonCausal {
		keys = append(keys, kv{p + "attention.causal", false})
	}
	return append(keys, kv{"tokenizer.ggml.mask_token_id", u32(hp.MaskTokenID)})
}

func luceboxKeys(arch string, hp hparams) []kv {
	p := arch + "."
	keys := commonKeys(arch, hp)
	keys = append(keys,
		kv{p + "vocab_size", u32(hp.Vocab)},
		kv{p + "dflash.block_size", u32(hp.BlockSize)},
		kv{p + "dflash.mask_token_id", u32(hp.MaskTokenID)},
		kv{p + "dflash.n_target_layers", u32(len(hp.TargetLayerIDs))},
		kv{p + "dflash.target_layer_ids", append([]int32(nil), hp.TargetLayerIDs...)},
		kv{p + "dflash.n_target_features", u32(len(hp.TargetLayerIDs) * hp.TargetHidden)},
	)
	return append(keys, slidingKeys(p, hp)...)
}

// draftNames are the dialect's names of fc and hidden_norm.
func draftNames(dialect string) (fc, hiddenNorm string) {
	switch dialect {
	case dialectLucebox:
		return "dflash.fc.weight", "dflash.hidden_norm.weight"
	case dialectPremerge:
		return "fc.weight", "hidden_norm.weight"
	}
	return "fc.weight", "enc.output_norm.weight"
}

func draftTensors(hp hparams) []tensorPlan {
	H, F, hd := hp.Hidden, hp.FFN, hp.HeadDim
	q, kvw := hp.Heads*hd, hp.KVHeads*hd
	feat := len(hp.TargetLayerIDs) * hp.TargetHidden
	fc, hn := draftNames(hp.Dialect)
	ps := []tensorPlan{
		{Name: fc, Dims: dims(feat, H), HF: hfRule{Name: "fc.weight", Shape: torch(H, feat)}},
		{Name: hn, Dims: dims(H), Init: initNorm, HF: hfRule{Name: "hidden_norm.weight", Shape: torch(H)}},
		{Name: "output_norm.weight", Dims: dims(H), Init: initNorm, HF: hfRule{Name: "norm.weight", Shape: torch(H)}},
	}
	d := hp.D2
	if d.Kernel != 0 {
		// Codebooks are gathered by row (token id), the hidden projection is
		// a matmul; HF [vocab, rank] is ggml [rank, vocab].
		r, V := d.SelectorRank, hp.Vocab
		ps = append(ps,
			tensorPlan{Name: "selector_predecessor.weight", Dims: dims(r, V), HF: hfRule{Name: "candidate_selector.predecessor_codebook", Shape: torch(V, r)}},
			tensorPlan{Name: "selector_successor.weight", Dims: dims(r, V), HF: hfRule{Name: "candidate_selector.successor_codebook", Shape: torch(V, r)}},
			tensorPlan{Name: "selector_hidden.weight", Dims: dims(H, r), HF: hfRule{Name: "candidate_selector.hidden_projection.weight", Shape: torch(r, H)}},
		)
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
		if d.Kernel != 0 {
			// base [2 (prepare, finish), Kc, H] in torch; llama.cpp multiplies
			// it element-wise (no .weight suffix), so it stays F32.
			proj := 2 * d.Kernel * (H / d.Group)
			for _, m := range []struct{ gg, hf string }{{"attn", "attention_conv"}, {"ffn", "mlp_conv"}} {
				ps = append(ps,
					tensorPlan{Name: blk(m.gg + "_conv_base"), Dims: dims(H, d.Kernel, 2), Init: initSmall, F32: true, HF: hf(m.hf+".base_kernel", 2, d.Kernel, H)},
					tensorPlan{Name: blk(m.gg + "_conv_proj.weight"), Dims: dims(H, proj), HF: hf(m.hf+".kernel_projection.weight", proj, H)},
				)
			}
		}
	}
	return ps
}

// slidingFromGGUF reads a sliding window and its per-layer pattern.
func slidingFromGGUF(f *gguf.File, p string, hp *hparams) {
	if v, err := f.Uint32(p + "attention.sliding_window"); err == nil && v > 0 {
		hp.SlidingWindow = int(v)
		if pat, ok := f.Meta(p + "attention.sliding_window_pattern"); ok {
			hp.SlidingLayers, _ = pat.([]bool)
		}
	}
}

// upstreamFromGGUF reads an upstream or pre-merge "dflash" file.
func upstreamFromGGUF(f *gguf.File) (hparams, error) {
	hp, err := commonFromGGUF(f)
	var errs *multierror.Error
	errs = multierror.Append(errs, err)
	p := draftArch + "."
	hp.Tied = true
	hp.Dialect = dialectUpstream
	var stored []int32
	if ids, err := f.Int32s(p + "target_layers"); err == nil {
		stored = ids
	} else if ids, err2 := f.Int32s(p + "target_layer_ids"); err2 == nil {
		stored, hp.Dialect = ids, dialectPremerge
	} else {
		errs = multierror.Append(errs, err)
	}
	if _, ok := f.Tensor("hidden_norm.weight"); ok {
		hp.Dialect = dialectPremerge
	}
	for _, id := range stored {
		hp.TargetLayerIDs = append(hp.TargetLayerIDs, id-1)
	}
	hp.TargetHidden = hp.Hidden
	if t, ok := f.Tensor("fc.weight"); ok && len(stored) > 0 && len(t.Dims) == 2 {
		hp.TargetHidden = int(t.Dims[0]) / len(stored)
	}
	hp.BlockSize = defaultBlockSize
	if v, err := f.Uint32(p + "block_size"); err == nil {
		hp.BlockSize = int(v)
	}
	hp.MaskTokenID = 0 // files without one still pass the layout check
	if v, err := f.Uint32("tokenizer.ggml.mask_token_id"); err == nil {
		hp.MaskTokenID = int(v)
	} else if v, err := f.Uint32(p + "mask_token_id"); err == nil {
		hp.MaskTokenID = int(v)
	}
	slidingFromGGUF(f, p, &hp)
	if b, err := f.Bool(p + "attention.causal"); err == nil && !b {
		hp.NonCausal = true
	}
	if v, err := f.Uint32(p + "conv_kernel_size"); err == nil && v > 0 {
		hp.D2.Kernel = int(v)
		get := func(key string, dst *int) {
			v, err := f.Uint32(p + key)
			if err != nil {
				errs = multierror.Append(errs, fmt.Errorf("DFlash2 draft: %w", err))
			}
			*dst = int(v)
		}
		get("conv_group_size", &hp.D2.Group)
		get("selector_rank", &hp.D2.SelectorRank)
		get("selector_top_k", &hp.D2.SelectorTopK)
	}
	return hp, errs.ErrorOrNil()
}

// luceboxFromGGUF reads a Lucebox-dialect file of architecture arch.
func luceboxFromGGUF(arch string, f *gguf.File) (hparams, error) {
	hp, err := commonFromGGUF(f)
	var errs *multierror.Error
	errs = multierror.Append(errs, err)
	p := arch + "."
	hp.Tied = true
	hp.Dialect = dialectLucebox
	if ids, err := f.Int32s(p + "dflash.target_layer_ids"); err == nil {
		hp.TargetLayerIDs = ids
	} else if n, err2 := f.Uint32(p + "dflash.n_target_layers"); err2 == nil {
		hp.TargetLayerIDs = make([]int32, n) // placed by the target's depth, which the file does not know
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
	slidingFromGGUF(f, p, &hp)
	return hp, errs.ErrorOrNil()
}

// draftFromHF reads a DFlashDraftModel / DFlash2DraftModel config.json
// (dflash spec §1.8, §5.1). Layer ids stay as HF numbers them; the layout's
// keys shift them for the upstream format.
func draftFromHF(c hfConfig) (hparams, error) {
	var errs *multierror.Error
	hp := qwen3HParams(c, 32768, &errs)
	hp.Tied = true // no head of its own: the target's is used
	hp.Dialect = dialectUpstream
	hp.TargetHidden = c.intOr("target_hidden_size", hp.Hidden)

	var dc struct {
		TargetLayerIDs []int32 `json:"target_layer_ids"`
		MaskTokenID    *int    `json:"mask_token_id"`
		BlockSize      int     `json:"block_size"`
		ConvKernel     int     `json:"conv_kernel_size"`
		ConvGroup      int     `json:"conv_group_size"`
		SelectorRank   int     `json:"selector_rank"`
		SelectorTopK   int     `json:"selector_top_k"`
		Causal         *bool   `json:"causal"`
	}
	if raw, ok := c.raw("dflash_config"); ok {
		if err := json.Unmarshal(raw, &dc); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("config.json: dflash_config: %w", err))
		}
	}
	hp.BlockSize = dc.BlockSize
	if hp.BlockSize == 0 {
		hp.BlockSize = c.intOr("block_size", defaultBlockSize)
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
	if dc.ConvKernel > 0 {
		hp.D2 = dflash2Params{Kernel: dc.ConvKernel, Group: dc.ConvGroup, SelectorRank: dc.SelectorRank, SelectorTopK: dc.SelectorTopK}
	}
	causal := c.boolOr("is_causal", true)
	if dc.Causal != nil {
		causal = *dc.Causal
	}
	// Non-causal blocks with sliding windows are DFlash2's (§1.2); the v1
	// reference never sets it, and the engine has no such path for v1.
	if !causal && hp.D2.Kernel == 0 {
		errs = multierror.Append(errs, fmt.Errorf("config.json: is_causal = false without DFlash2 conv/selector settings is not supported"))
	}
	hp.NonCausal = !causal
	return hp, errs.ErrorOrNil()
}

var dialectNames = map[string]string{
	dialectUpstream: "dflash (upstream llama.cpp)",
	dialectPremerge: "dflash-premerge (llama.cpp pre-merge branch; upstream refuses it)",
	dialectLucebox:  "lucebox (unshifted layer ids)",
}

// describeDraft prints what a draft file means whatever its dialect: the
// capture layers in one numbering (0-based target layers whose output feeds
// fc), the feature width, block size and mask token.
func describeDraft(out io.Writer, f *gguf.File) {
	l := layouts[f.Arch()]
	hp, _ := l.fromGGUF(f) // problems are reported by the layout check
	p := func(format string, a ...any) { fmt.Fprintf(out, format, a...) }
	p("\ndraft:         dialect %s\n", dialectNames[hp.Dialect])
	if hp.Dialect == dialectLucebox {
		if _, err := f.Int32s(f.Arch() + ".dflash.target_layer_ids"); err != nil {
			p("  capture   %d target layers, not listed: round(1 + i·(L−4)/(N−1)) of the target's depth L\n", len(hp.TargetLayerIDs))
		} else {
			p("  capture   target layers %v (0-based, each layer's output after the FFN residual; stored as is)\n", hp.TargetLayerIDs)
		}
	} else {
		p("  capture   target layers %v (0-based, each layer's output after the FFN residual; stored + 1)\n", hp.TargetLayerIDs)
	}
	n := len(hp.TargetLayerIDs)
	p("  features  %d × %d = %d → fc → hidden %d\n", n, hp.TargetHidden, n*hp.TargetHidden, hp.Hidden)
	p("  block     %d tokens, mask token %d\n", hp.BlockSize, hp.MaskTokenID)
	if d := hp.D2; d.Kernel != 0 {
		p("  DFlash2   conv kernel %d, group %d; selector rank %d, top-k %d\n", d.Kernel, d.Group, d.SelectorRank, d.SelectorTopK)
	}
	if hp.NonCausal {
		p("  attention non-causal\n")
	}
}
