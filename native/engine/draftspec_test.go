package engine

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk/gguf"
)

// Draft test files: 2 layers, hidden 16, 2 heads × 8 (1 KV head), FFN 32, capturing layers 1 and 5 (0-based
// outputs) of an 8-layer target with hidden 16 and vocabulary 24.
const (
	dH, dFF, dHD, dLayers = 16, 32, 8, 2
	tLayers, tVocab       = 8, 24
)

type ggufTensor struct {
	name string
	dims []uint64
	data []byte
}

// f32Tensor is a tensor of random F32 values (the same for a name whatever the dialect calls it).
func f32Tensor(name, seedName string, dims ...uint64) ggufTensor {
	n := uint64(1)
	for _, d := range dims {
		n *= d
	}
	var seed uint64
	for _, c := range seedName {
		seed = seed*131 + uint64(c)
	}
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, 4*n)
	for i := uint64(0); i < n; i++ {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(r.Float32()-0.5))
	}
	return ggufTensor{name, dims, b}
}

func writeGGUF(t *testing.T, kvs [][2]any, ts []ggufTensor) *gguf.File {
	t.Helper()
	var buf bytes.Buffer
	w := gguf.NewWriter(&buf)
	for _, kv := range kvs {
		if err := w.AddKV(kv[0].(string), kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	for _, x := range ts {
		if err := w.AddTensor(x.name, gguf.F32, x.dims); err != nil {
			t.Fatal(err)
		}
	}
	for _, x := range ts {
		if err := w.WriteTensorData(x.name, x.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// draftFile describes one dialect's spelling of the same draft.
type draftFile struct {
	arch, keyPrefix        string // keyPrefix: where the dflash-specific keys live
	layersKey              string // the capture list's key ("" for count only)
	layers                 []int32
	maskKey                string
	fc, hiddenNorm, ffnNrm string
	dflash2                bool
	edit                   func(kvs [][2]any, ts []ggufTensor) ([][2]any, []ggufTensor)
}

func (d draftFile) build(t *testing.T) *gguf.File {
	p := d.arch + "."
	kvs := [][2]any{
		{"general.architecture", d.arch},
		{p + "block_count", uint32(dLayers)}, {p + "context_length", uint32(4096)}, {p + "embedding_length", uint32(dH)},
		{p + "feed_forward_length", uint32(dFF)}, {p + "attention.head_count", uint32(2)}, {p + "attention.head_count_kv", uint32(1)},
		{p + "attention.key_length", uint32(dHD)}, {p + "attention.value_length", uint32(dHD)},
		{p + "attention.layer_norm_rms_epsilon", float32(1e-6)}, {p + "rope.freq_base", float32(1e7)},
		{p + "attention.sliding_window", uint32(64)}, {p + "attention.sliding_window_pattern", []bool{true, false}},
		{d.keyPrefix + "block_size", uint32(8)},
		{d.maskKey, uint32(tVocab - 1)},
	}
	if d.layersKey != "" {
		kvs = append(kvs, [2]any{d.layersKey, d.layers})
	} else {
		kvs = append(kvs, [2]any{d.keyPrefix + "n_target_layers", uint32(2)})
	}
	ts := []ggufTensor{
		f32Tensor(d.fc, "fc", 2*dH, dH),
		f32Tensor(d.hiddenNorm, "hidden_norm", dH),
		f32Tensor("output_norm.weight", "output_norm", dH),
	}
	if d.dflash2 {
		kvs = append(kvs, [2]any{p + "conv_kernel_size", uint32(2)}, [2]any{p + "conv_group_size", uint32(4)},
			[2]any{p + "selector_rank", uint32(4)}, [2]any{p + "selector_top_k", uint32(2)}, [2]any{p + "attention.causal", false})
		ts = append(ts, f32Tensor("selector_predecessor.weight", "sp", 4, tVocab), f32Tensor("selector_successor.weight", "ss", 4, tVocab),
			f32Tensor("selector_hidden.weight", "sh", dH, 4))
	}
	for il := 0; il < dLayers; il++ {
		b := fmt.Sprintf("blk.%d.", il)
		for _, x := range []struct {
			n    string
			dims []uint64
		}{
			{"attn_norm.weight", []uint64{dH}}, {"attn_q.weight", []uint64{dH, 2 * dHD}}, {"attn_k.weight", []uint64{dH, dHD}},
			{"attn_v.weight", []uint64{dH, dHD}}, {"attn_output.weight", []uint64{2 * dHD, dH}}, {"attn_q_norm.weight", []uint64{dHD}},
			{"attn_k_norm.weight", []uint64{dHD}}, {"ffn_norm.weight", []uint64{dH}}, {"ffn_gate.weight", []uint64{dH, dFF}},
			{"ffn_up.weight", []uint64{dH, dFF}}, {"ffn_down.weight", []uint64{dFF, dH}},
		} {
			name := b + x.n
			if x.n == "ffn_norm.weight" {
				name = b + d.ffnNrm
			}
			ts = append(ts, f32Tensor(name, b+x.n, x.dims...))
		}
		if d.dflash2 {
			ts = append(ts, f32Tensor(b+"attn_conv_base", b+"acb", dH, 2, 2), f32Tensor(b+"ffn_conv_base", b+"fcb", dH, 2, 2),
				f32Tensor(b+"attn_conv_proj.weight", b+"acp", dH, 16), f32Tensor(b+"ffn_conv_proj.weight", b+"fcp", dH, 16))
		}
	}
	if d.edit != nil {
		kvs, ts = d.edit(kvs, ts)
	}
	return writeGGUF(t, kvs, ts)
}

func upstreamDraft() draftFile {
	return draftFile{arch: "dflash", keyPrefix: "dflash.", layersKey: "dflash.target_layers", layers: []int32{2, 6},
		maskKey: "tokenizer.ggml.mask_token_id", fc: "fc.weight", hiddenNorm: "enc.output_norm.weight", ffnNrm: "ffn_norm.weight"}
}

func targetFile(t *testing.T, arch string, hidden, layers int, tied bool) *gguf.File {
	p := arch + "."
	kvs := [][2]any{{"general.architecture", arch}, {p + "embedding_length", uint32(hidden)}, {p + "block_count", uint32(layers)}}
	ts := []ggufTensor{f32Tensor("token_embd.weight", "embd", uint64(hidden), tVocab)}
	if !tied {
		ts = append(ts, f32Tensor("output.weight", "head", uint64(hidden), tVocab))
	}
	return writeGGUF(t, kvs, ts)
}

// canonical renders a spec for comparison: meta, and tensors by name with dims and a checksum of the bytes.
func canonical(s ModelSpec) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %v\n", s.Arch, s.Meta)
	names := map[string]Tensor{}
	var order []string
	for _, t := range s.Tensors {
		names[t.Name] = t
		order = append(order, t.Name)
	}
	slices.Sort(order)
	for _, n := range order {
		t := names[n]
		var sum uint64
		for _, c := range t.Data {
			sum = sum*31 + uint64(c)
		}
		fmt.Fprintf(&b, "%s %v %v %x\n", n, t.Type, t.Dims, sum)
	}
	return b.String()
}

func TestDraftSpecDialects(t *testing.T) {
	want := upstreamDraft()
	wantSpec, wantInfo, err := DraftSpecFromGGUF(want.build(t))
	if err != nil {
		t.Fatal(err)
	}
	d2 := upstreamDraft()
	d2.dflash2 = true
	tests := []struct {
		name    string
		file    draftFile
		dialect string
	}{
		{"upstream", want, DialectDFlash},
		{"premerge", draftFile{arch: "dflash", keyPrefix: "dflash.", layersKey: "dflash.target_layer_ids", layers: []int32{2, 6},
			maskKey: "dflash.mask_token_id", fc: "fc.weight", hiddenNorm: "hidden_norm.weight", ffnNrm: "ffn_norm.weight"}, DialectPremerge},
		{"lucebox dflash-draft", draftFile{arch: "dflash-draft", keyPrefix: "dflash-draft.dflash.", layersKey: "dflash-draft.dflash.target_layer_ids",
			layers: []int32{1, 5}, maskKey: "dflash-draft.dflash.mask_token_id", fc: "dflash.fc.weight", hiddenNorm: "dflash.hidden_norm.weight",
			ffnNrm: "ffn_norm.weight"}, DialectLucebox},
		{"lucebox qwen35 aliases", draftFile{arch: "qwen35-dflash-draft", keyPrefix: "qwen35-dflash-draft.dflash.",
			layersKey: "qwen35-dflash-draft.dflash.target_layer_ids", layers: []int32{1, 5}, maskKey: "qwen35-dflash-draft.dflash.mask_token_id",
			fc: "dflash_fc.weight", hiddenNorm: "dflash_hidden_norm.weight", ffnNrm: "post_attention_norm.weight"}, DialectLucebox},
		{"lucebox count only", draftFile{arch: "dflash-draft", keyPrefix: "dflash-draft.dflash.", maskKey: "dflash-draft.dflash.mask_token_id",
			fc: "dflash.fc.weight", hiddenNorm: "dflash.hidden_norm.weight", ffnNrm: "ffn_norm.weight"}, DialectLucebox},
	}
	target := targetFile(t, "qwen3", dH, tLayers, true)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			spec, info, err := DraftSpecFromGGUF(tt.file.build(t))
			is.NoErr(err)
			is.Equal(info.Dialect, tt.dialect)
			is.Equal(info.BlockSize, 8)
			is.Equal(info.MaskToken, int32(tVocab-1))
			is.Equal(info.FeatureSize, 2*dH)
			is.Equal(info.Hidden, dH)
			if tt.file.layersKey == "" {
				is.Equal(info.CaptureLayers, nil)
				is.Equal(info.PendingCaptures, 2)
			} else {
				is.Equal(info.CaptureLayers, []int{1, 5}) // one numbering, whatever the file stores
				is.Equal(canonical(spec), canonical(wantSpec))
			}
			is.NoErr(spec.AttachTarget(target, info))
			is.Equal(spec.Meta["dflash.capture_layers"], []int64{1, 5}) // the reference rule gives the same for 8 layers
			ws := wantSpec
			ws.Tensors = append([]Tensor(nil), wantSpec.Tensors...)
			ws.Meta = map[string]any{}
			for k, v := range wantSpec.Meta {
				ws.Meta[k] = v
			}
			is.NoErr(ws.AttachTarget(target, wantInfo))
			is.Equal(canonical(spec), canonical(ws))
		})
	}
	t.Run("canonical keys", func(t *testing.T) {
		is := is.New(t)
		is.Equal(wantSpec.Arch, "dflash")
		is.Equal(wantSpec.Meta["dflash.attention.sliding_window_pattern"], []int64{1, 0})
		is.Equal(wantSpec.Meta["dflash.attention.head_count_kv"], int64(1))
		is.Equal(wantSpec.Meta["dflash.rope.freq_base"], float32(1e7))
		is.Equal(len(wantSpec.Tensors), 3+dLayers*11)
	})
	t.Run("dflash2", func(t *testing.T) {
		is := is.New(t)
		spec, info, err := DraftSpecFromGGUF(d2.build(t))
		is.NoErr(err)
		is.True(info.DFlash2)
		is.Equal(spec.Meta["dflash.selector_top_k"], int64(2))
		is.Equal(spec.Meta["dflash.attention.causal"], int64(0))
		is.Equal(len(spec.Tensors), 3+3+dLayers*15)
	})
}

func TestDraftSpecErrors(t *testing.T) {
	drop := func(key, tensor string) func([][2]any, []ggufTensor) ([][2]any, []ggufTensor) {
		return func(kvs [][2]any, ts []ggufTensor) ([][2]any, []ggufTensor) {
			var k2 [][2]any
			for _, kv := range kvs {
				if kv[0] != key {
					k2 = append(k2, kv)
				}
			}
			var t2 []ggufTensor
			for _, x := range ts {
				if x.name != tensor {
					t2 = append(t2, x)
				}
			}
			return k2, t2
		}
	}
	extra := func(kvs [][2]any, ts []ggufTensor) ([][2]any, []ggufTensor) {
		return kvs, append(ts, f32Tensor("d2t", "d2t", 4))
	}
	tests := []struct {
		name string
		edit func([][2]any, []ggufTensor) ([][2]any, []ggufTensor)
		want string
	}{
		{"no capture list", drop("dflash.target_layers", ""), `no "dflash.target_layers"`},
		{"no rope base", drop("dflash.rope.freq_base", ""), "dflash.rope.freq_base"},
		{"missing tensor", drop("", "blk.1.ffn_up.weight"), `missing tensor "blk.1.ffn_up.weight"`},
		{"unknown tensor", extra, `tensor "d2t" is not part of a DFlash draft`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := upstreamDraft()
			d.edit = tt.edit
			_, _, err := DraftSpecFromGGUF(d.build(t))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to say %q", err, tt.want)
			}
		})
	}
	t.Run("not a draft", func(t *testing.T) {
		_, _, err := DraftSpecFromGGUF(targetFile(t, "qwen3", dH, tLayers, true))
		if err == nil || !strings.Contains(err.Error(), `not a DFlash draft: architecture "qwen3"`) {
			t.Fatalf("error %v", err)
		}
	})
}

func TestAttachTargetErrors(t *testing.T) {
	fourLayers := upstreamDraft()
	fourLayers.layers = []int32{2, 3, 4, 6} // fc still takes 2 · hidden
	tests := []struct {
		name   string
		draft  draftFile
		target *gguf.File
		want   string
	}{
		{"hidden", upstreamDraft(), targetFile(t, "qwen3", 2*dH, tLayers, false), "qwen3.embedding_length = 32, the draft's hidden size is 16"},
		{"depth", upstreamDraft(), targetFile(t, "qwen3", dH, 5, false), "draft captures target layer 5, but the target has 5 layers (qwen3.block_count)"},
		{"features", fourLayers, targetFile(t, "qwen3", dH, tLayers, false), "draft fc takes 32 features, but 4 captured layers"},
		{"no embedding", upstreamDraft(), writeGGUF(t, [][2]any{{"general.architecture", "qwen3"}, {"qwen3.embedding_length", uint32(dH)},
			{"qwen3.block_count", uint32(tLayers)}}, nil), `target: no tensor "token_embd.weight"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, info, err := DraftSpecFromGGUF(tt.draft.build(t))
			if err != nil {
				t.Fatal(err)
			}
			err = spec.AttachTarget(tt.target, info)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to say %q", err, tt.want)
			}
		})
	}
	t.Run("untied head", func(t *testing.T) {
		is := is.New(t)
		spec, info, err := DraftSpecFromGGUF(upstreamDraft().build(t))
		is.NoErr(err)
		is.NoErr(spec.AttachTarget(targetFile(t, "qwen3", dH, tLayers, false), info))
		out := spec.tensor("output.weight")
		embd := spec.tensor("token_embd.weight")
		is.True(!bytes.Equal(out.Data, embd.Data)) // the target's own head, not its embedding
	})
}
