package engine

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"

	"github.com/dflash/dflash_server/sdk/gguf"
)

// DFlash draft files come in several dialects (dflash spec §2): upstream
// llama.cpp's "dflash" architecture (what users download), the pre-merge
// branch of it, and Lucebox's "dflash-draft" / "qwen35-dflash-draft". They
// differ in key prefixes, tensor names and — the trap — the numbering of the
// captured target layers. DraftSpecFromGGUF reads any of them into one
// canonical spec so the native "dflash" architecture has a single loader.

// Draft dialects, as DraftInfo.Dialect names them.
const (
	DialectDFlash   = "dflash"
	DialectPremerge = "dflash-premerge"
	DialectLucebox  = "lucebox"
)

// DraftInfo describes a DFlash draft file, whatever its dialect.
type DraftInfo struct {
	Dialect   string // "dflash" (upstream), "dflash-premerge", "lucebox" (qwen35-dflash-draft / dflash-draft arch)
	BlockSize int
	MaskToken int32 // -1 when the file has none
	// CaptureLayers are the 0-based target layers whose OUTPUT (after the FFN residual) feeds the draft, in feature
	// order. nil when the file gives only their count (PendingCaptures): they are placed by the reference rule once
	// the target's depth is known; AttachTarget then records them in the spec's "dflash.capture_layers".
	CaptureLayers   []int
	PendingCaptures int
	FeatureSize     int // fc input width = len(CaptureLayers) * target hidden
	Hidden          int
	DFlash2         bool
}

// Captures is the number of captured target layers, listed or pending.
func (d DraftInfo) Captures() int {
	if d.CaptureLayers != nil {
		return len(d.CaptureLayers)
	}
	return d.PendingCaptures
}

// ReferenceCaptureLayers is the reference rule for drafts that give only how many target layers they capture:
// round(1 + i·(L − 4)/(N − 1)) for i < N (first 1, last L − 3; N = 1 → L/2) [dflash spec §1.3].
func ReferenceCaptureLayers(targetLayers, n int) []int {
	if n == 1 {
		return []int{targetLayers / 2}
	}
	out := make([]int, n)
	for i := range out {
		out[i] = int(math.Round(1 + float64(i)*float64(targetLayers-4)/float64(n-1)))
	}
	return out
}

// draftMetaInts are the canonical integer keys (after "dflash."), required ones first.
var (
	draftRequiredInts = []string{"block_count", "embedding_length", "feed_forward_length", "attention.head_count"}
	draftOptionalInts = []string{"attention.head_count_kv", "attention.key_length", "context_length", "attention.sliding_window"}
	draftFloats       = []string{"attention.layer_norm_rms_epsilon", "rope.freq_base", "logit_scale", "final_logit_softcapping"}
	dflash2Keys       = []string{"conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"}
	draftLayerTensors = []string{"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
		"ffn_norm", "ffn_gate", "ffn_up", "ffn_down"}
	dflash2LayerTensors = []string{"attn_conv_base", "ffn_conv_base", "attn_conv_proj.weight", "ffn_conv_proj.weight"}
	dflash2Tensors      = []string{"selector_predecessor.weight", "selector_successor.weight", "selector_hidden.weight"}
	blkName             = regexp.MustCompile(`^blk\.(\d+)\.(.+)$`)
)

// DraftSpecFromGGUF reads a draft in any dialect into the canonical spec the native "dflash" architecture loads:
// Arch "dflash", hyperparameters under "dflash.*" (integers as int64, floats as float32, the sliding-window pattern
// as []int64 of 0/1, attention.causal as int64 0/1) and upstream tensor names. Tensors are views of f's mapping.
func DraftSpecFromGGUF(f *gguf.File) (ModelSpec, DraftInfo, error) {
	arch := f.Arch()
	info := DraftInfo{MaskToken: -1, BlockSize: 16}
	var src string // prefix of the file's dflash keys
	switch arch {
	case "dflash":
		src = "dflash."
		switch {
		case hasKey(f, "dflash.target_layers"):
			info.Dialect = DialectDFlash
		case hasKey(f, "dflash.target_layer_ids"):
			info.Dialect = DialectPremerge
		default:
			return ModelSpec{}, info, fmt.Errorf("dflash draft: no %q (nor the pre-merge %q): the captured target layers are unknown", "dflash.target_layers", "dflash.target_layer_ids")
		}
	case "dflash-draft", "qwen35-dflash-draft":
		src = arch + ".dflash."
		info.Dialect = DialectLucebox
	case "":
		return ModelSpec{}, info, fmt.Errorf("not a DFlash draft: no %s", gguf.KeyArchitecture)
	default:
		return ModelSpec{}, info, fmt.Errorf("not a DFlash draft: architecture %q (want dflash, dflash-draft or qwen35-dflash-draft)", arch)
	}
	p := arch + "."
	spec := ModelSpec{Arch: "dflash", Meta: map[string]any{}}

	// Hyperparameters: the same Qwen3 keys under every dialect's prefix.
	for i, k := range append(append([]string(nil), draftRequiredInts...), draftOptionalInts...) {
		v, err := f.Int64(p + k)
		if err != nil {
			if i < len(draftRequiredInts) || hasKey(f, p+k) {
				return ModelSpec{}, info, fmt.Errorf("%s draft: %w", arch, err)
			}
			continue
		}
		spec.Meta["dflash."+k] = v
	}
	for _, k := range draftFloats {
		v, err := f.Float32(p + k)
		if err != nil {
			if k == "rope.freq_base" || hasKey(f, p+k) { // without it RoPE silently goes wrong (§2.1)
				return ModelSpec{}, info, fmt.Errorf("%s draft: %w", arch, err)
			}
			continue
		}
		spec.Meta["dflash."+k] = v
	}
	hidden := int(spec.Meta["dflash.embedding_length"].(int64))
	heads := spec.Meta["dflash.attention.head_count"].(int64)
	layers := int(spec.Meta["dflash.block_count"].(int64))
	if _, ok := spec.Meta["dflash.attention.head_count_kv"]; !ok {
		spec.Meta["dflash.attention.head_count_kv"] = heads
	}
	if _, ok := spec.Meta["dflash.attention.key_length"]; !ok && heads > 0 {
		spec.Meta["dflash.attention.key_length"] = int64(hidden) / heads
	}
	if _, ok := spec.Meta["dflash.attention.layer_norm_rms_epsilon"]; !ok {
		spec.Meta["dflash.attention.layer_norm_rms_epsilon"] = float32(1e-6)
	}
	info.Hidden = hidden
	if v, ok := f.Meta(p + "attention.sliding_window_pattern"); ok {
		pat, ok := v.([]bool)
		if !ok || len(pat) != layers {
			return ModelSpec{}, info, fmt.Errorf("%s draft: %sattention.sliding_window_pattern must be %d bools, one per layer", arch, p, layers)
		}
		ints := make([]int64, len(pat))
		for i, b := range pat {
			if b {
				ints[i] = 1
			}
		}
		spec.Meta["dflash.attention.sliding_window_pattern"] = ints
	}
	if hasKey(f, p+"attention.causal") {
		b, err := f.Bool(p + "attention.causal")
		if err != nil {
			return ModelSpec{}, info, fmt.Errorf("%s draft: %w", arch, err)
		}
		spec.Meta["dflash.attention.causal"] = boolInt(b)
	}

	// Block size and mask token.
	if hasKey(f, src+"block_size") {
		v, err := f.Int64(src + "block_size")
		if err != nil || v <= 0 {
			return ModelSpec{}, info, fmt.Errorf("%s draft: %sblock_size must be a positive integer", arch, src)
		}
		info.BlockSize = int(v)
	}
	spec.Meta["dflash.block_size"] = int64(info.BlockSize)
	for _, k := range []string{"tokenizer.ggml.mask_token_id", p + "mask_token_id", p + "dflash.mask_token_id"} {
		if hasKey(f, k) {
			v, err := f.Int32(k)
			if err != nil || v < 0 {
				return ModelSpec{}, info, fmt.Errorf("%s draft: %s must be a token id", arch, k)
			}
			info.MaskToken = v
			break
		}
	}

	// Captured layers: upstream and pre-merge store the layer whose input is captured (HF id + 1); Lucebox stores
	// the HF id, i.e. the layer whose output is captured.
	shift, key := 0, src+"target_layer_ids"
	switch info.Dialect {
	case DialectDFlash:
		shift, key = 1, "dflash.target_layers"
	case DialectPremerge:
		shift = 1
	}
	if hasKey(f, key) {
		ids, err := f.Int32s(key)
		if err != nil {
			return ModelSpec{}, info, fmt.Errorf("%s draft: %w", arch, err)
		}
		if len(ids) == 0 {
			return ModelSpec{}, info, fmt.Errorf("%s draft: %s is empty", arch, key)
		}
		info.CaptureLayers = make([]int, len(ids))
		for i, id := range ids {
			c := int(id) - shift
			if c < 0 {
				return ModelSpec{}, info, fmt.Errorf("%s draft: %s %v captures the embeddings (value %d), which the engine does not expose", arch, key, ids, id)
			}
			info.CaptureLayers[i] = c
		}
	} else if n, err := f.Int64(src + "n_target_layers"); err == nil && n > 0 {
		info.PendingCaptures = int(n)
	} else {
		return ModelSpec{}, info, fmt.Errorf("%s draft: neither %s nor %sn_target_layers says which target layers are captured", arch, key, src)
	}

	// DFlash2 extras.
	for _, k := range dflash2Keys {
		if v, err := f.Int64(p + k); err == nil {
			spec.Meta["dflash."+k] = v
			info.DFlash2 = true
		}
	}

	// Tensors: canonical names, each exactly once.
	canon := map[string]string{"fc.weight": "fc.weight", "enc.output_norm.weight": "enc.output_norm.weight",
		"output_norm.weight": "output_norm.weight", "token_embd.weight": "token_embd.weight", "output.weight": "output.weight"}
	switch info.Dialect {
	case DialectPremerge:
		canon["hidden_norm.weight"] = "enc.output_norm.weight"
		delete(canon, "enc.output_norm.weight")
	case DialectLucebox:
		for _, a := range []string{"dflash.fc.weight", "dflash_fc.weight"} {
			canon[a] = "fc.weight"
		}
		for _, a := range []string{"dflash.hidden_norm.weight", "dflash_hidden_norm.weight"} {
			canon[a] = "enc.output_norm.weight"
		}
		delete(canon, "fc.weight")
		delete(canon, "enc.output_norm.weight")
	}
	if info.DFlash2 {
		for _, n := range dflash2Tensors {
			canon[n] = n
		}
	}
	layerOK := map[string]string{}
	for _, n := range draftLayerTensors {
		layerOK[n+".weight"] = n + ".weight"
	}
	if info.Dialect == DialectLucebox {
		layerOK["post_attention_norm.weight"] = "ffn_norm.weight"
	}
	if info.DFlash2 {
		for _, n := range dflash2LayerTensors {
			layerOK[n] = n
		}
	}
	seen := map[string]bool{}
	for _, t := range f.Tensors() {
		name, ok := canon[t.Name]
		if m := blkName.FindStringSubmatch(t.Name); m != nil {
			il, _ := strconv.Atoi(m[1])
			if r, known := layerOK[m[2]]; known && il < layers {
				name, ok = "blk."+m[1]+"."+r, true
			}
		}
		if !ok {
			return ModelSpec{}, info, fmt.Errorf("%s draft: tensor %q is not part of a DFlash draft the engine runs (DSpark heads, reduced vocabularies and attention sinks are not supported)", arch, t.Name)
		}
		if seen[name] {
			return ModelSpec{}, info, fmt.Errorf("%s draft: tensor %q is given twice (as %q and an alias)", arch, name, t.Name)
		}
		seen[name] = true
		data, err := f.TensorData(t.Name)
		if err != nil {
			return ModelSpec{}, info, fmt.Errorf("%s draft: %w", arch, err)
		}
		spec.Tensors = append(spec.Tensors, Tensor{Name: name, Type: t.Type, Dims: t.Dims, Data: data})
	}
	need := []string{"fc.weight", "enc.output_norm.weight", "output_norm.weight"}
	for il := 0; il < layers; il++ {
		for _, n := range draftLayerTensors {
			need = append(need, fmt.Sprintf("blk.%d.%s.weight", il, n))
		}
		if info.DFlash2 {
			for _, n := range dflash2LayerTensors {
				need = append(need, fmt.Sprintf("blk.%d.%s", il, n))
			}
		}
	}
	if info.DFlash2 {
		need = append(need, dflash2Tensors...)
	}
	for _, n := range need {
		if !seen[n] {
			return ModelSpec{}, info, fmt.Errorf("%s draft (%s dialect): missing tensor %q", arch, info.Dialect, n)
		}
	}
	fc := spec.tensor("fc.weight")
	if len(fc.Dims) != 2 || int(fc.Dims[1]) != hidden {
		return ModelSpec{}, info, fmt.Errorf("%s draft: fc has dims %v, want [features, %d]", arch, fc.Dims, hidden)
	}
	info.FeatureSize = int(fc.Dims[0])
	if n := info.Captures(); info.FeatureSize%n != 0 {
		return ModelSpec{}, info, fmt.Errorf("%s draft: fc input width %d is not a multiple of the %d captured layers", arch, info.FeatureSize, n)
	}
	if v, err := f.Int64(src + "n_target_features"); err == nil && int(v) != info.FeatureSize {
		return ModelSpec{}, info, fmt.Errorf("%s draft: %sn_target_features = %d but fc takes %d", arch, src, v, info.FeatureSize)
	}
	if info.CaptureLayers != nil {
		spec.Meta["dflash.capture_layers"] = ints64(info.CaptureLayers)
	}
	return spec, info, nil
}

// AttachTarget adds the target's embedding and LM head to a draft spec (tensors "token_embd.weight" and
// "output.weight"; a tied target's token_embd serves as output) after checking the draft fits the target: same
// hidden size, FeatureSize == len(CaptureLayers)*target hidden, every capture layer < target block_count. Capture
// layers the draft only counted are placed by the reference rule and recorded as "dflash.capture_layers". The
// target file must stay open while the spec is used. A draft's own embedding or head (newer files) is kept.
func (s *ModelSpec) AttachTarget(target *gguf.File, info DraftInfo) error {
	if s.Arch != "dflash" {
		return fmt.Errorf("attach target: spec is a %q model, not a dflash draft", s.Arch)
	}
	ta := target.Arch()
	if ta == "" {
		return fmt.Errorf("target: no %s", gguf.KeyArchitecture)
	}
	tp := ta + "."
	hidden, err := target.Int64(tp + "embedding_length")
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	blocks, err := target.Int64(tp + "block_count")
	if err != nil {
		return fmt.Errorf("target: %w", err)
	}
	mtp, _ := target.Int64(tp + "nextn_predict_layers") // MTP blocks sit after the trunk and are never captured
	depth := int(blocks - mtp)
	if int(hidden) != info.Hidden {
		return fmt.Errorf("target: %sembedding_length = %d, the draft's hidden size is %d", tp, hidden, info.Hidden)
	}
	captures := info.CaptureLayers
	if captures == nil {
		if info.PendingCaptures <= 0 {
			return errors.New("attach target: the draft info lists no capture layers")
		}
		if depth < 4 {
			return fmt.Errorf("target: %d layers, too few to place %d captured layers by the reference rule", depth, info.PendingCaptures)
		}
		captures = ReferenceCaptureLayers(depth, info.PendingCaptures)
	}
	if want := len(captures) * int(hidden); info.FeatureSize != want {
		return fmt.Errorf("draft fc takes %d features, but %d captured layers of the target's hidden size %d give %d", info.FeatureSize, len(captures), hidden, want)
	}
	for _, c := range captures {
		if c < 0 || c >= depth {
			return fmt.Errorf("draft captures target layer %d, but the target has %d layers (%sblock_count)", c, depth, tp)
		}
	}
	embd, ok := target.Tensor("token_embd.weight")
	if !ok {
		return fmt.Errorf("target: no tensor %q", "token_embd.weight")
	}
	if len(embd.Dims) != 2 || int64(embd.Dims[0]) != hidden {
		return fmt.Errorf("target: token_embd.weight has dims %v, want [%d, vocab]", embd.Dims, hidden)
	}
	if info.MaskToken >= 0 && uint64(info.MaskToken) >= embd.Dims[1] {
		return fmt.Errorf("draft mask token %d is outside the target's vocabulary of %d", info.MaskToken, embd.Dims[1])
	}
	head := "output.weight"
	if _, ok := target.Tensor(head); !ok {
		head = "token_embd.weight" // tied embeddings
	}
	for _, add := range []struct{ as, from string }{{"token_embd.weight", "token_embd.weight"}, {"output.weight", head}} {
		if s.tensor(add.as).Name != "" {
			continue
		}
		ti, _ := target.Tensor(add.from)
		data, err := target.TensorData(add.from)
		if err != nil {
			return fmt.Errorf("target: %w", err)
		}
		s.Tensors = append(s.Tensors, Tensor{Name: add.as, Type: ti.Type, Dims: ti.Dims, Data: data})
	}
	s.Meta["dflash.capture_layers"] = ints64(captures)
	return nil
}

// tensor returns the named tensor, or a zero Tensor.
func (s *ModelSpec) tensor(name string) Tensor {
	for _, t := range s.Tensors {
		if t.Name == name {
			return t
		}
	}
	return Tensor{}
}

func hasKey(f *gguf.File, key string) bool {
	_, ok := f.Meta(key)
	return ok
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func ints64(v []int) []int64 {
	out := make([]int64, len(v))
	for i, x := range v {
		out[i] = int64(x)
	}
	return out
}
