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

// TestMkDraftLucebox: mk still writes the Lucebox dialect when asked by
// its architecture name (unshifted ids, prefixed keys and tensors).
func TestMkDraftLucebox(t *testing.T) {
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
	is.True(strings.Contains(err.Error(), "are for DFlash draft models"))
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
		"max_position_embeddings": 2048, "target_hidden_size": 64,
		"rope_parameters": map[string]any{"rope_type": "default", "rope_theta": 1e7},
		"layer_types":     []string{"sliding_attention", "full_attention"}, "sliding_window": 256,
		"dflash_config": map[string]any{"target_layer_ids": []int{1, 4, 7}, "mask_token_id": 15, "block_size": 16},
	}
	ts := []hfTensor{
		{name: "fc.weight", shape: []int64{64, 3 * 64}},
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
	is.Equal(f.Arch(), "dflash")
	is.NoErr(checkLayout(f))
	ids, _ := f.Int32s("dflash.target_layers")
	is.Equal(ids, []int32{2, 5, 8}) // HF ids + 1, as upstream stores them
	mask, _ := f.Uint32("tokenizer.ggml.mask_token_id")
	is.Equal(mask, uint32(15))
	pat, _ := f.Meta("dflash.attention.sliding_window_pattern")
	is.Equal(pat, []bool{true, false})
	theta, _ := f.Float32("dflash.rope.freq_base")
	is.Equal(theta, float32(1e7))
	fc, _ := f.Tensor("fc.weight")
	is.Equal(fc.Dims, []uint64{192, 64})
	rename := map[string]string{"fc.weight": "fc.weight", "hidden_norm.weight": "enc.output_norm.weight",
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

// TestMkDraftUpstream: mk dflash writes the upstream llama.cpp format, with
// the target's tokenizer, vocabulary, hidden size and depth from --target.
func TestMkDraftUpstream(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target.gguf")
	mustCLI(t, "mk", "qwen3", target, "--tokenizer", testTokenizer, "--layers", "12", "--hidden", "64", "--vocab", "20")

	tests := []struct {
		name     string
		args     []string
		tensors  int
		wantIDs  []int32
		wantKeys map[string]uint32
	}{
		{"v1", []string{"--layers", "3", "--target-layers", "2", "--sliding-window", "64"}, 3 + 3*11, []int32{2, 10},
			map[string]uint32{"dflash.block_size": 16, "dflash.embedding_length": 64, "dflash.block_count": 3,
				"dflash.attention.sliding_window": 64, "tokenizer.ggml.mask_token_id": 19}},
		{"dflash2", []string{"--layers", "2", "--dflash2", "--selector-top-k", "4", "--mask-token-id", "7"}, 3 + 3 + 2*15, []int32{2, 10},
			map[string]uint32{"dflash.block_size": 8, "dflash.conv_kernel_size": 2, "dflash.conv_group_size": 16,
				"dflash.selector_rank": 32, "dflash.selector_top_k": 4, "tokenizer.ggml.mask_token_id": 7}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			out := filepath.Join(dir, tt.name+".gguf")
			mustCLI(t, append([]string{"mk", "dflash", out, "--target", target, "--type", "q8_0"}, tt.args...)...)
			f := openGGUF(t, out)
			is.Equal(f.Arch(), "dflash")
			is.NoErr(checkLayout(f))
			is.Equal(len(f.Tensors()), tt.tensors)
			ids, err := f.Int32s("dflash.target_layers")
			is.NoErr(err)
			is.Equal(ids, tt.wantIDs) // HF {1, 9} of a 12-layer target, + 1
			for key, want := range tt.wantKeys {
				got, err := f.Uint32(key)
				is.NoErr(err)
				is.Equal(got, want) // key
			}
			toks, err := f.Strings("tokenizer.ggml.tokens")
			is.NoErr(err)
			is.Equal(len(toks), 20) // the target's padded vocabulary, copied
			for _, name := range []string{"fc.weight", "enc.output_norm.weight", "output_norm.weight", "blk.0.attn_q.weight"} {
				_, ok := f.Tensor(name)
				is.True(ok) // name
			}
			for _, name := range []string{"token_embd.weight", "output.weight", "dflash.fc.weight"} {
				_, ok := f.Tensor(name)
				is.True(!ok) // name
			}
			var buf strings.Builder
			is.NoErr(inspect(&buf, out, f, false, false, true))
			is.True(strings.Contains(buf.String(), "dialect dflash (upstream llama.cpp)"))
			is.True(strings.Contains(buf.String(), "capture   target layers [1 9]"))
		})
	}
	if f := openGGUF(t, filepath.Join(dir, "dflash2.gguf")); true {
		base, _ := f.Tensor("blk.1.ffn_conv_base")
		is.New(t).Equal(base.Dims, []uint64{64, 2, 2})
		is.New(t).Equal(base.Type.String(), "F32") // multiplied element-wise upstream
		sel, _ := f.Tensor("selector_predecessor.weight")
		is.New(t).Equal(sel.Dims, []uint64{32, 20})
	}

	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--target", target, "--tokenizer", testTokenizer}, "use one"},
		{[]string{"--target", target, "--target-depth", "10"}, "contradicts --target"},
		{[]string{"--target", target, "--hidden", "96"}, "differs from the draft's 96"},
		{[]string{"--target", target, "--dflash2", "--selector-top-k", "8"}, "too small for selector top-k 8"},
		{[]string{"--tokenizer", testTokenizer, "--selector-rank", "4"}, "need --dflash2"},
		{[]string{}, "--tokenizer is required"},
	} {
		_, err := runCLI(t, append([]string{"mk", "dflash", filepath.Join(dir, "x.gguf")}, bad.args...)...)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("mk dflash %v: error %v, want it to say %q", bad.args, err, bad.want)
		}
	}
}

// TestConvertDFlash2 converts a DFlash2DraftModel fixture (reference
// checkpoint names, §5.1) and copies the tokenizer from --target.
func TestConvertDFlash2(t *testing.T) {
	is := is.New(t)
	cfg, ts := draftFixture()
	cfg["architectures"] = []string{"DFlash2DraftModel"}
	cfg["is_causal"] = false
	cfg["dflash_config"] = map[string]any{"target_layer_ids": []int{1, 4, 7}, "mask_token_id": 15, "block_size": 8,
		"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 4}
	ts = append(ts,
		hfTensor{name: "candidate_selector.predecessor_codebook", shape: []int64{16, 8}},
		hfTensor{name: "candidate_selector.successor_codebook", shape: []int64{16, 8}},
		hfTensor{name: "candidate_selector.hidden_projection.weight", shape: []int64{8, 64}},
	)
	for i := 0; i < 2; i++ {
		for _, m := range []string{"attention_conv", "mlp_conv"} {
			p := fmt.Sprintf("layers.%d.%s.", i, m)
			ts = append(ts,
				hfTensor{name: p + "base_kernel", shape: []int64{2, 2, 64}},
				hfTensor{name: p + "kernel_projection.weight", shape: []int64{2 * 2 * 4, 64}})
		}
	}
	dir := writeHF(t, cfg, fill(ts), "F32")
	target := filepath.Join(t.TempDir(), "target.gguf")
	mustCLI(t, "mk", "qwen3", target, "--tokenizer", testTokenizer, "--layers", "10", "--hidden", "64", "--vocab", "16")
	out := filepath.Join(t.TempDir(), "d2.gguf")
	mustCLI(t, "convert", dir, out, "--type", "f32", "--target", target)
	f := openGGUF(t, out)
	is.NoErr(checkLayout(f))
	causal, err := f.Bool("dflash.attention.causal")
	is.NoErr(err)
	is.True(!causal)
	k, _ := f.Uint32("dflash.selector_top_k")
	is.Equal(k, uint32(4))
	proj, _ := f.Tensor("blk.1.attn_conv_proj.weight")
	is.Equal(proj.Dims, []uint64{64, 16})
	base, _ := f.Tensor("blk.0.ffn_conv_base")
	is.Equal(base.Dims, []uint64{64, 2, 2})
	toks, _ := f.Strings("tokenizer.ggml.tokens")
	is.Equal(len(toks), 16)

	small := filepath.Join(t.TempDir(), "small.gguf")
	mustCLI(t, "mk", "qwen3", small, "--tokenizer", testTokenizer, "--layers", "6", "--hidden", "64", "--vocab", "16")
	_, err = runCLI(t, "convert", dir, filepath.Join(t.TempDir(), "x.gguf"), "--target", small)
	is.True(err != nil)
	is.True(strings.Contains(err.Error(), "has 6 layers, the draft captures layer 7"))
}
