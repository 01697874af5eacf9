package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/dflash/dflash_server/sdk/gguf/quant"
	"github.com/dflash/dflash_server/sdk/safetensors"
	"github.com/matryer/is"
)

// hfTensor is one tensor of a fixture checkpoint, named and shaped as
// transformers saves it.
type hfTensor struct {
	name  string
	shape []int64
	vals  []float32
}

// fill gives every tensor distinct, reproducible values.
func fill(ts []hfTensor) []hfTensor {
	for i := range ts {
		n := int64(1)
		for _, d := range ts[i].shape {
			n *= d
		}
		ts[i].vals = make([]float32, n)
		for k := range ts[i].vals {
			ts[i].vals[k] = float32(math.Sin(float64(i*1000+k)*0.37)) * 0.5
		}
	}
	return ts
}

// writeHF writes a checkpoint folder: config.json, the test tokenizer and
// one safetensors file.
func writeHF(t *testing.T, cfg map[string]any, ts []hfTensor, dtype string) string {
	t.Helper()
	dir := t.TempDir()
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(testTokenizer, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var nts []safetensors.NewTensor
	for _, x := range ts {
		nt, err := safetensors.FromFloat32(x.name, dtype, x.shape, x.vals)
		if err != nil {
			t.Fatal(err)
		}
		nts = append(nts, nt)
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), nts, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// qwen3Fixture mirrors Qwen3ForCausalLM: hidden 64, 2 layers, 4/2 heads of
// 16, FFN 128, vocab 16.
func qwen3Fixture(tied bool) (map[string]any, []hfTensor) {
	cfg := map[string]any{
		"architectures": []string{"Qwen3ForCausalLM"}, "model_type": "qwen3",
		"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 16,
		"max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": tied,
		"rope_parameters": map[string]any{"rope_type": "default", "rope_theta": 1e6},
	}
	ts := []hfTensor{{name: "model.embed_tokens.weight", shape: []int64{16, 64}}, {name: "model.norm.weight", shape: []int64{64}}}
	if !tied {
		ts = append(ts, hfTensor{name: "lm_head.weight", shape: []int64{16, 64}})
	}
	for i := 0; i < 2; i++ {
		p := fmt.Sprintf("model.layers.%d.", i)
		ts = append(ts,
			hfTensor{name: p + "input_layernorm.weight", shape: []int64{64}},
			hfTensor{name: p + "post_attention_layernorm.weight", shape: []int64{64}},
			hfTensor{name: p + "self_attn.q_proj.weight", shape: []int64{64, 64}},
			hfTensor{name: p + "self_attn.k_proj.weight", shape: []int64{32, 64}},
			hfTensor{name: p + "self_attn.v_proj.weight", shape: []int64{32, 64}},
			hfTensor{name: p + "self_attn.o_proj.weight", shape: []int64{64, 64}},
			hfTensor{name: p + "self_attn.q_norm.weight", shape: []int64{16}},
			hfTensor{name: p + "self_attn.k_norm.weight", shape: []int64{16}},
			hfTensor{name: p + "mlp.gate_proj.weight", shape: []int64{128, 64}},
			hfTensor{name: p + "mlp.up_proj.weight", shape: []int64{128, 64}},
			hfTensor{name: p + "mlp.down_proj.weight", shape: []int64{64, 128}},
		)
	}
	return cfg, fill(ts)
}

// ggufFloats reads a tensor of a converted file as float32.
func ggufFloats(t *testing.T, f *gguf.File, name string) ([]float32, gguf.TensorInfo) {
	t.Helper()
	ti, ok := f.Tensor(name)
	if !ok {
		t.Fatalf("no tensor %q", name)
	}
	d, _ := f.TensorData(name)
	v, err := quant.ToFloat32(ti.Type, d)
	if err != nil {
		t.Fatal(err)
	}
	return v, ti
}

func reversed(s []int64) []uint64 {
	out := make([]uint64, len(s))
	for i, d := range s {
		out[len(s)-1-i] = uint64(d)
	}
	return out
}

func TestConvertQwen3(t *testing.T) {
	for _, tied := range []bool{false, true} {
		t.Run(fmt.Sprintf("tied=%v", tied), func(t *testing.T) {
			is := is.New(t)
			cfg, ts := qwen3Fixture(tied)
			dir := writeHF(t, cfg, ts, "F32")
			out := filepath.Join(t.TempDir(), "q3.gguf")
			mustCLI(t, "convert", dir, out, "--type", "f32")
			f := openGGUF(t, out)
			is.Equal(f.Arch(), "qwen3")
			is.NoErr(checkLayout(f))
			kv, _ := f.Uint32("qwen3.attention.head_count_kv")
			is.Equal(kv, uint32(2))
			theta, _ := f.Float32("qwen3.rope.freq_base")
			is.Equal(theta, float32(1e6))
			toks, _ := f.Strings("tokenizer.ggml.tokens")
			is.Equal(len(toks), 16) // padded to config.json's vocab_size
			rename := map[string]string{
				"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight",
				"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
				"self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
				"self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
				"mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
			}
			for _, x := range ts {
				name := rename[x.name]
				if name == "" {
					var layer int
					var rest string
					fmt.Sscanf(x.name, "model.layers.%d.%s", &layer, &rest)
					name = fmt.Sprintf("blk.%d.%s", layer, rename[rest])
				}
				got, ti := ggufFloats(t, f, name)
				is.Equal(ti.Dims, reversed(x.shape)) // ggml dims are the torch shape reversed
				is.Equal(got, x.vals)                // qwen3 converts by renaming only
			}
			_, hasOutput := f.Tensor("output.weight")
			is.Equal(hasOutput, !tied)

			bare := filepath.Join(t.TempDir(), "bare.gguf")
			mustCLI(t, "convert", dir, bare, "--type", "f32", "--no-tokenizer")
			g := openGGUF(t, bare)
			_, hasTok := g.Meta("tokenizer.ggml.tokens")
			is.True(!hasTok)
			is.NoErr(checkLayout(g)) // the vocabulary comes from token_embd
		})
	}
}

// qwen35 fixture: Qwen3_5ForCausalLM with hidden 64, 4 layers (3 GDN + 1
// attention), 4/2 heads of 16, GDN 2 key heads of 8 and 6 value heads of 4
// (ratio 3, as in the 27B model's 16/48), conv 4, vocab 16.
const (
	q35H, q35F, q35Heads, q35KV, q35HD = 64, 128, 4, 2, 16
	q35NK, q35NV, q35DK, q35DV, q35K   = 2, 6, 8, 4, 4
	q35Conv                            = 2*q35NK*q35DK + q35NV*q35DV
)

func qwen35Fixture(prefix, modelType string, mtp bool) (map[string]any, []hfTensor) {
	text := map[string]any{
		"model_type": "qwen3_5_text", "hidden_size": q35H, "intermediate_size": q35F, "num_hidden_layers": 4,
		"num_attention_heads": q35Heads, "num_key_value_heads": q35KV, "head_dim": q35HD,
		"linear_num_key_heads": q35NK, "linear_num_value_heads": q35NV, "linear_key_head_dim": q35DK,
		"linear_value_head_dim": q35DV, "linear_conv_kernel_dim": q35K, "vocab_size": 16, "rms_norm_eps": 1e-6,
		"layer_types":         []string{"linear_attention", "linear_attention", "linear_attention", "full_attention"},
		"tie_word_embeddings": false, "max_position_embeddings": 1024, // no full_attention_interval: transformers does not save it
		"rope_parameters": map[string]any{"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
			"mrope_section": []int{1, 1, 0}, "mrope_interleaved": true},
	}
	if mtp {
		text["mtp_num_hidden_layers"] = 1
	}
	cfg := text
	if modelType == "qwen3_5" {
		cfg = map[string]any{"model_type": "qwen3_5", "architectures": []string{"Qwen3_5ForConditionalGeneration"},
			"text_config": text, "vision_config": map[string]any{"depth": 1}}
	}
	ts := []hfTensor{
		{name: prefix + "embed_tokens.weight", shape: []int64{16, q35H}},
		{name: prefix + "norm.weight", shape: []int64{q35H}},
		{name: "lm_head.weight", shape: []int64{16, q35H}},
	}
	attn := func(p string) []hfTensor {
		return []hfTensor{
			{name: p + "self_attn.q_proj.weight", shape: []int64{2 * q35Heads * q35HD, q35H}},
			{name: p + "self_attn.k_proj.weight", shape: []int64{q35KV * q35HD, q35H}},
			{name: p + "self_attn.v_proj.weight", shape: []int64{q35KV * q35HD, q35H}},
			{name: p + "self_attn.o_proj.weight", shape: []int64{q35H, q35Heads * q35HD}},
			{name: p + "self_attn.q_norm.weight", shape: []int64{q35HD}},
			{name: p + "self_attn.k_norm.weight", shape: []int64{q35HD}},
		}
	}
	common := func(p string) []hfTensor {
		return []hfTensor{
			{name: p + "input_layernorm.weight", shape: []int64{q35H}},
			{name: p + "post_attention_layernorm.weight", shape: []int64{q35H}},
			{name: p + "mlp.gate_proj.weight", shape: []int64{q35F, q35H}},
			{name: p + "mlp.up_proj.weight", shape: []int64{q35F, q35H}},
			{name: p + "mlp.down_proj.weight", shape: []int64{q35H, q35F}},
		}
	}
	for i := 0; i < 4; i++ {
		p := fmt.Sprintf("%slayers.%d.", prefix, i)
		ts = append(ts, common(p)...)
		if i == 3 {
			ts = append(ts, attn(p)...)
			continue
		}
		la := p + "linear_attn."
		ts = append(ts,
			hfTensor{name: la + "in_proj_qkv.weight", shape: []int64{q35Conv, q35H}},
			hfTensor{name: la + "in_proj_z.weight", shape: []int64{q35NV * q35DV, q35H}},
			hfTensor{name: la + "in_proj_b.weight", shape: []int64{q35NV, q35H}},
			hfTensor{name: la + "in_proj_a.weight", shape: []int64{q35NV, q35H}},
			hfTensor{name: la + "conv1d.weight", shape: []int64{q35Conv, 1, q35K}},
			hfTensor{name: la + "dt_bias", shape: []int64{q35NV}},
			hfTensor{name: la + "A_log", shape: []int64{q35NV}},
			hfTensor{name: la + "norm.weight", shape: []int64{q35DV}},
			hfTensor{name: la + "out_proj.weight", shape: []int64{q35H, q35NV * q35DV}},
		)
	}
	if mtp {
		ts = append(ts, common("mtp.layers.0.")...)
		ts = append(ts, attn("mtp.layers.0.")...)
		ts = append(ts,
			hfTensor{name: "mtp.fc.weight", shape: []int64{q35H, 2 * q35H}},
			hfTensor{name: "mtp.pre_fc_norm_embedding.weight", shape: []int64{q35H}},
			hfTensor{name: "mtp.pre_fc_norm_hidden.weight", shape: []int64{q35H}},
			hfTensor{name: "mtp.norm.weight", shape: []int64{q35H}},
		)
	}
	return cfg, fill(ts)
}

// tiledHead is spec §3.13 rule 5 verbatim: old (grouped) value head j moves
// to j' = (j % r)·n_k + j / r.
func tiledHead(j int) int {
	r := q35NV / q35NK
	return (j%r)*q35NK + j/r
}

// expectQwen35 computes, independently of the converter's rule tables, what
// each GGUF tensor must hold for an HF tensor (spec §3.12/3.13).
func expectQwen35(x hfTensor, prefix string) (name string, dims []uint64, want []float32) {
	rel := strings.TrimPrefix(x.name, prefix)
	var layer int
	var rest string
	if n, _ := fmt.Sscanf(rel, "layers.%d.%s", &layer, &rest); n == 2 {
		rel = rest
	} else if n, _ := fmt.Sscanf(x.name, "mtp.layers.0.%s", &rest); n == 1 {
		layer, rel = 4, rest
	}
	v := append([]float32(nil), x.vals...)
	dims = reversed(x.shape)
	plusOne := func() {
		for i := range v {
			v[i]++
		}
	}
	// moveRows places row block j (of size rows) of the V range at tiledHead(j).
	moveRows := func(off, size, rowLen int) {
		src := append([]float32(nil), v...)
		for j := 0; j < q35NV; j++ {
			for e := 0; e < size; e++ {
				from := (off + j*size + e) * rowLen
				to := (off + tiledHead(j)*size + e) * rowLen
				copy(v[to:to+rowLen], src[from:from+rowLen])
			}
		}
	}
	blk := func(s string) string { return fmt.Sprintf("blk.%d.%s", layer, s) }
	switch rel {
	case "embed_tokens.weight":
		return "token_embd.weight", dims, v
	case "norm.weight":
		plusOne()
		return "output_norm.weight", dims, v
	case "lm_head.weight":
		return "output.weight", dims, v
	case "mtp.fc.weight":
		return "blk.4.nextn.eh_proj.weight", dims, v
	case "mtp.pre_fc_norm_embedding.weight":
		plusOne()
		return "blk.4.nextn.enorm.weight", dims, v
	case "mtp.pre_fc_norm_hidden.weight":
		plusOne()
		return "blk.4.nextn.hnorm.weight", dims, v
	case "mtp.norm.weight":
		plusOne()
		return "blk.4.nextn.shared_head_norm.weight", dims, v
	case "input_layernorm.weight":
		plusOne()
		return blk("attn_norm.weight"), dims, v
	case "post_attention_layernorm.weight":
		plusOne()
		return blk("post_attention_norm.weight"), dims, v
	case "self_attn.q_norm.weight", "self_attn.k_norm.weight":
		plusOne()
		return blk("attn_" + rel[len("self_attn."):len("self_attn.")+1] + "_norm.weight"), dims, v
	case "self_attn.q_proj.weight":
		return blk("attn_q.weight"), dims, v
	case "self_attn.k_proj.weight":
		return blk("attn_k.weight"), dims, v
	case "self_attn.v_proj.weight":
		return blk("attn_v.weight"), dims, v
	case "self_attn.o_proj.weight":
		return blk("attn_output.weight"), dims, v
	case "mlp.gate_proj.weight":
		return blk("ffn_gate.weight"), dims, v
	case "mlp.up_proj.weight":
		return blk("ffn_up.weight"), dims, v
	case "mlp.down_proj.weight":
		return blk("ffn_down.weight"), dims, v
	case "linear_attn.in_proj_qkv.weight":
		moveRows(2*q35NK*q35DK, q35DV, q35H)
		return blk("attn_qkv.weight"), dims, v
	case "linear_attn.in_proj_z.weight":
		moveRows(0, q35DV, q35H)
		return blk("attn_gate.weight"), dims, v
	case "linear_attn.in_proj_b.weight":
		moveRows(0, 1, q35H)
		return blk("ssm_beta.weight"), dims, v
	case "linear_attn.in_proj_a.weight":
		moveRows(0, 1, q35H)
		return blk("ssm_alpha.weight"), dims, v
	case "linear_attn.conv1d.weight":
		moveRows(2*q35NK*q35DK, q35DV, q35K) // [C, 1, K]: K values per channel
		return blk("ssm_conv1d.weight"), []uint64{q35K, q35Conv}, v
	case "linear_attn.A_log":
		moveRows(0, 1, 1)
		for i := range v {
			v[i] = float32(-math.Exp(float64(v[i])))
		}
		return blk("ssm_a"), dims, v
	case "linear_attn.dt_bias":
		moveRows(0, 1, 1)
		return blk("ssm_dt.bias"), dims, v
	case "linear_attn.norm.weight": // the gated norm keeps its value
		return blk("ssm_norm.weight"), dims, v
	case "linear_attn.out_proj.weight":
		src := append([]float32(nil), v...)
		cols := q35NV * q35DV
		for h := 0; h < q35H; h++ {
			for j := 0; j < q35NV; j++ {
				for e := 0; e < q35DV; e++ {
					v[h*cols+tiledHead(j)*q35DV+e] = src[h*cols+j*q35DV+e]
				}
			}
		}
		return blk("ssm_out.weight"), dims, v
	}
	panic("no expectation for " + x.name)
}

func TestConvertQwen35(t *testing.T) {
	tests := []struct {
		name, prefix, modelType string
		mtp                     bool
		tensors                 int
	}{
		{"causal-lm", "model.", "qwen3_5_text", false, 3 + 3*14 + 11},
		{"vlm with mtp", "model.language_model.", "qwen3_5", true, 3 + 3*14 + 11 + 15},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			cfg, ts := qwen35Fixture(tc.prefix, tc.modelType, tc.mtp)
			if tc.modelType == "qwen3_5" { // a vision tensor the text GGUF leaves out
				ts = append(ts, fill([]hfTensor{{name: "model.visual.patch_embed.proj.weight", shape: []int64{2, 2}}})...)
			}
			dir := writeHF(t, cfg, ts, "F32")
			out := filepath.Join(t.TempDir(), "q35.gguf")
			mustCLI(t, "convert", dir, out, "--type", "f32")
			f := openGGUF(t, out)
			is.Equal(f.Arch(), "qwen35")
			is.NoErr(checkLayout(f))
			is.Equal(len(f.Tensors()), tc.tensors)
			for key, want := range map[string]uint32{
				"qwen35.ssm.group_count": q35NK, "qwen35.ssm.time_step_rank": q35NV, "qwen35.ssm.state_size": q35DK,
				"qwen35.ssm.inner_size": q35NV * q35DV, "qwen35.ssm.conv_kernel": q35K, "qwen35.rope.dimension_count": 4,
				"qwen35.full_attention_interval": 4,
			} {
				got, err := f.Uint32(key)
				is.NoErr(err)
				is.Equal(got, want)
			}
			sec, _ := f.Int32s("qwen35.rope.dimension_sections")
			is.Equal(sec, []int32{1, 1, 0, 0})
			bc, _ := f.Uint32("qwen35.block_count")
			nn, hasNextN := f.Meta("qwen35.nextn_predict_layers")
			if tc.mtp {
				is.Equal(bc, uint32(5))
				is.Equal(nn, uint32(1))
			} else {
				is.Equal(bc, uint32(4))
				is.True(!hasNextN)
			}
			for _, x := range ts {
				if strings.Contains(x.name, "visual") {
					continue
				}
				name, dims, want := expectQwen35(x, tc.prefix)
				got, ti := ggufFloats(t, f, name)
				is.Equal(ti.Dims, dims)
				for i := range want {
					if got[i] != want[i] {
						t.Fatalf("%s (from %s): element %d = %g, want %g", name, x.name, i, got[i], want[i])
					}
				}
			}
		})
	}
}

// TestConvertTypes converts a bf16 checkpoint to each output type.
func TestConvertTypes(t *testing.T) {
	cfg, ts := qwen3Fixture(false)
	dir := writeHF(t, cfg, ts, "BF16")
	for _, typ := range []string{"f32", "f16", "bf16", "q8_0"} {
		t.Run(typ, func(t *testing.T) {
			is := is.New(t)
			out := filepath.Join(t.TempDir(), "m.gguf")
			mustCLI(t, "convert", dir, out, "--type", typ)
			f := openGGUF(t, out)
			got, ti := ggufFloats(t, f, "blk.0.ffn_up.weight")
			want, _, _ := parseOutputType(typ)
			is.Equal(ti.Type, want)
			norm, ni := ggufFloats(t, f, "blk.0.attn_norm.weight")
			is.Equal(ni.Type, gguf.F32) // 1-D tensors stay F32
			var x []float32
			for _, h := range ts {
				if h.name == "model.layers.0.mlp.up_proj.weight" {
					x = h.vals
				}
				if h.name == "model.layers.0.input_layernorm.weight" {
					is.Equal(norm[0], quant.BF16ToF32(quant.F32ToBF16(h.vals[0])))
				}
			}
			var maxErr float64
			for i := range x {
				maxErr = math.Max(maxErr, math.Abs(float64(got[i]-x[i])))
			}
			is.True(maxErr < 0.01) // within q8_0's step for values below 0.5
		})
	}
}

func TestConvertErrors(t *testing.T) {
	mutate := func(f func(cfg map[string]any, ts []hfTensor) []hfTensor) (map[string]any, []hfTensor) {
		cfg, ts := qwen3Fixture(false)
		return cfg, f(cfg, ts)
	}
	drop := func(name string) func(map[string]any, []hfTensor) []hfTensor {
		return func(_ map[string]any, ts []hfTensor) []hfTensor {
			var out []hfTensor
			for _, x := range ts {
				if x.name != name {
					out = append(out, x)
				}
			}
			return out
		}
	}
	tests := []struct {
		name  string
		build func(map[string]any, []hfTensor) []hfTensor
		dtype string
		want  string
	}{
		{"missing tensor", drop("model.layers.1.mlp.up_proj.weight"), "F32", `missing tensor "model.layers.1.mlp.up_proj.weight" (for blk.1.ffn_up.weight)`},
		{"missing head", drop("lm_head.weight"), "F32", `checkpoint has no tensor "lm_head.weight"`},
		{"wrong shape", func(cfg map[string]any, ts []hfTensor) []hfTensor {
			cfg["num_key_value_heads"] = 4
			return ts
		}, "F32", `tensor "model.layers.0.self_attn.k_proj.weight" has shape [32 64], want [64 64]`},
		{"bias", func(_ map[string]any, ts []hfTensor) []hfTensor {
			return append(ts, fill([]hfTensor{{name: "model.layers.0.self_attn.q_proj.bias", shape: []int64{64}}})...)
		}, "F32", `checkpoint tensor "model.layers.0.self_attn.q_proj.bias" has no place in the GGUF layout`},
		{"model type", func(cfg map[string]any, ts []hfTensor) []hfTensor {
			cfg["model_type"] = "llama"
			return ts
		}, "F32", `config.json: model_type "llama" is not supported`},
		{"missing key", func(cfg map[string]any, ts []hfTensor) []hfTensor {
			delete(cfg, "hidden_size")
			return ts
		}, "F32", `config.json: missing "hidden_size"`},
		{"layer pattern", func(cfg map[string]any, ts []hfTensor) []hfTensor {
			cfg["model_type"] = "qwen3_5_text"
			cfg["layer_types"] = []string{"full_attention", "linear_attention"}
			return ts
		}, "F32", "layer_types[1] = \"linear_attention\", but full_attention_interval 1 makes it full_attention"},
		{"rope scaling", func(cfg map[string]any, ts []hfTensor) []hfTensor {
			cfg["rope_parameters"] = map[string]any{"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}
			return ts
		}, "F32", `rope type "yarn" is not supported yet`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			cfg, ts := mutate(tc.build)
			dir := writeHF(t, cfg, ts, tc.dtype)
			out := filepath.Join(t.TempDir(), "x.gguf")
			_, err := runCLI(t, "convert", dir, out)
			is.True(err != nil)
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
			_, statErr := os.Stat(out)
			is.True(os.IsNotExist(statErr))
		})
	}
	t.Run("integer dtype", func(t *testing.T) {
		is := is.New(t)
		cfg, ts := qwen3Fixture(false)
		dir := writeHF(t, cfg, ts, "F32")
		// Replace the file with one whose norm is an integer tensor.
		var nts []safetensors.NewTensor
		for _, x := range ts {
			nt, _ := safetensors.FromFloat32(x.name, "F32", x.shape, x.vals)
			if x.name == "model.norm.weight" {
				nt = safetensors.NewTensor{Name: x.name, DType: "I32", Shape: x.shape, Data: nt.Data}
			}
			nts = append(nts, nt)
		}
		is.NoErr(safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), nts, nil))
		_, err := runCLI(t, "convert", dir, filepath.Join(t.TempDir(), "x.gguf"))
		is.True(err != nil)
		is.True(strings.Contains(err.Error(), `tensor "model.norm.weight" has unsupported dtype I32`))
	})
}

// bf16 rounds v as a BF16 checkpoint stores it.
func bf16(v float32) float32 { return quant.BF16ToF32(quant.F32ToBF16(v)) }
