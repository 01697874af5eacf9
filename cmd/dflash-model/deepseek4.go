package main

import (
	"encoding/json"
	"fmt"

	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/hashicorp/go-multierror"
)

// deepseek4: DeepSeek V4 (Flash) — HF model_type "deepseek_v4"; deepseek4
// spec §5 (keys, tensors) and §11 (HF names). Shared-KV MQA with a query
// LoRA, grouped low-rank output, per-head sinks, CSA/HCA compressors with a
// lightning indexer on CSA layers, hyper-connections (HC streams) around
// every sub-block and an all-MoE FFN (hash-routed first layers).
//
// convert reads checkpoints as transformers 5.17 saves them: its
// save_pretrained reverses the in-memory renaming, so the files carry the
// official DeepSeek names under "model." (head.weight at the top,
// model.embed_tokens, model.hc_head.hc_fn, layers.N.attn.wq_a, ffn.experts.E.w1,
// ...). The official hub layout (no "model." prefix; embed.weight,
// hc_head_fn) is read too, when its tensors are floats; its FP8/FP4 tensors
// are refused. transformers' in-memory names (self_attn.q_a_proj, fused
// mlp.experts.gate_up_proj) never reach a file and are not read.
//
// Conversion is a renaming plus two reshapes: the per-expert matrices
// (w1 gate, w3 up, w2 down) are stacked into ffn_{gate,up,down}_exps
// (ggml [D, F, E] / [F, D, E]: expert e's rows follow expert e−1's), and
// tid2eid (int64 [vocab, k]) becomes an I32 table. Norms are plain w·x̂
// (nothing added).
const ds4Arch = "deepseek4"

// ds4 layer kinds.
const (
	ds4Sliding = iota // window only
	ds4CSA            // compressed sparse attention: ratio 4, overlapping windows, indexer
	ds4HCA            // heavily compressed attention: large ratio, no indexer
)

// ds4Params are the DeepSeek V4 shape parameters beyond hparams' common
// ones (Hidden, Heads, KVHeads, HeadDim, RopeDims, Vocab, Layers, ...).
type ds4Params struct {
	QLora, OGroups, OLora             int
	Experts, ExpertsUsed, Shared, FFN int
	HashLayers                        int
	Window                            int
	IndexHeads, IndexHeadDim, TopK    int
	HC, Sinkhorn                      int
	HCEps, SwigluLimit, RoutedScale   float32
	CompressTheta                     float32
	YarnFactor, BetaFast, BetaSlow    float32
	YarnOrigCtx                       int
	Kinds                             []int // per layer: ds4Sliding, ds4CSA or ds4HCA
	CSARatio, HCARatio                int
}

func (d ds4Params) ratio(kind int) int {
	switch kind {
	case ds4CSA:
		return d.CSARatio
	case ds4HCA:
		return d.HCARatio
	}
	return 0
}

// flashKinds is V4-Flash's schedule: layers 0 and 1 window only, then CSA on
// even and HCA on odd layers.
func flashKinds(n int) []int {
	k := make([]int, n)
	for i := 2; i < n; i++ {
		k[i] = ds4HCA
		if i%2 == 0 {
			k[i] = ds4CSA
		}
	}
	return k
}

func init() {
	register(&layout{
		arch: ds4Arch,
		// The tiny shape of the spec's transformers recipe (§11.3), but with
		// llama.cpp-loadable head sizes (head 128, indexer 64: multiples of
		// 64 and unequal, as in Flash; llama.cpp's Hadamard K rotation
		// asserts on smaller heads) and HCA ratio 128.
		defaults: hparams{
			Layers: 6, Hidden: 64, Heads: 4, KVHeads: 1, HeadDim: 128, RopeDims: 16,
			Context: 1048576, RMSEps: 1e-6, RopeTheta: 10000,
			DS: ds4Params{
				QLora: 32, OGroups: 2, OLora: 16, Experts: 8, ExpertsUsed: 2, Shared: 1, FFN: 32,
				HashLayers: 3, Window: 8, IndexHeads: 32, IndexHeadDim: 64, TopK: 4, HC: 4, Sinkhorn: 20,
				HCEps: 1e-6, SwigluLimit: 10, RoutedScale: 1.5, CompressTheta: 160000,
				YarnFactor: 16, BetaFast: 32, BetaSlow: 1, YarnOrigCtx: 65536,
				Kinds: flashKinds(6), CSARatio: 4, HCARatio: upstreamHCARatio,
			},
		},
		validate: validateDS4,
		keys:     ds4Keys,
		tensors:  ds4Tensors,
		fromGGUF: ds4FromGGUF,
		fromHF:   ds4FromHF,
	})
}

func validateDS4(hp hparams) error {
	d := hp.DS
	err := positive("layers", hp.Layers, "hidden", hp.Hidden, "heads", hp.Heads, "kv-heads", hp.KVHeads,
		"head-dim", hp.HeadDim, "rope dims", hp.RopeDims, "vocab", hp.Vocab, "context", hp.Context,
		"q lora rank", d.QLora, "output groups", d.OGroups, "output lora rank", d.OLora, "experts", d.Experts,
		"experts used", d.ExpertsUsed, "expert ffn", d.FFN, "sliding window", d.Window, "indexer heads", d.IndexHeads,
		"indexer head dim", d.IndexHeadDim, "indexer top-k", d.TopK, "hyper-connection streams", d.HC,
		"sinkhorn iterations", d.Sinkhorn)
	if err != nil {
		return err
	}
	var errs *multierror.Error
	if hp.KVHeads != 1 {
		errs = multierror.Append(errs, fmt.Errorf("kv-heads must be 1 (shared-KV attention), got %d", hp.KVHeads))
	}
	if (hp.Heads*hp.HeadDim)%d.OGroups != 0 {
		errs = multierror.Append(errs, fmt.Errorf("heads × head-dim (%d) must divide into %d output groups", hp.Heads*hp.HeadDim, d.OGroups))
	}
	if hp.Tied {
		errs = multierror.Append(errs, fmt.Errorf("deepseek4 cannot tie the output head: llama.cpp requires output.weight"))
	}
	if d.ExpertsUsed > d.Experts {
		errs = multierror.Append(errs, fmt.Errorf("experts used (%d) exceeds experts (%d)", d.ExpertsUsed, d.Experts))
	}
	if d.HashLayers < 0 || d.HashLayers > hp.Layers {
		errs = multierror.Append(errs, fmt.Errorf("hash-routed layers (%d) must be between 0 and the layer count %d", d.HashLayers, hp.Layers))
	}
	if len(d.Kinds) != hp.Layers {
		errs = multierror.Append(errs, fmt.Errorf("layer schedule has %d entries for %d layers", len(d.Kinds), hp.Layers))
	}
	// GGUF keeps only per-layer ratios; ratio 4 is what marks a CSA layer.
	if d.CSARatio != 4 {
		errs = multierror.Append(errs, fmt.Errorf("the CSA compression ratio must be 4, got %d", d.CSARatio))
	}
	if d.HCARatio <= 0 || d.HCARatio == 4 {
		errs = multierror.Append(errs, fmt.Errorf("the HCA compression ratio must be positive and not 4, got %d", d.HCARatio))
	}
	if hp.RopeDims%2 != 0 || hp.RopeDims > hp.HeadDim || hp.RopeDims >= d.IndexHeadDim {
		errs = multierror.Append(errs, fmt.Errorf("rope dims (%d) must be even, at most head-dim (%d) and below the indexer head dim (%d)", hp.RopeDims, hp.HeadDim, d.IndexHeadDim))
	}
	return errs.ErrorOrNil()
}

// ds4GatingSqrtSoftplus is llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SQRTSOFTPLUS,
// the only value its deepseek4 loader accepts for expert_gating_func.
const ds4GatingSqrtSoftplus = 4

// upstreamHCARatio is the only HCA compression ratio upstream llama.cpp's
// deepseek4 loader accepts (besides 0 and 4).
const upstreamHCARatio = 128

// upstreamWarning says why a file of this shape converts but will not load
// in upstream llama.cpp ("" when it will): its deepseek4 loader accepts only
// the compression ratios 0, 4 and 128, while small test checkpoints (the
// spec's transformers recipe) use 8 so that HCA windows close in short
// prompts. Our own reader takes any ratio.
func upstreamWarning(arch string, hp hparams) string {
	if arch != ds4Arch {
		return ""
	}
	if hp.HeadDim%64 != 0 || hp.DS.IndexHeadDim%64 != 0 {
		return fmt.Sprintf("head dim %d / indexer head dim %d: upstream llama.cpp's K rotation needs multiples of 64 (it asserts when creating a context)", hp.HeadDim, hp.DS.IndexHeadDim)
	}
	for _, k := range hp.DS.Kinds {
		if k == ds4HCA && hp.DS.HCARatio != upstreamHCARatio {
			return fmt.Sprintf("HCA compression ratio %d: upstream llama.cpp loads only ratios 0, 4 and %d", hp.DS.HCARatio, upstreamHCARatio)
		}
	}
	return ""
}

// ds4Keys writes the keys of upstream llama.cpp's deepseek4 architecture
// with the types its converter writes (deepseek4 spec, appendix §1). There is
// no vocab_size key: the vocabulary is token_embd's second dimension.
func ds4Keys(hp hparams) []kv {
	d := hp.DS
	p := ds4Arch + "."
	ratios := make([]int32, hp.Layers)
	clamp := make([]float32, hp.Layers)
	for i, k := range d.Kinds {
		ratios[i] = int32(d.ratio(k))
		clamp[i] = d.SwigluLimit
	}
	keys := []kv{
		{p + "block_count", u32(hp.Layers)},
		{p + "context_length", u32(hp.Context)},
		{p + "embedding_length", u32(hp.Hidden)},
		{p + "embedding_length_out", u32(d.HC * hp.Hidden)},
		{p + "attention.head_count", u32(hp.Heads)},
		{p + "attention.head_count_kv", u32(hp.KVHeads)},
		{p + "attention.key_length", u32(hp.HeadDim)},
		{p + "attention.value_length", u32(hp.HeadDim)},
		{p + "attention.layer_norm_rms_epsilon", hp.RMSEps},
		{p + "rope.dimension_count", u32(hp.RopeDims)},
		{p + "rope.freq_base", hp.RopeTheta},
	}
	// Without rope.scaling.type llama.cpp takes "linear": compressing
	// layers would get plain interpolation instead of the YaRN ramp.
	if d.YarnFactor != 0 && d.YarnFactor != 1 {
		keys = append(keys,
			kv{p + "rope.scaling.type", "yarn"},
			kv{p + "rope.scaling.factor", d.YarnFactor},
			kv{p + "rope.scaling.original_context_length", u32(d.YarnOrigCtx)},
			kv{p + "rope.scaling.yarn_beta_fast", d.BetaFast},
			kv{p + "rope.scaling.yarn_beta_slow", d.BetaSlow},
		)
	}
	return append(keys,
		kv{p + "attention.q_lora_rank", u32(d.QLora)},
		kv{p + "attention.sliding_window", u32(d.Window)},
		kv{p + "expert_count", u32(d.Experts)},
		kv{p + "expert_used_count", u32(d.ExpertsUsed)},
		kv{p + "expert_feed_forward_length", u32(d.FFN)},
		kv{p + "expert_shared_count", u32(d.Shared)},
		kv{p + "expert_weights_scale", d.RoutedScale},
		kv{p + "expert_weights_norm", true},
		kv{p + "expert_gating_func", u32(ds4GatingSqrtSoftplus)},
		kv{p + "swiglu_clamp_exp", clamp},
		kv{p + "swiglu_clamp_shexp", clamp},
		kv{p + "attention.indexer.head_count", u32(d.IndexHeads)},
		kv{p + "attention.indexer.key_length", u32(d.IndexHeadDim)},
		kv{p + "attention.indexer.top_k", u32(d.TopK)},
		kv{p + "attention.output_group_count", u32(d.OGroups)},
		kv{p + "attention.output_lora_rank", u32(d.OLora)},
		kv{p + "attention.compress_ratios", ratios},
		kv{p + "attention.compress_rope_freq_base", d.CompressTheta},
		kv{p + "hyper_connection.count", u32(d.HC)},
		kv{p + "hyper_connection.sinkhorn_iterations", u32(d.Sinkhorn)},
		kv{p + "hyper_connection.epsilon", d.HCEps},
		kv{p + "hash_layer_count", u32(d.HashLayers)},
	)
}

// expertParts names the per-expert matrices layers.i.ffn.experts.e.<w>.weight
// (w1 gate, w3 up, w2 down) whose rows, concatenated over e, make a ggml
// expert stack: output row e·n + r is expert e's row r.
func expertParts(i, experts int, w string) []string {
	out := make([]string, experts)
	for e := range out {
		out[e] = fmt.Sprintf("layers.%d.ffn.experts.%d.%s.weight", i, e, w)
	}
	return out
}

func ds4Tensors(hp hparams) []tensorPlan {
	d := hp.DS
	D, V, H, hd := hp.Hidden, hp.Vocab, hp.Heads, hp.HeadDim
	mix := (2 + d.HC) * d.HC // pre, post and comb weights of one HC site
	ps := []tensorPlan{
		{Name: "token_embd.weight", Dims: dims(D, V), HF: hfRule{Name: "embed_tokens.weight", Alt: "embed.weight", Shape: torch(V, D)}},
		{Name: "output_norm.weight", Dims: dims(D), Init: initNorm, HF: hfRule{Name: "norm.weight", Shape: torch(D)}},
		{Name: "output.weight", Dims: dims(D, V), HF: hfRule{Name: "head.weight", Top: true, Shape: torch(V, D)}},
		{Name: "output_hc_fn.weight", Dims: dims(d.HC*D, d.HC), Half: true, HF: hfRule{Name: "hc_head.hc_fn", Alt: "hc_head_fn", Shape: torch(d.HC, d.HC*D)}},
		{Name: "output_hc_base.weight", Dims: dims(d.HC), Init: initSmall, HF: hfRule{Name: "hc_head.hc_base", Alt: "hc_head_base", Shape: torch(d.HC)}},
		{Name: "output_hc_scale.weight", Dims: dims(1), Init: initNorm, HF: hfRule{Name: "hc_head.hc_scale", Alt: "hc_head_scale", Shape: torch(1)}},
	}
	for i := 0; i < hp.Layers; i++ {
		blk, hf := layerNames(i)
		for _, site := range []string{"attn", "ffn"} {
			hc := "hc_" + site + "_"
			ps = append(ps,
				tensorPlan{Name: blk(hc + "fn.weight"), Dims: dims(d.HC*D, mix), Half: true, HF: hf(hc+"fn", mix, d.HC*D)},
				tensorPlan{Name: blk(hc + "base.weight"), Dims: dims(mix), Init: initSmall, HF: hf(hc+"base", mix)},
				tensorPlan{Name: blk(hc + "scale.weight"), Dims: dims(3), Init: initNorm, HF: hf(hc+"scale", 3)},
			)
		}
		og := H * hd / d.OGroups
		ps = append(ps,
			tensorPlan{Name: blk("attn_norm.weight"), Dims: dims(D), Init: initNorm, HF: hf("attn_norm.weight", D)},
			tensorPlan{Name: blk("attn_q_a.weight"), Dims: dims(D, d.QLora), HF: hf("attn.wq_a.weight", d.QLora, D)},
			tensorPlan{Name: blk("attn_q_a_norm.weight"), Dims: dims(d.QLora), Init: initNorm, HF: hf("attn.q_norm.weight", d.QLora)},
			tensorPlan{Name: blk("attn_q_b.weight"), Dims: dims(d.QLora, H*hd), HF: hf("attn.wq_b.weight", H*hd, d.QLora)},
			tensorPlan{Name: blk("attn_kv.weight"), Dims: dims(D, hd), HF: hf("attn.wkv.weight", hd, D)},
			tensorPlan{Name: blk("attn_kv_a_norm.weight"), Dims: dims(hd), Init: initNorm, HF: hf("attn.norm.weight", hd)},
			tensorPlan{Name: blk("attn_sinks.weight"), Dims: dims(H), Init: initSmall, HF: hf("attn.attn_sink", H)},
			tensorPlan{Name: blk("attn_output_a.weight"), Dims: dims(og, d.OGroups*d.OLora), HF: hf("attn.wo_a.weight", d.OGroups*d.OLora, og)},
			tensorPlan{Name: blk("attn_output_b.weight"), Dims: dims(d.OGroups*d.OLora, D), HF: hf("attn.wo_b.weight", D, d.OGroups*d.OLora)},
		)
		kind := d.Kinds[i]
		if kind != ds4Sliding {
			r := d.ratio(kind)
			cw := hd // HCA: one series; CSA: two overlapping series
			if kind == ds4CSA {
				cw = 2 * hd
			}
			ps = append(ps,
				tensorPlan{Name: blk("attn_compressor_ape.weight"), Dims: dims(cw, r), Init: initSmall, Half: true, HF: hf("attn.compressor.ape", r, cw)},
				tensorPlan{Name: blk("attn_compressor_kv.weight"), Dims: dims(D, cw), Half: true, HF: hf("attn.compressor.wkv.weight", cw, D)},
				tensorPlan{Name: blk("attn_compressor_gate.weight"), Dims: dims(D, cw), Half: true, HF: hf("attn.compressor.wgate.weight", cw, D)},
				tensorPlan{Name: blk("attn_compressor_norm.weight"), Dims: dims(hd), Init: initNorm, HF: hf("attn.compressor.norm.weight", hd)},
			)
		}
		if kind == ds4CSA {
			ih, ihd := d.IndexHeads, d.IndexHeadDim
			const ix = "attn.indexer."
			ps = append(ps,
				tensorPlan{Name: blk("indexer.attn_q_b.weight"), Dims: dims(d.QLora, ih*ihd), Half: true, HF: hf(ix+"wq_b.weight", ih*ihd, d.QLora)},
				tensorPlan{Name: blk("indexer.proj.weight"), Dims: dims(D, ih), Half: true, HF: hf(ix+"weights_proj.weight", ih, D)},
				tensorPlan{Name: blk("indexer_compressor_ape.weight"), Dims: dims(2*ihd, d.CSARatio), Init: initSmall, Half: true, HF: hf(ix+"compressor.ape", d.CSARatio, 2*ihd)},
				tensorPlan{Name: blk("indexer_compressor_kv.weight"), Dims: dims(D, 2*ihd), Half: true, HF: hf(ix+"compressor.wkv.weight", 2*ihd, D)},
				tensorPlan{Name: blk("indexer_compressor_gate.weight"), Dims: dims(D, 2*ihd), Half: true, HF: hf(ix+"compressor.wgate.weight", 2*ihd, D)},
				tensorPlan{Name: blk("indexer_compressor_norm.weight"), Dims: dims(ihd), Init: initNorm, HF: hf(ix+"compressor.norm.weight", ihd)},
			)
		}
		E, F := d.Experts, d.FFN
		SF := F * max(d.Shared, 1) // llama.cpp: the shared experts are one MLP n_shared times as wide
		experts := func(w string, shape ...int) hfRule {
			return hfRule{Parts: expertParts(i, E, w), Shape: torch(shape...)}
		}
		ps = append(ps,
			tensorPlan{Name: blk("ffn_norm.weight"), Dims: dims(D), Init: initNorm, HF: hf("ffn_norm.weight", D)},
			tensorPlan{Name: blk("ffn_gate_inp.weight"), Dims: dims(D, E), F32: true, HF: hf("ffn.gate.weight", E, D)},
		)
		if i < d.HashLayers {
			ps = append(ps, tensorPlan{Name: blk("ffn_gate_tid2eid.weight"), Dims: dims(d.ExpertsUsed, V), I32: true,
				Init: initExpertIDs, IDs: E, HF: hf("ffn.gate.tid2eid", V, d.ExpertsUsed)})
		} else {
			ps = append(ps, tensorPlan{Name: blk("exp_probs_b.bias"), Dims: dims(E), Init: initSmall, HF: hf("ffn.gate.bias", E)})
		}
		ps = append(ps,
			tensorPlan{Name: blk("ffn_gate_exps.weight"), Dims: dims(D, F, E), HF: experts("w1", F, D)},
			tensorPlan{Name: blk("ffn_up_exps.weight"), Dims: dims(D, F, E), HF: experts("w3", F, D)},
			tensorPlan{Name: blk("ffn_down_exps.weight"), Dims: dims(F, D, E), HF: experts("w2", D, F)},
			tensorPlan{Name: blk("ffn_gate_shexp.weight"), Dims: dims(D, SF), HF: hf("ffn.shared_experts.w1.weight", SF, D)},
			tensorPlan{Name: blk("ffn_up_shexp.weight"), Dims: dims(D, SF), HF: hf("ffn.shared_experts.w3.weight", SF, D)},
			tensorPlan{Name: blk("ffn_down_shexp.weight"), Dims: dims(SF, D), HF: hf("ffn.shared_experts.w2.weight", D, SF)},
		)
	}
	return ps
}

// ds4FromGGUF reads upstream llama.cpp's deepseek4 keys (deepseek4 spec,
// appendix §1). The vocabulary comes from token_embd (upstream writes no
// vocab_size key); block_count counts MTP layers, so the trunk is
// block_count − nextn_predict_layers, and compress_ratios may be longer than
// the trunk (upstream's converter adds the MTP layer's entry). Older
// dflash-model files (vocab_size key, scalar swiglu_clamp_exp, no
// expert_gating_func, HCA ratio 8) are still read.
func ds4FromGGUF(f *gguf.File) (hparams, error) {
	var errs *multierror.Error
	p := ds4Arch + "."
	geti := func(key string) int {
		v, err := f.Uint32(p + key)
		errs = multierror.Append(errs, err)
		return int(v)
	}
	getiOr := func(key string, def int) int {
		if _, ok := f.Meta(p + key); !ok {
			return def
		}
		return geti(key)
	}
	getf := func(key string, def float32) float32 {
		if _, ok := f.Meta(p + key); !ok {
			return def
		}
		v, err := f.Float32(p + key)
		errs = multierror.Append(errs, err)
		return v
	}
	hp := hparams{
		Layers: geti("block_count"), Hidden: geti("embedding_length"),
		Heads: geti("attention.head_count"), KVHeads: getiOr("attention.head_count_kv", 1),
		Context: getiOr("context_length", 1),
		RMSEps:  getf("attention.layer_norm_rms_epsilon", 1e-6), RopeTheta: getf("rope.freq_base", 10000),
	}
	hp.HeadDim = getiOr("attention.key_length", 0)
	if hp.HeadDim == 0 && hp.Heads > 0 {
		hp.HeadDim = hp.Hidden / hp.Heads
	}
	hp.RopeDims = getiOr("rope.dimension_count", hp.HeadDim)
	if t, ok := f.Tensor("token_embd.weight"); ok && len(t.Dims) == 2 {
		hp.Vocab = int(t.Dims[1])
	} else if _, ok := f.Meta(p + "vocab_size"); ok { // older dflash-model files
		hp.Vocab = geti("vocab_size")
	} else {
		errs = multierror.Append(errs, fmt.Errorf("cannot tell the vocabulary size: no %q tensor", "token_embd.weight"))
	}
	if nextn := getiOr("nextn_predict_layers", 0); nextn > 0 {
		// As llama.cpp does: MTP layers count only if their eh_proj is there.
		if _, ok := f.Tensor(fmt.Sprintf("blk.%d.nextn.eh_proj.weight", hp.Layers-nextn)); ok {
			if _, ok := f.Tensor("blk.0.attn_norm.weight"); !ok {
				errs = multierror.Append(errs, fmt.Errorf("an MTP-only file (no blk.0, nextn_predict_layers %d) is not supported", nextn))
			}
			hp.Layers -= nextn
		}
	}
	if v, ok := f.Meta(p + "expert_gating_func"); ok {
		if g, err := f.Uint32(p + "expert_gating_func"); err != nil || g != ds4GatingSqrtSoftplus {
			errs = multierror.Append(errs, fmt.Errorf("%sexpert_gating_func is %v, want %d (sqrtsoftplus)", p, v, ds4GatingSqrtSoftplus))
		}
	}
	d := &hp.DS
	d.QLora, d.OLora, d.OGroups = geti("attention.q_lora_rank"), geti("attention.output_lora_rank"), geti("attention.output_group_count")
	d.Experts, d.ExpertsUsed, d.Shared = geti("expert_count"), geti("expert_used_count"), geti("expert_shared_count")
	d.FFN, d.HashLayers, d.Window = geti("expert_feed_forward_length"), geti("hash_layer_count"), geti("attention.sliding_window")
	d.IndexHeads, d.IndexHeadDim, d.TopK = geti("attention.indexer.head_count"), geti("attention.indexer.key_length"), geti("attention.indexer.top_k")
	d.HC, d.Sinkhorn = geti("hyper_connection.count"), geti("hyper_connection.sinkhorn_iterations")
	d.HCEps = getf("hyper_connection.epsilon", 1e-6)
	d.RoutedScale = getf("expert_weights_scale", 1.5)
	d.CompressTheta = getf("attention.compress_rope_freq_base", 160000)
	d.YarnFactor = getf("rope.scaling.factor", 1)
	d.BetaFast, d.BetaSlow = getf("rope.scaling.yarn_beta_fast", 32), getf("rope.scaling.yarn_beta_slow", 1)
	d.YarnOrigCtx = getiOr("rope.scaling.original_context_length", hp.Context)
	// swiglu_clamp_exp: a scalar (older files) or one value per layer; the
	// per-layer values must agree (one limit is all hparams keeps).
	if v, ok := f.Meta(p + "swiglu_clamp_exp"); ok {
		if xs, err := f.Float32s(p + "swiglu_clamp_exp"); err == nil {
			for _, x := range xs {
				if len(xs) > 0 && x != xs[0] {
					errs = multierror.Append(errs, fmt.Errorf("%sswiglu_clamp_exp differs between layers (%v); one limit is supported", p, xs))
					break
				}
			}
			if len(xs) > 0 {
				d.SwigluLimit = xs[0]
			}
		} else if x, err := f.Float32(p + "swiglu_clamp_exp"); err == nil {
			d.SwigluLimit = x
		} else {
			errs = multierror.Append(errs, fmt.Errorf("%sswiglu_clamp_exp: %v is not a float or float array", p, v))
		}
	}
	d.CSARatio = 4
	ratios, err := f.Int32s(p + "attention.compress_ratios")
	if err != nil {
		// Files without the key follow the Flash schedule.
		d.Kinds, d.HCARatio = flashKinds(hp.Layers), upstreamHCARatio
	}
	if len(ratios) > hp.Layers && hp.Layers >= 0 {
		ratios = ratios[:hp.Layers] // trailing entries are the MTP layers'
	}
	for _, r := range ratios {
		switch {
		case r == 0:
			d.Kinds = append(d.Kinds, ds4Sliding)
		case r == 4:
			d.Kinds = append(d.Kinds, ds4CSA)
		default:
			d.Kinds, d.HCARatio = append(d.Kinds, ds4HCA), int(r)
		}
	}
	if d.HCARatio == 0 {
		d.HCARatio = upstreamHCARatio
	}
	return hp, errs.ErrorOrNil()
}

// ds4FromHF reads a DeepseekV4Config as transformers 5.17 saves it.
func ds4FromHF(c hfConfig) (hparams, error) {
	var errs *multierror.Error
	hp := hparams{
		Layers:  c.int("num_hidden_layers", &errs),
		Hidden:  c.int("hidden_size", &errs),
		Vocab:   c.int("vocab_size", &errs),
		Heads:   c.int("num_attention_heads", &errs),
		KVHeads: c.intOr("num_key_value_heads", 1),
		HeadDim: c.int("head_dim", &errs),
		Context: c.intOr("max_position_embeddings", 1048576),
		RMSEps:  float32(c.floatOr("rms_norm_eps", 1e-6)),
		Tied:    c.boolOr("tie_word_embeddings", false),
	}
	d := &hp.DS
	d.QLora = c.int("q_lora_rank", &errs)
	d.OGroups = c.int("o_groups", &errs)
	d.OLora = c.int("o_lora_rank", &errs)
	d.Experts = c.int("n_routed_experts", &errs)
	d.ExpertsUsed = c.int("num_experts_per_tok", &errs)
	d.Shared = c.intOr("n_shared_experts", 1)
	d.FFN = c.int("moe_intermediate_size", &errs)
	d.Window = c.int("sliding_window", &errs)
	d.IndexHeads = c.int("index_n_heads", &errs)
	d.IndexHeadDim = c.int("index_head_dim", &errs)
	d.TopK = c.int("index_topk", &errs)
	d.HC = c.intOr("hc_mult", 4)
	d.Sinkhorn = c.intOr("hc_sinkhorn_iters", 20)
	d.HCEps = float32(c.floatOr("hc_eps", 1e-6))
	d.SwigluLimit = float32(c.floatOr("swiglu_limit", 10))
	d.RoutedScale = float32(c.floatOr("routed_scaling_factor", 1.5))
	var scoring string
	if raw, ok := c.raw("scoring_func"); ok {
		_ = json.Unmarshal(raw, &scoring)
	}
	if scoring != "" && scoring != "sqrtsoftplus" {
		errs = multierror.Append(errs, fmt.Errorf("config.json: scoring_func %q is not supported (GGUF deepseek4 implies sqrtsoftplus)", scoring))
	}
	if !c.boolOr("norm_topk_prob", true) {
		errs = multierror.Append(errs, fmt.Errorf("config.json: norm_topk_prob = false is not supported"))
	}
	if c.boolOr("attention_bias", false) || c.boolOr("mlp_bias", false) {
		errs = multierror.Append(errs, fmt.Errorf("config.json: attention or MLP biases are not supported"))
	}

	// Compression rates and the layer schedule.
	d.CSARatio, d.HCARatio = 4, 128
	var rates map[string]int
	if raw, ok := c.raw("compress_rates"); ok {
		if err := json.Unmarshal(raw, &rates); err != nil {
			errs = multierror.Append(errs, fmt.Errorf("config.json: compress_rates: %w", err))
		}
	}
	if r, ok := rates["compressed_sparse_attention"]; ok {
		d.CSARatio = r
	}
	if r, ok := rates["heavily_compressed_attention"]; ok {
		d.HCARatio = r
	}
	kindOf := map[string]int{"sliding_attention": ds4Sliding, "compressed_sparse_attention": ds4CSA, "heavily_compressed_attention": ds4HCA}
	for i, t := range c.strings("layer_types") {
		k, ok := kindOf[t]
		if !ok {
			errs = multierror.Append(errs, fmt.Errorf("config.json: layer_types[%d] = %q is not a DeepSeek V4 attention type", i, t))
		}
		d.Kinds = append(d.Kinds, k)
	}
	if d.Kinds == nil {
		errs = multierror.Append(errs, fmt.Errorf("config.json: missing %q (transformers writes it; its default schedule is not V4-Flash's)", "layer_types"))
	}
	if len(d.Kinds) > hp.Layers && hp.Layers > 0 {
		d.Kinds = d.Kinds[:hp.Layers]
	}
	mlp := c.strings("mlp_layer_types")
	if mlp == nil {
		d.HashLayers = min(c.intOr("num_hash_layers", 3), hp.Layers)
	}
	for i, t := range mlp {
		switch {
		case t == "hash_moe" && i == d.HashLayers:
			d.HashLayers++
		case t == "hash_moe":
			errs = multierror.Append(errs, fmt.Errorf("config.json: mlp_layer_types[%d] is hash_moe after a moe layer; GGUF needs the hash layers first", i))
		case t != "moe":
			errs = multierror.Append(errs, fmt.Errorf("config.json: mlp_layer_types[%d] = %q is not hash_moe or moe", i, t))
		}
	}

	// RoPE: "main" for window-only layers, "compress" (maybe YaRN) for the rest.
	var rp struct {
		Main     map[string]json.RawMessage `json:"main"`
		Compress map[string]json.RawMessage `json:"compress"`
	}
	if raw, ok := c.raw("rope_parameters"); ok {
		_ = json.Unmarshal(raw, &rp)
	}
	num := func(m map[string]json.RawMessage, key string, def float64) float64 {
		var v float64
		if raw, ok := m[key]; !ok || json.Unmarshal(raw, &v) != nil {
			return def
		}
		return v
	}
	hp.RopeTheta = float32(num(rp.Main, "rope_theta", c.floatOr("rope_theta", 10000)))
	d.CompressTheta = float32(num(rp.Compress, "rope_theta", c.floatOr("compress_rope_theta", 160000)))
	partial := num(rp.Main, "partial_rotary_factor", c.floatOr("partial_rotary_factor", 64.0/512))
	hp.RopeDims = int(float64(hp.HeadDim) * partial)
	var ropeType string
	_ = json.Unmarshal(rp.Compress["rope_type"], &ropeType)
	switch ropeType {
	case "", "default":
		d.YarnFactor, d.BetaFast, d.BetaSlow, d.YarnOrigCtx = 1, 32, 1, hp.Context // factor 1: plain RoPE
	case "yarn":
		d.YarnFactor = float32(num(rp.Compress, "factor", 16))
		d.BetaFast = float32(num(rp.Compress, "beta_fast", 32))
		d.BetaSlow = float32(num(rp.Compress, "beta_slow", 1))
		d.YarnOrigCtx = int(num(rp.Compress, "original_max_position_embeddings", 65536))
		if af := num(rp.Compress, "attention_factor", 1); af != 1 {
			errs = multierror.Append(errs, fmt.Errorf("config.json: compress rope attention_factor %g is not supported (V4 uses 1)", af))
		}
	default:
		errs = multierror.Append(errs, fmt.Errorf("config.json: compress rope type %q is not supported", ropeType))
	}
	var mainType string
	_ = json.Unmarshal(rp.Main["rope_type"], &mainType)
	if mainType != "" && mainType != "default" {
		errs = multierror.Append(errs, fmt.Errorf("config.json: main rope type %q is not supported", mainType))
	}
	return hp, errs.ErrorOrNil()
}
