package main

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/dflash/dflash_server/sdk/gguf/quant"
	"github.com/dflash/dflash_server/sdk/safetensors"
	"github.com/matryer/is"
)

func TestMkDeepseek4(t *testing.T) {
	is := is.New(t)
	out := filepath.Join(t.TempDir(), "ds.gguf")
	mustCLI(t, "mk", "deepseek4", out, "--tokenizer", testTokenizer, "--type", "q8_0", "--vocab", "40")
	f := openGGUF(t, out)
	is.Equal(f.Arch(), "deepseek4")
	is.NoErr(checkLayout(f))
	ratios, err := f.Int32s("deepseek4.attention.compress_ratios")
	is.NoErr(err)
	is.Equal(ratios, []int32{0, 0, 4, 128, 4, 128}) // llama.cpp loads only 0, 4 and 128
	// The keys upstream llama.cpp requires, with its converter's types.
	gating, err := f.Uint32("deepseek4.expert_gating_func")
	is.NoErr(err)
	is.Equal(gating, uint32(4)) // sqrtsoftplus
	rs, _ := f.Meta("deepseek4.rope.scaling.type")
	is.Equal(rs, "yarn")
	clamp, err := f.Float32s("deepseek4.swiglu_clamp_exp")
	is.NoErr(err)
	is.Equal(clamp, []float32{10, 10, 10, 10, 10, 10})
	clamp, err = f.Float32s("deepseek4.swiglu_clamp_shexp")
	is.NoErr(err)
	is.Equal(len(clamp), 6)
	out4, _ := f.Uint32("deepseek4.embedding_length_out")
	is.Equal(out4, uint32(4*64))
	norm, _ := f.Meta("deepseek4.expert_weights_norm")
	is.Equal(norm, true)
	_, ok := f.Meta("deepseek4.vocab_size") // upstream has none: token_embd says
	is.True(!ok)
	// Hash layers carry distinct expert ids per token; the others a bias.
	ti, ok := f.Tensor("blk.2.ffn_gate_tid2eid.weight")
	is.True(ok)
	is.Equal(ti.Type, gguf.I32)
	is.Equal(ti.Dims, []uint64{2, 40})
	d, _ := f.TensorData(ti.Name)
	for tok := 0; tok < 40; tok++ {
		a := int32(binary.LittleEndian.Uint32(d[8*tok:]))
		b := int32(binary.LittleEndian.Uint32(d[8*tok+4:]))
		is.True(a != b && a >= 0 && a < 8 && b >= 0 && b < 8)
	}
	_, ok = f.Tensor("blk.3.exp_probs_b.bias")
	is.True(ok)
	_, ok = f.Tensor("blk.3.ffn_gate_tid2eid.weight")
	is.True(!ok)
	// Window-only layers have no compressor, HCA layers no indexer.
	_, ok = f.Tensor("blk.1.attn_compressor_kv.weight")
	is.True(!ok)
	_, ok = f.Tensor("blk.3.indexer.proj.weight")
	is.True(!ok)
	ape, _ := f.Tensor("blk.2.attn_compressor_ape.weight")
	is.Equal(ape.Dims, []uint64{256, 4}) // CSA: two series of head_dim
	ape, _ = f.Tensor("blk.3.attn_compressor_ape.weight")
	is.Equal(ape.Dims, []uint64{128, 128})
	hc, _ := f.Tensor("blk.0.hc_attn_fn.weight")
	is.Equal(hc.Type, gguf.F16) // mixing weights stay 16-bit in quantized files
	router, _ := f.Tensor("blk.0.ffn_gate_inp.weight")
	is.Equal(router.Type, gguf.F32)
	exps, _ := f.Tensor("blk.5.ffn_down_exps.weight")
	is.Equal(exps.Dims, []uint64{32, 64, 8})
	is.Equal(exps.Type, gguf.Q8_0)
}

// ds4Fixture mirrors DeepseekV4ForCausalLM (transformers 5.17 names) with
// the spec's tiny shape: hidden 64, 4 layers [window, window, CSA, HCA],
// 4 heads of 32, rope 16, q LoRA 32, 2 output groups of 16, 8 experts (2
// used) of 32, 3 hash layers, indexer 32 × 32, 4 HC streams.
func ds4Fixture() (map[string]any, []hfTensor) {
	cfg := map[string]any{
		"architectures": []string{"DeepseekV4ForCausalLM"}, "model_type": "deepseek_v4",
		"vocab_size": 16, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
		"num_key_value_heads": 1, "head_dim": 32, "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16,
		"n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 32,
		"sliding_window": 8, "index_n_heads": 32, "index_head_dim": 32, "index_topk": 4,
		"hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "swiglu_limit": 10.0, "routed_scaling_factor": 1.5,
		"scoring_func": "sqrtsoftplus", "norm_topk_prob": true, "rms_norm_eps": 1e-6, "max_position_embeddings": 1048576,
		"layer_types":           []string{"sliding_attention", "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"},
		"compress_rates":        map[string]int{"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
		"mlp_layer_types":       []string{"hash_moe", "hash_moe", "hash_moe", "moe"},
		"partial_rotary_factor": 0.5, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
		"rope_parameters": map[string]any{
			"main":     map[string]any{"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
			"compress": map[string]any{"rope_type": "yarn", "rope_theta": 160000.0, "partial_rotary_factor": 0.5, "factor": 16.0, "original_max_position_embeddings": 65536, "beta_fast": 32.0, "beta_slow": 1.0, "attention_factor": 1.0},
		},
	}
	const D, H, hd, QL, E, K, F, HC = 64, 4, 32, 32, 8, 2, 32, 4
	mix := (2 + HC) * HC
	ts := []hfTensor{
		{name: "model.embed_tokens.weight", shape: []int64{16, D}},
		{name: "model.norm.weight", shape: []int64{D}},
		{name: "lm_head.weight", shape: []int64{16, D}},
		{name: "model.hc_head.hc_fn", shape: []int64{HC, HC * D}},
		{name: "model.hc_head.hc_base", shape: []int64{HC}},
		{name: "model.hc_head.hc_scale", shape: []int64{1}},
	}
	for i := 0; i < 4; i++ {
		p := fmt.Sprintf("model.layers.%d.", i)
		for _, site := range []string{"attn_hc", "ffn_hc"} {
			ts = append(ts,
				hfTensor{name: p + site + ".fn", shape: []int64{int64(mix), HC * D}},
				hfTensor{name: p + site + ".base", shape: []int64{int64(mix)}},
				hfTensor{name: p + site + ".scale", shape: []int64{3}})
		}
		a := p + "self_attn."
		ts = append(ts,
			hfTensor{name: p + "input_layernorm.weight", shape: []int64{D}},
			hfTensor{name: p + "post_attention_layernorm.weight", shape: []int64{D}},
			hfTensor{name: a + "q_a_proj.weight", shape: []int64{QL, D}},
			hfTensor{name: a + "q_a_norm.weight", shape: []int64{QL}},
			hfTensor{name: a + "q_b_proj.weight", shape: []int64{H * hd, QL}},
			hfTensor{name: a + "kv_proj.weight", shape: []int64{hd, D}},
			hfTensor{name: a + "kv_norm.weight", shape: []int64{hd}},
			hfTensor{name: a + "o_a_proj.weight", shape: []int64{2 * 16, H * hd / 2}},
			hfTensor{name: a + "o_b_proj.weight", shape: []int64{D, 2 * 16}},
			hfTensor{name: a + "sinks", shape: []int64{H}},
		)
		switch i {
		case 2: // CSA
			c := a + "compressor."
			ts = append(ts,
				hfTensor{name: c + "kv_proj.weight", shape: []int64{2 * hd, D}},
				hfTensor{name: c + "gate_proj.weight", shape: []int64{2 * hd, D}},
				hfTensor{name: c + "position_bias", shape: []int64{4, 2 * hd}},
				hfTensor{name: c + "kv_norm.weight", shape: []int64{hd}},
				hfTensor{name: c + "indexer.kv_proj.weight", shape: []int64{64, D}},
				hfTensor{name: c + "indexer.gate_proj.weight", shape: []int64{64, D}},
				hfTensor{name: c + "indexer.position_bias", shape: []int64{4, 64}},
				hfTensor{name: c + "indexer.kv_norm.weight", shape: []int64{32}},
				hfTensor{name: c + "indexer.q_b_proj.weight", shape: []int64{32 * 32, QL}},
				hfTensor{name: c + "indexer.scorer.weights_proj.weight", shape: []int64{32, D}},
			)
		case 3: // HCA
			c := a + "compressor."
			ts = append(ts,
				hfTensor{name: c + "kv_proj.weight", shape: []int64{hd, D}},
				hfTensor{name: c + "gate_proj.weight", shape: []int64{hd, D}},
				hfTensor{name: c + "position_bias", shape: []int64{8, hd}},
				hfTensor{name: c + "kv_norm.weight", shape: []int64{hd}},
			)
		}
		m := p + "mlp."
		ts = append(ts,
			hfTensor{name: m + "gate.weight", shape: []int64{E, D}},
			hfTensor{name: m + "experts.gate_up_proj", shape: []int64{E, 2 * F, D}},
			hfTensor{name: m + "experts.down_proj", shape: []int64{E, D, F}},
			hfTensor{name: m + "shared_experts.gate_proj.weight", shape: []int64{F, D}},
			hfTensor{name: m + "shared_experts.up_proj.weight", shape: []int64{F, D}},
			hfTensor{name: m + "shared_experts.down_proj.weight", shape: []int64{D, F}},
		)
		if i < 3 {
			ts = append(ts, hfTensor{name: m + "gate.tid2eid", shape: []int64{16, K}})
		} else {
			ts = append(ts, hfTensor{name: m + "gate.e_score_correction_bias", shape: []int64{E}})
		}
	}
	ts = fill(ts)
	for i := range ts { // expert ids are integers below E
		if filepath.Ext(ts[i].name) == ".tid2eid" {
			for k := range ts[i].vals {
				ts[i].vals[k] = float32((k*3 + k/2) % E)
			}
		}
	}
	return cfg, ts
}

func TestConvertDeepseek4(t *testing.T) {
	is := is.New(t)
	cfg, ts := ds4Fixture()
	dir := writeHF(t, cfg, ts, "F32")
	// tid2eid is int64 in the checkpoint: rewrite those tensors as I64.
	var nts []safetensors.NewTensor
	for _, x := range ts {
		nt, _ := safetensors.FromFloat32(x.name, "F32", x.shape, x.vals)
		if filepath.Ext(x.name) == ".tid2eid" {
			b := make([]byte, 8*len(x.vals))
			for k, v := range x.vals {
				binary.LittleEndian.PutUint64(b[8*k:], uint64(int64(v)))
			}
			nt = safetensors.NewTensor{Name: x.name, DType: "I64", Shape: x.shape, Data: b}
		}
		nts = append(nts, nt)
	}
	is.NoErr(safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), nts, nil))

	out := filepath.Join(t.TempDir(), "ds.gguf")
	mustCLI(t, "convert", dir, out, "--type", "f32")
	f := openGGUF(t, out)
	is.Equal(f.Arch(), "deepseek4")
	is.NoErr(checkLayout(f))
	ratios, _ := f.Int32s("deepseek4.attention.compress_ratios")
	is.Equal(ratios, []int32{0, 0, 4, 8})
	hash, _ := f.Uint32("deepseek4.hash_layer_count")
	is.Equal(hash, uint32(3))
	rd, _ := f.Uint32("deepseek4.rope.dimension_count")
	is.Equal(rd, uint32(16))
	yf, _ := f.Float32("deepseek4.rope.scaling.factor")
	is.Equal(yf, float32(16))
	ct, _ := f.Float32("deepseek4.attention.compress_rope_freq_base")
	is.Equal(ct, float32(160000))

	byName := map[string]hfTensor{}
	for _, x := range ts {
		byName[x.name] = x
	}
	same := func(gg, hf string) {
		t.Helper()
		got, ti := ggufFloats(t, f, gg)
		x := byName[hf]
		is.Equal(ti.Dims, reversed(x.shape))
		is.Equal(got, x.vals)
	}
	same("output_hc_fn.weight", "model.hc_head.hc_fn")
	same("blk.1.hc_ffn_fn.weight", "model.layers.1.ffn_hc.fn")
	same("blk.2.attn_compressor_ape.weight", "model.layers.2.self_attn.compressor.position_bias")
	same("blk.2.indexer.proj.weight", "model.layers.2.self_attn.compressor.indexer.scorer.weights_proj.weight")
	same("blk.3.attn_output_a.weight", "model.layers.3.self_attn.o_a_proj.weight")
	same("blk.3.exp_probs_b.bias", "model.layers.3.mlp.gate.e_score_correction_bias")
	same("blk.0.ffn_down_exps.weight", "model.layers.0.mlp.experts.down_proj")
	same("blk.1.ffn_gate_tid2eid.weight", "model.layers.1.mlp.gate.tid2eid")
	tid, _ := f.Tensor("blk.1.ffn_gate_tid2eid.weight")
	is.Equal(tid.Type, gguf.I32)

	// gate_up_proj [E, 2F, D]: expert e's gate is rows [0, F), up rows [F, 2F).
	gu := byName["model.layers.2.mlp.experts.gate_up_proj"].vals
	gate, gi := ggufFloats(t, f, "blk.2.ffn_gate_exps.weight")
	up, _ := ggufFloats(t, f, "blk.2.ffn_up_exps.weight")
	is.Equal(gi.Dims, []uint64{64, 32, 8})
	const D, F = 64, 32
	for e := 0; e < 8; e++ {
		for r := 0; r < F; r++ {
			for c := 0; c < D; c++ {
				if gate[(e*F+r)*D+c] != gu[(e*2*F+r)*D+c] || up[(e*F+r)*D+c] != gu[(e*2*F+F+r)*D+c] {
					t.Fatalf("expert %d row %d col %d: gate/up split wrong", e, r, c)
				}
			}
		}
	}
	_ = quant.F16ToF32
}

// rewriteDS4 copies src to dst with keys set (nil: dropped) and extra F32
// tensors of the given dims added.
func rewriteDS4(t *testing.T, src, dst string, set map[string]any, extra map[string][]uint64) {
	t.Helper()
	is := is.New(t)
	f := openGGUF(t, src)
	w, err := gguf.Create(dst)
	is.NoErr(err)
	for _, kv := range f.KVs() {
		if _, ok := set[kv.Key]; ok {
			continue
		}
		v, _ := f.Meta(kv.Key)
		is.NoErr(w.AddKV(kv.Key, v))
	}
	for k, v := range set {
		if v != nil {
			is.NoErr(w.AddKV(k, v))
		}
	}
	for _, ti := range f.Tensors() {
		is.NoErr(w.AddTensor(ti.Name, ti.Type, ti.Dims))
	}
	for name, d := range extra {
		is.NoErr(w.AddTensor(name, gguf.F32, d))
	}
	for _, ti := range f.Tensors() {
		d, _ := f.TensorData(ti.Name)
		is.NoErr(w.WriteTensorData(ti.Name, d[:ti.Size]))
	}
	for name, d := range extra {
		n := uint64(4)
		for _, x := range d {
			n *= x
		}
		is.NoErr(w.WriteTensorData(name, make([]byte, n)))
	}
	is.NoErr(w.Close())
}

// TestDeepseek4ReadsUpstreamAndOlderFiles: the reader takes what upstream
// llama.cpp's converter writes (compress_ratios with the MTP layer's entry,
// u32 ratios, an MTP layer counted in block_count) and what older
// dflash-model files have (vocab_size, a scalar swiglu clamp, no gating
// function or scaling type, HCA ratio 8), and refuses another gating
// function.
func TestDeepseek4ReadsUpstreamAndOlderFiles(t *testing.T) {
	is := is.New(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "ds.gguf")
	mustCLI(t, "mk", "deepseek4", src, "--tokenizer", testTokenizer, "--type", "f32", "--vocab", "40")
	const p = "deepseek4."
	check := func(name string, set map[string]any, extra map[string][]uint64) error {
		t.Helper()
		dst := filepath.Join(dir, name+".gguf")
		rewriteDS4(t, src, dst, set, extra)
		return checkLayout(openGGUF(t, dst))
	}
	is.NoErr(check("upstream", map[string]any{p + "attention.compress_ratios": []int32{0, 0, 4, 128, 4, 128, 0}}, nil))
	is.NoErr(check("u32", map[string]any{p + "attention.compress_ratios": []uint32{0, 0, 4, 128, 4, 128}}, nil))
	is.NoErr(check("mtp", map[string]any{
		p + "block_count": uint32(7), p + "nextn_predict_layers": uint32(1),
		p + "attention.compress_ratios": []int32{0, 0, 4, 128, 4, 128, 0},
	}, map[string][]uint64{"blk.6.nextn.eh_proj.weight": {128, 64}}))
	is.NoErr(check("older", map[string]any{
		p + "vocab_size": uint32(40), p + "swiglu_clamp_exp": float32(10), p + "swiglu_clamp_shexp": nil,
		p + "expert_gating_func": nil, p + "rope.scaling.type": nil,
	}, nil))
	err := check("softmax", map[string]any{p + "expert_gating_func": uint32(1)}, nil)
	is.True(err != nil && strings.Contains(err.Error(), "expert_gating_func"))
	_, err = runCLI(t, "mk", "deepseek4", filepath.Join(dir, "tied.gguf"), "--tokenizer", testTokenizer, "--tied")
	is.True(err != nil) // llama.cpp has no tied fallback for deepseek4
}
