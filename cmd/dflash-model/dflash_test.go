package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/matryer/is"
)

func TestTargetLayerIDs(t *testing.T) {
	is := is.New(t)
	// The dflash spec's examples (§1.3).
	is.Equal(targetLayerIDs(64, 5), []int32{1, 16, 31, 46, 61})
	is.Equal(targetLayerIDs(32, 5), []int32{1, 8, 15, 22, 29})
	is.Equal(targetLayerIDs(52, 5), []int32{1, 13, 25, 37, 49})
	is.Equal(targetLayerIDs(60, 6), []int32{1, 12, 23, 35, 46, 57})
	is.Equal(targetLayerIDs(10, 1), []int32{5})
}

func TestMkDraft(t *testing.T) {
	is := is.New(t)
	out := filepath.Join(t.TempDir(), "d.gguf")
	mustCLI(t, "mk", "dflash-draft", out, "--tokenizer", testTokenizer, "--type", "f32",
		"--layers", "3", "--target-layers", "2", "--target-depth", "12", "--target-hidden", "96",
		"--sliding-window", "64", "--mask-token-id", "11", "--block-size", "8")
	f := openGGUF(t, out)
	is.Equal(f.Arch(), "dflash-draft")
	is.NoErr(checkLayout(f))
	is.Equal(len(f.Tensors()), 3+3*11)
	ids, err := f.Int32s("dflash-draft.dflash.target_layer_ids")
	is.NoErr(err)
	is.Equal(ids, []int32{1, 9})
	for key, want := range map[string]uint32{
		"dflash-draft.dflash.n_target_layers": 2, "dflash-draft.dflash.n_target_features": 192,
		"dflash-draft.dflash.block_size": 8, "dflash-draft.dflash.mask_token_id": 11,
		"dflash-draft.attention.sliding_window": 64, "dflash-draft.vocab_size": 14, "dflash-draft.block_count": 3,
	} {
		got, err := f.Uint32(key)
		is.NoErr(err)
		is.Equal(got, want)
	}
	pat, _ := f.Meta("dflash-draft.attention.sliding_window_pattern")
	is.Equal(pat, []bool{true, true, false})
	fc, _ := f.Tensor("dflash.fc.weight")
	is.Equal(fc.Dims, []uint64{192, 128})
	_, hasEmbd := f.Tensor("token_embd.weight")
	is.True(!hasEmbd) // the target's embedding is used

	_, err = runCLI(t, "mk", "qwen3", out, "--tokenizer", testTokenizer, "--block-size", "8")
	is.True(err != nil)
	is.True(strings.Contains(err.Error(), "are for dflash-draft models"))
	_, err = runCLI(t, "mk", "dflash-draft", out, "--tokenizer", testTokenizer, "--mask-token-id", "99")
	is.True(err != nil)
	is.True(strings.Contains(err.Error(), "mask token id 99 is outside the vocabulary of 14"))
}

// draftFixture mirrors a z-lab DFlashDraftModel checkpoint: top-level
// tensor names, Qwen3 layers, fc over 3 captured target layers of hidden 48.
func draftFixture() (map[string]any, []hfTensor) {
	cfg := map[string]any{
		"architectures": []string{"DFlashDraftModel"}, "model_type": "qwen3",
		"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
		"num_key_value_heads": 2, "head_dim": 32, "vocab_size": 16, "rms_norm_eps": 1e-6,
		"max_position_embeddings": 2048, "target_hidden_size": 48,
		"rope_parameters": map[string]any{"rope_type": "default", "rope_theta": 1e7},
		"layer_types":     []string{"sliding_attention", "full_attention"}, "sliding_window": 256,
		"dflash_config": map[string]any{"target_layer_ids": []int{1, 4, 7}, "mask_token_id": 15, "block_size": 16},
	}
	ts := []hfTensor{
		{name: "fc.weight", shape: []int64{64, 3 * 48}},
		{name: "hidden_norm.weight", shape: []int64{64}},
		{name: "norm.weight", shape: []int64{64}},
		{name: "d2t", shape: []int64{16}}, // vocabulary maps some drafts carry
	}
	for i := 0; i < 2; i++ {
		p := fmt.Sprintf("layers.%d.", i)
		ts = append(ts,
			hfTensor{name: p + "input_layernorm.weight", shape: []int64{64}},
			hfTensor{name: p + "post_attention_layernorm.weight", shape: []int64{64}},
			hfTensor{name: p + "self_attn.q_proj.weight", shape: []int64{128, 64}},
			hfTensor{name: p + "self_attn.k_proj.weight", shape: []int64{64, 64}},
			hfTensor{name: p + "self_attn.v_proj.weight", shape: []int64{64, 64}},
			hfTensor{name: p + "self_attn.o_proj.weight", shape: []int64{64, 128}},
			hfTensor{name: p + "self_attn.q_norm.weight", shape: []int64{32}},
			hfTensor{name: p + "self_attn.k_norm.weight", shape: []int64{32}},
			hfTensor{name: p + "mlp.gate_proj.weight", shape: []int64{128, 64}},
			hfTensor{name: p + "mlp.up_proj.weight", shape: []int64{128, 64}},
			hfTensor{name: p + "mlp.down_proj.weight", shape: []int64{64, 128}},
		)
	}
	return cfg, fill(ts)
}

func TestConvertDraft(t *testing.T) {
	is := is.New(t)
	cfg, ts := draftFixture()
	dir := writeHF(t, cfg, ts, "BF16")
	out := filepath.Join(t.TempDir(), "d.gguf")
	mustCLI(t, "convert", dir, out, "--type", "f32")
	f := openGGUF(t, out)
	is.Equal(f.Arch(), "dflash-draft")
	is.NoErr(checkLayout(f))
	ids, _ := f.Int32s("dflash-draft.dflash.target_layer_ids")
	is.Equal(ids, []int32{1, 4, 7})
	feat, _ := f.Uint32("dflash-draft.dflash.n_target_features")
	is.Equal(feat, uint32(144))
	pat, _ := f.Meta("dflash-draft.attention.sliding_window_pattern")
	is.Equal(pat, []bool{true, false})
	theta, _ := f.Float32("dflash-draft.rope.freq_base")
	is.Equal(theta, float32(1e7))
	rename := map[string]string{"fc.weight": "dflash.fc.weight", "hidden_norm.weight": "dflash.hidden_norm.weight",
		"norm.weight": "output_norm.weight", "layers.1.input_layernorm.weight": "blk.1.attn_norm.weight",
		"layers.0.post_attention_layernorm.weight": "blk.0.ffn_norm.weight", "layers.1.self_attn.o_proj.weight": "blk.1.attn_output.weight"}
	for _, x := range ts {
		name, ok := rename[x.name]
		if !ok {
			continue
		}
		got, ti := ggufFloats(t, f, name)
		is.Equal(ti.Dims, reversed(x.shape))
		for i, v := range x.vals { // stored as BF16 in the checkpoint, no value change
			if got[i] != bf16(v) {
				t.Fatalf("%s[%d] = %g, want %g", name, i, got[i], bf16(v))
			}
		}
	}
	_, hasTok := f.Meta("tokenizer.ggml.tokens")
	is.True(hasTok) // the fixture folder has a tokenizer

	cfg["dflash_config"] = map[string]any{"target_layer_ids": []int{1, 4, 7}, "block_size": 16}
	dir = writeHF(t, cfg, ts, "F32")
	_, err := runCLI(t, "convert", dir, filepath.Join(t.TempDir(), "x.gguf"))
	is.True(err != nil)
	is.True(strings.Contains(err.Error(), "no dflash_config.mask_token_id"))
}
