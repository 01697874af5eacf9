package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dflash/dflash_server/sdk/gguf"
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

// ds4Fixture is a DeepseekV4ForCausalLM checkpoint as transformers 5.17
// saves it (official DeepSeek names under "model.", head.weight at the top,
// one tensor per expert) with the spec's tiny shape: hidden 64, 4 layers
// [window, window, CSA, HCA], 4 heads of 32, rope 16, q LoRA 32, 2 output
// groups of 16, 8 experts (2 used) of 32, 3 hash layers, indexer 32 × 32, 4
// HC streams.
func ds4Fixture() (map[string]any, []hfTensor) {
	cfg := map[string]any{
		"architectures": []string{"DeepseekV4ForCausalLM"}, "model_type": "deepseek_v4",
		"vocab_size": 16, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
		"num_key_value_heads": 1, "head_dim": 32, "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16,
		"n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 32,
		"sliding_window": 8, "index_n_heads": 32, "index_head_dim": 32, "index_topk": 4,
		"hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "swiglu_limit": 10.0, "routed_scaling_factor": 1.5,
		"scoring_func": "sqrtsoftplus", "norm_topk_prob": true, "rms_norm_eps": 1e-6, "max_position_embeddings": 1048576,
		"layer_types":              []string{"sliding_attention", "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"},
		"compress_rates":           map[string]int{"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
		"mlp_layer_types":          []string{"hash_moe", "hash_moe", "hash_moe", "moe"},
		"num_nextn_predict_layers": 1, // transformers drops the MTP weights
		"partial_rotary_factor":    0.5, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
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
		{name: "head.weight", shape: []int64{16, D}},
		{name: "model.hc_head.hc_fn", shape: []int64{HC, HC * D}},
		{name: "model.hc_head.hc_base", shape: []int64{HC}},
		{name: "model.hc_head.hc_scale", shape: []int64{1}},
	}
	for i := 0; i < 4; i++ {
		p := fmt.Sprintf("model.layers.%d.", i)
		for _, site := range []string{"hc_attn_", "hc_ffn_"} {
			ts = append(ts,
				hfTensor{name: p + site + "fn", shape: []int64{int64(mix), HC * D}},
				hfTensor{name: p + site + "base", shape: []int64{int64(mix)}},
				hfTensor{name: p + site + "scale", shape: []int64{3}})
		}
		a := p + "attn."
		ts = append(ts,
			hfTensor{name: p + "attn_norm.weight", shape: []int64{D}},
			hfTensor{name: p + "ffn_norm.weight", shape: []int64{D}},
			hfTensor{name: a + "wq_a.weight", shape: []int64{QL, D}},
			hfTensor{name: a + "q_norm.weight", shape: []int64{QL}},
			hfTensor{name: a + "wq_b.weight", shape: []int64{H * hd, QL}},
			hfTensor{name: a + "wkv.weight", shape: []int64{hd, D}},
			hfTensor{name: a + "norm.weight", shape: []int64{hd}},
			hfTensor{name: a + "wo_a.weight", shape: []int64{2 * 16, H * hd / 2}},
			hfTensor{name: a + "wo_b.weight", shape: []int64{D, 2 * 16}},
			hfTensor{name: a + "attn_sink", shape: []int64{H}},
		)
		switch i {
		case 2: // CSA
			c, x := a+"compressor.", a+"indexer."
			ts = append(ts,
				hfTensor{name: c + "wkv.weight", shape: []int64{2 * hd, D}},
				hfTensor{name: c + "wgate.weight", shape: []int64{2 * hd, D}},
				hfTensor{name: c + "ape", shape: []int64{4, 2 * hd}},
				hfTensor{name: c + "norm.weight", shape: []int64{hd}},
				hfTensor{name: x + "compressor.wkv.weight", shape: []int64{64, D}},
				hfTensor{name: x + "compressor.wgate.weight", shape: []int64{64, D}},
				hfTensor{name: x + "compressor.ape", shape: []int64{4, 64}},
				hfTensor{name: x + "compressor.norm.weight", shape: []int64{32}},
				hfTensor{name: x + "wq_b.weight", shape: []int64{32 * 32, QL}},
				hfTensor{name: x + "weights_proj.weight", shape: []int64{32, D}},
			)
		case 3: // HCA
			c := a + "compressor."
			ts = append(ts,
				hfTensor{name: c + "wkv.weight", shape: []int64{hd, D}},
				hfTensor{name: c + "wgate.weight", shape: []int64{hd, D}},
				hfTensor{name: c + "ape", shape: []int64{8, hd}},
				hfTensor{name: c + "norm.weight", shape: []int64{hd}},
			)
		}
		m := p + "ffn."
		ts = append(ts,
			hfTensor{name: m + "gate.weight", shape: []int64{E, D}},
			hfTensor{name: m + "shared_experts.w1.weight", shape: []int64{F, D}},
			hfTensor{name: m + "shared_experts.w3.weight", shape: []int64{F, D}},
			hfTensor{name: m + "shared_experts.w2.weight", shape: []int64{D, F}},
		)
		for e := 0; e < E; e++ {
			x := fmt.Sprintf("%sexperts.%d.", m, e)
			ts = append(ts,
				hfTensor{name: x + "w1.weight", shape: []int64{F, D}},
				hfTensor{name: x + "w3.weight", shape: []int64{F, D}},
				hfTensor{name: x + "w2.weight", shape: []int64{D, F}},
			)
		}
		if i < 3 {
			ts = append(ts, hfTensor{name: m + "gate.tid2eid", shape: []int64{16, K}})
		} else {
			ts = append(ts, hfTensor{name: m + "gate.bias", shape: []int64{E}})
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

// ds4Official renames a fixture to the official DeepSeek hub layout: no
// "model." prefix, embed.weight and hc_head_{fn,base,scale} at the top.
func ds4Official(ts []hfTensor) []hfTensor {
	out := make([]hfTensor, len(ts))
	for i, x := range ts {
		n := strings.TrimPrefix(x.name, "model.")
		switch n {
		case "embed_tokens.weight":
			n = "embed.weight"
		case "hc_head.hc_fn", "hc_head.hc_base", "hc_head.hc_scale":
			n = strings.Replace(n, ".hc_", "_", 1)
		}
		out[i] = hfTensor{name: n, shape: x.shape, vals: x.vals}
	}
	return out
}

// writeDS4 writes a fixture checkpoint with tid2eid as I64 (as transformers
// saves it) and the tensors named in raw given that dtype and zero bytes
// (FP8 and the like).
func writeDS4(t *testing.T, cfg map[string]any, ts []hfTensor, raw map[string]string) string {
	t.Helper()
	dir := writeHF(t, cfg, ts, "F32")
	var nts []safetensors.NewTensor
	for _, x := range ts {
		nt, err := safetensors.FromFloat32(x.name, "F32", x.shape, x.vals)
		if err != nil {
			t.Fatal(err)
		}
		switch dt := raw[x.name]; {
		case dt != "":
			nt = safetensors.NewTensor{Name: x.name, DType: dt, Shape: x.shape, Data: make([]byte, len(x.vals))}
		case filepath.Ext(x.name) == ".tid2eid":
			b := make([]byte, 8*len(x.vals))
			for k, v := range x.vals {
				binary.LittleEndian.PutUint64(b[8*k:], uint64(int64(v)))
			}
			nt = safetensors.NewTensor{Name: x.name, DType: "I64", Shape: x.shape, Data: b}
		}
		nts = append(nts, nt)
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), nts, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestConvertDeepseek4(t *testing.T) {
	cfg, ts := ds4Fixture()
	// Head dims of 32 convert, with a warning that upstream llama.cpp will
	// not create a context for them.
	hp, err := ds4FromHF(hfConfig{top: jsonRaw(t, cfg)})
	if err != nil {
		t.Fatal(err)
	}
	if w := upstreamWarning(ds4Arch, hp); !strings.Contains(w, "head dim 32 / indexer head dim 32: upstream llama.cpp's K rotation needs multiples of 64") {
		t.Fatalf("warning %q", w)
	}
	t.Run("transformers", func(t *testing.T) { checkDS4Conversion(t, cfg, ts, "model.") })
	t.Run("official", func(t *testing.T) { checkDS4Conversion(t, cfg, ds4Official(ts), "") })
}

// jsonRaw turns a config map into config.json's raw fields.
func jsonRaw(t *testing.T, cfg map[string]any) map[string]json.RawMessage {
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// checkDS4Conversion converts a fixture checkpoint whose layer tensors are
// under prefix and compares the GGUF with it.
func checkDS4Conversion(t *testing.T, cfg map[string]any, ts []hfTensor, prefix string) {
	is := is.New(t)
	dir := writeDS4(t, cfg, ts, nil)
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
		x, ok := byName[hf]
		if !ok {
			t.Fatalf("fixture has no %q", hf)
		}
		is.Equal(ti.Dims, reversed(x.shape))
		is.Equal(got, x.vals)
	}
	top := map[string]string{"model.": "model.embed_tokens.weight", "": "embed.weight"}[prefix]
	same("token_embd.weight", top)
	same("output.weight", "head.weight")
	same("output_norm.weight", prefix+"norm.weight")
	same("output_hc_fn.weight", map[string]string{"model.": "model.hc_head.hc_fn", "": "hc_head_fn"}[prefix])
	same("output_hc_scale.weight", map[string]string{"model.": "model.hc_head.hc_scale", "": "hc_head_scale"}[prefix])
	l := prefix + "layers."
	same("blk.1.hc_ffn_fn.weight", l+"1.hc_ffn_fn")
	same("blk.0.attn_q_a_norm.weight", l+"0.attn.q_norm.weight")
	same("blk.0.attn_kv_a_norm.weight", l+"0.attn.norm.weight")
	same("blk.1.attn_sinks.weight", l+"1.attn.attn_sink")
	same("blk.2.attn_compressor_ape.weight", l+"2.attn.compressor.ape")
	same("blk.2.indexer.proj.weight", l+"2.attn.indexer.weights_proj.weight")
	same("blk.2.indexer_compressor_kv.weight", l+"2.attn.indexer.compressor.wkv.weight")
	same("blk.3.attn_output_a.weight", l+"3.attn.wo_a.weight")
	same("blk.3.exp_probs_b.bias", l+"3.ffn.gate.bias")
	same("blk.3.ffn_gate_inp.weight", l+"3.ffn.gate.weight")
	same("blk.2.ffn_up_shexp.weight", l+"2.ffn.shared_experts.w3.weight")
	same("blk.1.ffn_gate_tid2eid.weight", l+"1.ffn.gate.tid2eid")
	tid, _ := f.Tensor("blk.1.ffn_gate_tid2eid.weight")
	is.Equal(tid.Type, gguf.I32)
	_, ok := f.Tensor("blk.2.exp_probs_b.bias") // hash layers route by token, without a bias
	is.True(!ok)

	// Expert stacks: row e·F + f of gate (up) is expert e's w1 (w3) row f;
	// row e·D + d of down is expert e's w2 row d.
	const D, F, E = 64, 32, 8
	for _, c := range []struct {
		gg, w   string
		dims    []uint64
		rows, n int
	}{
		{"ffn_gate_exps", "w1", []uint64{D, F, E}, F, D},
		{"ffn_up_exps", "w3", []uint64{D, F, E}, F, D},
		{"ffn_down_exps", "w2", []uint64{F, D, E}, D, F},
	} {
		for _, layer := range []int{0, 3} {
			got, ti := ggufFloats(t, f, fmt.Sprintf("blk.%d.%s.weight", layer, c.gg))
			is.Equal(ti.Dims, c.dims)
			for e := 0; e < E; e++ {
				want := byName[fmt.Sprintf("%s%d.ffn.experts.%d.%s.weight", l, layer, e, c.w)].vals
				is.Equal(len(want), c.rows*c.n)
				if !slices.Equal(got[e*c.rows*c.n:(e+1)*c.rows*c.n], want) {
					t.Fatalf("blk.%d.%s: expert %d's rows are not its %s", layer, c.gg, e, c.w)
				}
			}
		}
	}
}

func TestConvertDeepseek4Errors(t *testing.T) {
	drop := func(name string) func([]hfTensor) []hfTensor {
		return func(ts []hfTensor) []hfTensor {
			return slices.DeleteFunc(slices.Clone(ts), func(x hfTensor) bool { return x.name == name })
		}
	}
	tests := []struct {
		name  string
		build func([]hfTensor) []hfTensor
		raw   map[string]string
		want  []string
		not   string
	}{
		{name: "missing expert", build: drop("model.layers.3.ffn.experts.5.w3.weight"),
			want: []string{`missing tensor "model.layers.3.ffn.experts.5.w3.weight" (for blk.3.ffn_up_exps.weight)`}},
		{name: "expert shape", build: func(ts []hfTensor) []hfTensor {
			ts = drop("model.layers.1.ffn.experts.2.w2.weight")(ts)
			return append(ts, fill([]hfTensor{{name: "model.layers.1.ffn.experts.2.w2.weight", shape: []int64{32, 64}}})...)
		}, want: []string{`tensor "model.layers.1.ffn.experts.2.w2.weight" has shape [32 64], want [64 32]`}},
		{name: "missing head", build: drop("head.weight"), want: []string{`checkpoint has no tensor "head.weight"`}},
		{name: "missing official hc head", build: func(ts []hfTensor) []hfTensor { return drop("hc_head_base")(ds4Official(ts)) },
			want: []string{`missing tensor "hc_head.hc_base" or "hc_head_base" (for output_hc_base.weight)`}},
		{name: "fp8", build: func(ts []hfTensor) []hfTensor {
			return append(ts, fill([]hfTensor{{name: "model.layers.1.attn.wq_a.scale", shape: []int64{1, 1}}})...)
		}, raw: map[string]string{"model.layers.1.attn.wq_a.weight": "F8_E4M3"},
			want: []string{`tensor "model.layers.1.attn.wq_a.weight" has unsupported dtype F8_E4M3`, "must be dequantized"},
			not:  `"model.layers.1.attn.wq_a.scale"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, ts := ds4Fixture()
			dir := writeDS4(t, cfg, tc.build(ts), tc.raw)
			out := filepath.Join(t.TempDir(), "x.gguf")
			_, err := runCLI(t, "convert", dir, out)
			if err == nil {
				t.Fatal("convert succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not contain %q", err, w)
				}
			}
			if tc.not != "" && strings.Contains(err.Error(), tc.not) {
				t.Fatalf("error %q mentions %s", err, tc.not)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Fatalf("%s was written", out)
			}
		})
	}
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

// --expert-type gives the routed expert stacks their own type; every other matrix keeps --type, and other
// architectures refuse the flag.
func TestMkDeepseek4ExpertType(t *testing.T) {
	is := is.New(t)
	out := filepath.Join(t.TempDir(), "ds.gguf")
	mustCLI(t, "mk", "deepseek4", out, "--tokenizer", testTokenizer, "--type", "q8_0", "--expert-type", "q4_K",
		"--hidden", "256", "--ffn", "256", "--vocab", "40")
	f := openGGUF(t, out)
	for name, want := range map[string]gguf.Type{
		"blk.3.ffn_gate_exps.weight": gguf.Q4_K, "blk.3.ffn_up_exps.weight": gguf.Q4_K, "blk.3.ffn_down_exps.weight": gguf.Q4_K,
		"blk.3.ffn_gate_shexp.weight": gguf.Q8_0, "blk.3.attn_q_a.weight": gguf.Q8_0, "output.weight": gguf.Q8_0,
	} {
		ti, ok := f.Tensor(name)
		is.True(ok)
		is.Equal(ti.Type, want) // name
	}
	_, err := runCLI(t, "mk", "qwen3", filepath.Join(t.TempDir(), "q.gguf"), "--tokenizer", testTokenizer, "--expert-type", "q4_K")
	is.True(err != nil)
}
