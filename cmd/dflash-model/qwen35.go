package main

import (
	"fmt"

	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/hashicorp/go-multierror"
)

// qwen35: Qwen3.5 / 3.6 / 3.8 hybrid (HF model_type "qwen3_5", text config
// "qwen3_5_text"): Gated DeltaNet layers with a gated full-attention layer
// every full_attention_interval layers. See qwen-targets spec §3.11-3.13.
//
// Conversion conventions (spec §3.13), all expressed in the hfRule values
// built by qwen35Tensors below:
//
//  1. every HF tensor whose name ends in "norm.weight" gets +1 (zero-centred
//     RMSNorm baked in), except linear_attn.norm.weight (ssm_norm);
//  2. ssm_a = −exp(A_log);
//  3. dt_bias → ssm_dt.bias;
//  4. conv1d.weight [C, 1, K] → ne [K, C] (same bytes, middle dim dropped);
//  5. value heads reordered from grouped (HF: value head j uses QK head
//     j / r) to tiled (GGUF: value head j' uses QK head j' % n_k), i.e. old
//     head j = g·r + k moves to j' = k·n_k + g, on every axis that indexes
//     value heads: V rows of in_proj_qkv, rows of in_proj_z, in_proj_a,
//     in_proj_b, elements of A_log and dt_bias, V channels of conv1d and
//     the input columns of out_proj;
//  6. MTP layers are appended as blk.{n_trunk+k} and counted in block_count;
//  7. attention q_proj (query ‖ gate interleaved per head) is copied as is.
func init() {
	register(&layout{
		arch: "qwen35",
		defaults: hparams{
			Layers: 8, Hidden: 128, Heads: 4, KVHeads: 2, HeadDim: 32, FFN: 256,
			Context: 4096, RMSEps: 1e-6, RopeTheta: 1e7,
			FullAttnInterval: 4, LinKHeads: 2, LinVHeads: 4, LinKDim: 16, LinVDim: 16, ConvKernel: 4,
			RopeDims: 8, RopeSections: []int32{2, 1, 1, 0},
		},
		validate: validateQwen35,
		keys:     qwen35Keys,
		tensors:  qwen35Tensors,
		fromGGUF: qwen35FromGGUF,
		fromHF:   qwen35FromHF,
	})
}

func validateQwen35(hp hparams) error {
	err := positive("layers", hp.Layers, "hidden", hp.Hidden, "heads", hp.Heads, "kv-heads", hp.KVHeads,
		"head-dim", hp.HeadDim, "ffn", hp.FFN, "vocab", hp.Vocab, "context", hp.Context,
		"full-attn-interval", hp.FullAttnInterval, "linear-k-heads", hp.LinKHeads, "linear-v-heads", hp.LinVHeads,
		"linear-k-dim", hp.LinKDim, "linear-v-dim", hp.LinVDim, "conv-kernel", hp.ConvKernel, "rope-dims", hp.RopeDims)
	if err != nil {
		return err
	}
	var errs *multierror.Error
	if hp.Heads%hp.KVHeads != 0 {
		errs = multierror.Append(errs, fmt.Errorf("heads (%d) must be a multiple of kv-heads (%d)", hp.Heads, hp.KVHeads))
	}
	if hp.LinVHeads%hp.LinKHeads != 0 {
		errs = multierror.Append(errs, fmt.Errorf("linear-v-heads (%d) must be a multiple of linear-k-heads (%d)", hp.LinVHeads, hp.LinKHeads))
	}
	if hp.RopeDims%2 != 0 || hp.RopeDims > hp.HeadDim {
		errs = multierror.Append(errs, fmt.Errorf("rope dims (%d) must be even and at most head-dim (%d)", hp.RopeDims, hp.HeadDim))
	}
	sum := 0
	for _, s := range hp.RopeSections {
		sum += int(s)
	}
	if len(hp.RopeSections) != 4 || sum != hp.RopeDims/2 {
		errs = multierror.Append(errs, fmt.Errorf("rope sections %v must be 4 values summing to rope dims / 2 = %d", hp.RopeSections, hp.RopeDims/2))
	}
	if hp.NextN < 0 {
		errs = multierror.Append(errs, fmt.Errorf("mtp layers must not be negative, got %d", hp.NextN))
	}
	return errs.ErrorOrNil()
}

func qwen35Keys(hp hparams) []kv {
	p := "qwen35."
	keys := commonKeys("qwen35", hp)
	keys = append(keys,
		kv{p + "rope.dimension_count", u32(hp.RopeDims)},
		kv{p + "rope.dimension_sections", append([]int32(nil), hp.RopeSections...)},
		kv{p + "full_attention_interval", u32(hp.FullAttnInterval)},
		kv{p + "ssm.conv_kernel", u32(hp.ConvKernel)},
		kv{p + "ssm.state_size", u32(hp.LinKDim)},
		kv{p + "ssm.group_count", u32(hp.LinKHeads)},
		kv{p + "ssm.time_step_rank", u32(hp.LinVHeads)},
		kv{p + "ssm.inner_size", u32(hp.LinVDim * hp.LinVHeads)},
	)
	if hp.NextN > 0 {
		keys = append(keys, kv{p + "nextn_predict_layers", u32(hp.NextN)})
	}
	return keys
}

// isFullAttention is the HF/llama.cpp layer rule.
func isFullAttention(hp hparams, layer int) bool { return (layer+1)%hp.FullAttnInterval == 0 }

// vHeadOrder maps each output position to its source position for an axis
// of n entries whose entries [off, off+nv·size) are nv value heads of size
// entries each, reordering heads from grouped to tiled (rule 5). Entries
// outside the range keep their place.
func vHeadOrder(n, off, size, nk, nv int) []int {
	r := nv / nk
	m := make([]int, n)
	for i := range m {
		m[i] = i
	}
	for jNew := 0; jNew < nv; jNew++ {
		k, g := jNew/nk, jNew%nk
		jOld := g*r + k
		for e := 0; e < size; e++ {
			m[off+jNew*size+e] = off + jOld*size + e
		}
	}
	return m
}

func qwen35Tensors(hp hparams) []tensorPlan {
	H, F, hd := hp.Hidden, hp.FFN, hp.HeadDim
	nk, nv, dk, dv := hp.LinKHeads, hp.LinVHeads, hp.LinKDim, hp.LinVDim
	conv := 2*nk*dk + nv*dv // channels of in_proj_qkv and the conv
	ps := embeddingAndHead(hp, true)
	// attention appends a gated full-attention block's tensors; hf maps a
	// tensor suffix to its HF rule.
	attention := func(blk func(string) string, hf func(string, ...int) hfRule) {
		qg, q, kv := 2*hp.Heads*hd, hp.Heads*hd, hp.KVHeads*hd
		plus := func(r hfRule) hfRule { r.PlusOne = true; return r }
		ps = append(ps,
			tensorPlan{Name: blk("attn_q.weight"), Dims: dims(H, qg), HF: hf("self_attn.q_proj.weight", qg, H)},
			tensorPlan{Name: blk("attn_k.weight"), Dims: dims(H, kv), HF: hf("self_attn.k_proj.weight", kv, H)},
			tensorPlan{Name: blk("attn_v.weight"), Dims: dims(H, kv), HF: hf("self_attn.v_proj.weight", kv, H)},
			tensorPlan{Name: blk("attn_output.weight"), Dims: dims(q, H), HF: hf("self_attn.o_proj.weight", H, q)},
			tensorPlan{Name: blk("attn_q_norm.weight"), Dims: dims(hd), Init: initNorm, HF: plus(hf("self_attn.q_norm.weight", hd))},
			tensorPlan{Name: blk("attn_k_norm.weight"), Dims: dims(hd), Init: initNorm, HF: plus(hf("self_attn.k_norm.weight", hd))},
		)
	}
	// block appends what every decoder block has: the two norms and the FFN.
	block := func(blk func(string) string, hf func(string, ...int) hfRule) {
		plus := func(r hfRule) hfRule { r.PlusOne = true; return r }
		ps = append(ps,
			tensorPlan{Name: blk("attn_norm.weight"), Dims: dims(H), Init: initNorm, HF: plus(hf("input_layernorm.weight", H))},
			tensorPlan{Name: blk("post_attention_norm.weight"), Dims: dims(H), Init: initNorm, HF: plus(hf("post_attention_layernorm.weight", H))},
			tensorPlan{Name: blk("ffn_gate.weight"), Dims: dims(H, F), HF: hf("mlp.gate_proj.weight", F, H)},
			tensorPlan{Name: blk("ffn_up.weight"), Dims: dims(H, F), HF: hf("mlp.up_proj.weight", F, H)},
			tensorPlan{Name: blk("ffn_down.weight"), Dims: dims(F, H), HF: hf("mlp.down_proj.weight", H, F)},
		)
	}
	for i := 0; i < hp.Layers; i++ {
		blk, hf := layerNames(i)
		block(blk, hf)
		if isFullAttention(hp, i) {
			attention(blk, hf)
			continue
		}
		// Gated DeltaNet tensors. heads(n, off, size) is rule 5's value-head
		// reorder for an axis of n entries whose value heads (size entries
		// each) start at off.
		heads := func(n, off, size int) func() []int {
			return func() []int { return vHeadOrder(n, off, size, nk, nv) }
		}
		la := func(name string, shape ...int) hfRule { return hf("linear_attn."+name, shape...) }
		qkv := la("in_proj_qkv.weight", conv, H)
		qkv.Rows = heads(conv, 2*nk*dk, dv) // only the V rows move
		z := la("in_proj_z.weight", nv*dv, H)
		z.Rows = heads(nv*dv, 0, dv)
		b := la("in_proj_b.weight", nv, H)
		b.Rows = heads(nv, 0, 1)
		a := la("in_proj_a.weight", nv, H)
		a.Rows = heads(nv, 0, 1)
		cv := la("conv1d.weight", conv, 1, hp.ConvKernel) // [C, 1, K] read as C rows of K
		cv.Rows = heads(conv, 2*nk*dk, dv)
		alog := la("A_log", nv)
		alog.NegExp, alog.Cols = true, heads(nv, 0, 1)
		dt := la("dt_bias", nv)
		dt.Cols = heads(nv, 0, 1)
		out := la("out_proj.weight", H, nv*dv)
		out.Cols = heads(nv*dv, 0, dv) // its input columns
		ps = append(ps,
			tensorPlan{Name: blk("attn_qkv.weight"), Dims: dims(H, conv), HF: qkv},
			tensorPlan{Name: blk("attn_gate.weight"), Dims: dims(H, nv*dv), HF: z},
			tensorPlan{Name: blk("ssm_beta.weight"), Dims: dims(H, nv), HF: b},
			tensorPlan{Name: blk("ssm_alpha.weight"), Dims: dims(H, nv), HF: a},
			tensorPlan{Name: blk("ssm_conv1d.weight"), Dims: dims(hp.ConvKernel, conv), Init: initConv, F32: true, HF: cv},
			tensorPlan{Name: blk("ssm_a"), Dims: dims(nv), Init: initSsmA, HF: alog},
			tensorPlan{Name: blk("ssm_dt.bias"), Dims: dims(nv), Init: initDtBias, HF: dt},
			tensorPlan{Name: blk("ssm_norm.weight"), Dims: dims(dv), Init: initNorm, HF: la("norm.weight", dv)}, // no +1
			tensorPlan{Name: blk("ssm_out.weight"), Dims: dims(nv*dv, H), HF: out},
		)
	}
	// MTP blocks: a full-attention block plus the nextn projection and
	// norms. GGUF names follow llama.cpp's conversion (spec §3.10); the
	// ".weight" suffix on the nextn tensors is as gguf-py writes them.
	for k := 0; k < hp.NextN; k++ {
		n := hp.Layers + k
		blk := func(name string) string { return fmt.Sprintf("blk.%d.%s", n, name) }
		hf := func(name string, shape ...int) hfRule {
			return hfRule{Name: fmt.Sprintf("mtp.layers.%d.%s", k, name), Top: true, Shape: torch(shape...)}
		}
		block(blk, hf)
		attention(blk, hf)
		top := func(name string, plusOne bool, shape ...int) hfRule {
			return hfRule{Name: name, Top: true, Shape: torch(shape...), PlusOne: plusOne}
		}
		ps = append(ps,
			tensorPlan{Name: blk("nextn.eh_proj.weight"), Dims: dims(2*H, H), HF: top("mtp.fc.weight", false, H, 2*H)},
			tensorPlan{Name: blk("nextn.enorm.weight"), Dims: dims(H), Init: initNorm, HF: top("mtp.pre_fc_norm_embedding.weight", true, H)},
			tensorPlan{Name: blk("nextn.hnorm.weight"), Dims: dims(H), Init: initNorm, HF: top("mtp.pre_fc_norm_hidden.weight", true, H)},
			tensorPlan{Name: blk("nextn.shared_head_norm.weight"), Dims: dims(H), Init: initNorm, HF: top("mtp.norm.weight", true, H)},
		)
	}
	return ps
}

func qwen35FromGGUF(f *gguf.File) (hparams, error) {
	hp, err := commonFromGGUF(f)
	var errs *multierror.Error
	errs = multierror.Append(errs, err)
	geti := func(key string, dst *int) {
		v, err := f.Uint32("qwen35." + key)
		if err != nil {
			errs = multierror.Append(errs, err)
			return
		}
		*dst = int(v)
	}
	if _, ok := f.Meta("qwen35.nextn_predict_layers"); ok {
		geti("nextn_predict_layers", &hp.NextN)
		hp.Layers -= hp.NextN
	}
	geti("full_attention_interval", &hp.FullAttnInterval)
	geti("ssm.conv_kernel", &hp.ConvKernel)
	geti("ssm.state_size", &hp.LinKDim)
	geti("ssm.group_count", &hp.LinKHeads)
	geti("ssm.time_step_rank", &hp.LinVHeads)
	var inner int
	geti("ssm.inner_size", &inner)
	if hp.LinVHeads > 0 {
		hp.LinVDim = inner / hp.LinVHeads
	}
	geti("rope.dimension_count", &hp.RopeDims)
	if s, err := f.Int32s("qwen35.rope.dimension_sections"); err == nil {
		hp.RopeSections = s
	} else {
		errs = multierror.Append(errs, err)
	}
	return hp, errs.ErrorOrNil()
}

// qwen35FromHF reads a Qwen3_5TextConfig, or the text_config of a
// Qwen3_5Config.
func qwen35FromHF(c hfConfig) (hparams, error) {
	var errs *multierror.Error
	hp := hparams{
		Layers:           c.int("num_hidden_layers", &errs),
		Hidden:           c.int("hidden_size", &errs),
		Heads:            c.int("num_attention_heads", &errs),
		FFN:              c.int("intermediate_size", &errs),
		Vocab:            c.int("vocab_size", &errs),
		HeadDim:          c.int("head_dim", &errs),
		LinKHeads:        c.int("linear_num_key_heads", &errs),
		LinVHeads:        c.int("linear_num_value_heads", &errs),
		LinKDim:          c.int("linear_key_head_dim", &errs),
		LinVDim:          c.int("linear_value_head_dim", &errs),
		ConvKernel:       c.intOr("linear_conv_kernel_dim", 4),
		FullAttnInterval: c.intOr("full_attention_interval", 4),
		Context:          c.intOr("max_position_embeddings", 262144),
		RMSEps:           float32(c.floatOr("rms_norm_eps", 1e-6)),
		Tied:             c.boolOr("tie_word_embeddings", false),
		NextN:            c.intOr("mtp_num_hidden_layers", 0),
	}
	hp.KVHeads = c.intOr("num_key_value_heads", hp.Heads)
	hp.RopeTheta = float32(c.ropeFloat("rope_theta", 10000))
	hp.RopeDims = int(float64(hp.HeadDim) * c.ropeFloat("partial_rotary_factor", 0.25))
	sections := c.ropeInts("mrope_section")
	if sections == nil {
		sections = []int{11, 11, 10}
	}
	for len(sections) < 4 {
		sections = append(sections, 0)
	}
	for _, s := range sections {
		hp.RopeSections = append(hp.RopeSections, int32(s))
	}
	c.plainRope(&errs)
	// transformers saves layer_types, not the interval (it consumes
	// full_attention_interval); GGUF carries only the interval, so derive
	// it from the first full-attention layer and check the whole pattern.
	types := c.strings("layer_types")
	if _, given := c.raw("full_attention_interval"); !given {
		for i, t := range types {
			if t == "full_attention" {
				hp.FullAttnInterval = i + 1
				break
			}
		}
	}
	if types != nil && hp.FullAttnInterval > 0 {
		if len(types) != hp.Layers {
			errs = multierror.Append(errs, fmt.Errorf("config.json: layer_types has %d entries for %d layers", len(types), hp.Layers))
		}
		for i, t := range types {
			want := "linear_attention"
			if isFullAttention(hp, i) {
				want = "full_attention"
			}
			if t != want {
				errs = multierror.Append(errs, fmt.Errorf("config.json: layer_types[%d] = %q, but full_attention_interval %d makes it %s", i, t, hp.FullAttnInterval, want))
				break
			}
		}
	}
	return hp, errs.ErrorOrNil()
}
