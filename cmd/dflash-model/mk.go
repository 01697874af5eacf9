package main

import (
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strings"

	"github.com/dflash/dflash_server/sdk/gguf"
)

type mkCmd struct {
	Arch      string `arg:"" help:"Architecture: qwen3, qwen35, deepseek4, dflash (a DFlash draft in the upstream llama.cpp format) or dflash-draft (a DFlash draft in the Lucebox dialect)."`
	Out       string `arg:"" help:"Output GGUF file."`
	Tokenizer string `help:"Hugging Face tokenizer.json, or the folder holding it (with tokenizer_config.json for the chat template). Required unless --target gives the tokenizer."`
	Target    string `type:"existingfile" help:"Drafts: the target model's GGUF file; its tokenizer, vocabulary, hidden size and layer count are used." placeholder:"FILE"`

	Preset string `help:"Start from a real model's shape: ${presets}. Shape flags override it." placeholder:"NAME"`

	Layers      int     `help:"Decoder layers (qwen3 default 2, qwen35 default 8)."`
	Hidden      int     `help:"Hidden size (default 128)."`
	Heads       int     `help:"Attention heads (default 4)."`
	KVHeads     int     `name:"kv-heads" help:"Key/value heads (default 2)."`
	HeadDim     int     `help:"Attention head dimension (default 32)."`
	FFN         int     `name:"ffn" help:"FFN intermediate size (default 256; deepseek4: per-expert size, default 32)."`
	Experts     int     `help:"deepseek4: routed experts (default 8)."`
	ExpertsUsed int     `name:"experts-used" help:"deepseek4: experts per token (default 2)."`
	Vocab       int     `help:"Vocabulary size; the tokenizer is padded with unused entries up to it (default: the tokenizer's size)."`
	Context     int     `help:"Training context length written to the metadata (default 4096)."`
	RopeTheta   float64 `help:"RoPE base (qwen3 default 1e6, qwen35 default 1e7)."`
	Tied        bool    `help:"Tie the output head to the token embedding (no output.weight)."`

	LinearKHeads     int     `name:"linear-k-heads" help:"qwen35: Gated DeltaNet key heads (default 2)."`
	LinearVHeads     int     `name:"linear-v-heads" help:"qwen35: Gated DeltaNet value heads (default 4)."`
	LinearKDim       int     `name:"linear-k-dim" help:"qwen35: Gated DeltaNet key head dimension (default 16)."`
	LinearVDim       int     `name:"linear-v-dim" help:"qwen35: Gated DeltaNet value head dimension (default 16)."`
	ConvKernel       int     `name:"conv-kernel" help:"qwen35: short convolution width (default 4)."`
	FullAttnInterval int     `name:"full-attn-interval" help:"qwen35: every Nth layer is full attention (default 4)."`
	PartialRotary    float64 `name:"partial-rotary" help:"qwen35: fraction of each head's dims that are rotated (default 0.25)."`
	MTP              int     `name:"mtp" help:"qwen35: MTP (next-token prediction) layers appended after the trunk (default 0)."`

	TargetLayers  int  `name:"target-layers" help:"Drafts: how many target layers feed the draft (default: the draft's layer count)."`
	TargetDepth   int  `name:"target-depth" help:"Drafts: the target's layer count, which places the captured layers (default: --target's, else 8)."`
	TargetHidden  int  `name:"target-hidden" help:"Drafts: the target's hidden size (default: --target's, else --hidden; the dflash format needs it equal to --hidden)."`
	BlockSize     int  `name:"block-size" help:"Drafts: tokens per draft block (default 16; DFlash2 8)."`
	MaskTokenID   int  `name:"mask-token-id" default:"-1" help:"Drafts: id of the mask token (default: the last vocabulary id)."`
	SlidingWindow int  `name:"sliding-window" help:"Drafts: sliding window of every layer but the last (default 0: all full attention)."`
	DFlash2       bool `name:"dflash2" help:"dflash: a DFlash2 draft (dynamic convolutions and a candidate selector; non-causal blocks)."`
	ConvGroup     int  `name:"conv-group" help:"dflash --dflash2: channels per convolution group (default 16); --conv-kernel sets the kernel (default 2)."`
	SelectorRank  int  `name:"selector-rank" help:"dflash --dflash2: candidate selector rank (default 32)."`
	SelectorTopK  int  `name:"selector-top-k" help:"dflash --dflash2: candidates per position (default 8; hidden must be at least k·(k+1))."`

	Type       string  `default:"f16" help:"Weight type: ${types}." placeholder:"TYPE"`
	ExpertType string  `name:"expert-type" help:"deepseek4: type of the routed expert stacks (default: --type), e.g. --type q8_0 --expert-type q4_K as released checkpoints keep attention finer than experts." placeholder:"TYPE"`
	Seed       uint64  `default:"1" help:"Random seed; the same seed and shape give the same file."`
	Std        float64 `default:"0.02" help:"Standard deviation of the random weights."`
	// (a 4-layer V4-Flash file, 15 GB of q4_K experts, took more than 4 minutes on 16 cores: the quantizer's search)
	DistinctRows int    `name:"distinct-rows" help:"Draw and quantize only the first N rows of each tensor; later rows repeat their bytes (for speed work on full-size shapes: seconds instead of minutes). 0: every row." placeholder:"N"`
	Name         string `help:"general.name (default: a description of the shape)."`
	Verbose      bool   `short:"v" help:"Print each tensor as it is written."`
}

// presets are the shapes of released checkpoints, so that full-size test
// files (for memory and speed work) can be made without the weights.
var presets = map[string]struct {
	arch string
	hp   hparams
}{
	"qwen3-0.6b": {"qwen3", hparams{Layers: 28, Hidden: 1024, Heads: 16, KVHeads: 8, HeadDim: 128, FFN: 3072, Vocab: 151936, Context: 40960, RMSEps: 1e-6, RopeTheta: 1e6, Tied: true}},
	"qwen3-4b":   {"qwen3", hparams{Layers: 36, Hidden: 2560, Heads: 32, KVHeads: 8, HeadDim: 128, FFN: 9728, Vocab: 151936, Context: 40960, RMSEps: 1e-6, RopeTheta: 1e6, Tied: true}},
	"qwen3-8b":   {"qwen3", hparams{Layers: 36, Hidden: 4096, Heads: 32, KVHeads: 8, HeadDim: 128, FFN: 12288, Vocab: 151936, Context: 40960, RMSEps: 1e-6, RopeTheta: 1e6}},
	"qwen3-32b":  {"qwen3", hparams{Layers: 64, Hidden: 5120, Heads: 64, KVHeads: 8, HeadDim: 128, FFN: 25600, Vocab: 151936, Context: 40960, RMSEps: 1e-6, RopeTheta: 1e6}},
	"qwen3.5-27b-dflash": {draftArch, hparams{Layers: 5, Hidden: 5120, Heads: 32, KVHeads: 8, HeadDim: 128, FFN: 17408,
		Vocab: 248320, Context: 32768, RMSEps: 1e-6, RopeTheta: 1e7, BlockSize: 16, MaskTokenID: 248070,
		TargetHidden: 5120, TargetLayerIDs: []int32{1, 16, 31, 46, 61}}},
	"deepseek-v4-flash": {ds4Arch, hparams{Layers: 43, Hidden: 4096, Vocab: 129280, Heads: 64, KVHeads: 1, HeadDim: 512,
		RopeDims: 64, Context: 1048576, RMSEps: 1e-6, RopeTheta: 10000, DS: ds4Params{
			QLora: 1024, OGroups: 8, OLora: 1024, Experts: 256, ExpertsUsed: 6, Shared: 1, FFN: 2048, HashLayers: 3,
			Window: 128, IndexHeads: 64, IndexHeadDim: 128, TopK: 512, HC: 4, Sinkhorn: 20, HCEps: 1e-6,
			SwigluLimit: 10, RoutedScale: 1.5, CompressTheta: 160000, YarnFactor: 16, BetaFast: 32, BetaSlow: 1,
			YarnOrigCtx: 65536, Kinds: flashKinds(43), CSARatio: 4, HCARatio: 128}}},
	"qwen3.5-0.8b": {"qwen35", hparams{Layers: 24, Hidden: 1024, Heads: 8, KVHeads: 2, HeadDim: 256, FFN: 3584, Vocab: 248320,
		Context: 262144, RMSEps: 1e-6, RopeTheta: 1e7, FullAttnInterval: 4, LinKHeads: 16, LinVHeads: 16, LinKDim: 128,
		LinVDim: 128, ConvKernel: 4, RopeDims: 64, RopeSections: []int32{11, 11, 10, 0}, Tied: true}},
	"qwen3.5-4b": {"qwen35", hparams{Layers: 32, Hidden: 2560, Heads: 16, KVHeads: 4, HeadDim: 256, FFN: 9216, Vocab: 248320,
		Context: 262144, RMSEps: 1e-6, RopeTheta: 1e7, FullAttnInterval: 4, LinKHeads: 16, LinVHeads: 32, LinKDim: 128,
		LinVDim: 128, ConvKernel: 4, RopeDims: 64, RopeSections: []int32{11, 11, 10, 0}, Tied: true}},
	"qwen3.5-27b": {"qwen35", hparams{Layers: 64, Hidden: 5120, Heads: 24, KVHeads: 4, HeadDim: 256, FFN: 17408, Vocab: 248320,
		Context: 262144, RMSEps: 1e-6, RopeTheta: 1e7, FullAttnInterval: 4, LinKHeads: 16, LinVHeads: 48, LinKDim: 128,
		LinVDim: 128, ConvKernel: 4, RopeDims: 64, RopeSections: []int32{11, 11, 10, 0}}},
}

func presetNames() string {
	var names []string
	for n := range presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// hparams merges arch defaults, the preset, the target (drafts; nil
// otherwise) and the flags.
func (c *mkCmd) hparams(l *layout, tgt *targetModel) (hparams, error) {
	hp := l.defaults
	hp.RopeSections = append([]int32(nil), hp.RopeSections...)
	if c.Preset != "" {
		p, ok := presets[c.Preset]
		if !ok {
			return hp, fmt.Errorf("unknown preset %q (known: %s)", c.Preset, presetNames())
		}
		if p.arch != l.arch && !(isDraftArch(p.arch) && isDraftArch(l.arch)) {
			return hp, fmt.Errorf("preset %q is a %s model, not %s", c.Preset, p.arch, l.arch)
		}
		dialect := hp.Dialect
		hp = p.hp
		hp.Dialect = dialect
		hp.RopeSections = append([]int32(nil), hp.RopeSections...)
	}
	frac := 0.0
	if hp.HeadDim > 0 {
		frac = float64(hp.RopeDims) / float64(hp.HeadDim)
	}
	set := func(dst *int, v int) {
		if v != 0 {
			*dst = v
		}
	}
	set(&hp.Layers, c.Layers)
	if tgt != nil && c.Preset == "" {
		hp.Hidden = tgt.hidden // a draft's hidden size is its target's
	}
	set(&hp.Hidden, c.Hidden)
	set(&hp.Heads, c.Heads)
	set(&hp.KVHeads, c.KVHeads)
	set(&hp.HeadDim, c.HeadDim)
	set(&hp.FFN, c.FFN)
	set(&hp.Context, c.Context)
	set(&hp.Vocab, c.Vocab)
	set(&hp.LinKHeads, c.LinearKHeads)
	set(&hp.LinVHeads, c.LinearVHeads)
	set(&hp.LinKDim, c.LinearKDim)
	set(&hp.LinVDim, c.LinearVDim)
	set(&hp.ConvKernel, c.ConvKernel)
	set(&hp.FullAttnInterval, c.FullAttnInterval)
	set(&hp.NextN, c.MTP)
	if c.RopeTheta != 0 {
		hp.RopeTheta = float32(c.RopeTheta)
	}
	hp.Tied = hp.Tied || c.Tied
	if c.PartialRotary != 0 {
		frac = c.PartialRotary
	}
	if l.arch == "qwen35" {
		if dims := int(float64(hp.HeadDim) * frac); dims != hp.RopeDims {
			hp.RopeDims = dims
			hp.RopeSections = defaultSections(dims / 2)
		}
	} else if l.arch == ds4Arch && c.PartialRotary != 0 {
		hp.RopeDims = int(float64(hp.HeadDim) * c.PartialRotary)
	} else if c.PartialRotary != 0 {
		return hp, fmt.Errorf("--partial-rotary: architecture %s rotates whole heads", l.arch)
	}
	hp.DS.Kinds = append([]int(nil), hp.DS.Kinds...)
	if l.arch == ds4Arch {
		if c.Layers != 0 {
			hp.DS.Kinds = flashKinds(c.Layers)
			hp.DS.HashLayers = min(hp.DS.HashLayers, c.Layers)
		}
		set(&hp.DS.Experts, c.Experts)
		set(&hp.DS.ExpertsUsed, c.ExpertsUsed)
		set(&hp.DS.FFN, c.FFN)
		if c.HeadDim != 0 && c.PartialRotary == 0 {
			hp.RopeDims = c.HeadDim / 2
		}
	} else if c.Experts != 0 || c.ExpertsUsed != 0 {
		return hp, fmt.Errorf("--experts: architecture %s has no experts", l.arch)
	}
	if isDraftArch(l.arch) {
		if err := c.draftHParams(l, tgt, &hp); err != nil {
			return hp, err
		}
	} else if c.TargetLayers != 0 || c.TargetDepth != 0 || c.TargetHidden != 0 || c.BlockSize != 0 || c.MaskTokenID >= 0 ||
		c.SlidingWindow != 0 || c.Target != "" || c.DFlash2 || c.ConvGroup != 0 || c.SelectorRank != 0 || c.SelectorTopK != 0 {
		return hp, fmt.Errorf("the --target*, --block-size, --mask-token-id, --sliding-window, --dflash2 and --selector-* flags are for DFlash draft models")
	}
	return hp, nil
}

// draftHParams applies the draft flags and the target's shape.
func (c *mkCmd) draftHParams(l *layout, tgt *targetModel, hp *hparams) error {
	switch {
	case c.TargetHidden != 0:
		hp.TargetHidden = c.TargetHidden
	case tgt != nil:
		hp.TargetHidden = tgt.hidden
	case hp.TargetHidden == 0:
		hp.TargetHidden = hp.Hidden
	}
	if tgt != nil {
		if c.TargetDepth != 0 && c.TargetDepth != tgt.layers {
			return fmt.Errorf("--target-depth %d contradicts --target %s, which has %d layers", c.TargetDepth, c.Target, tgt.layers)
		}
		if c.Vocab != 0 && c.Vocab != tgt.vocab {
			return fmt.Errorf("--vocab %d contradicts --target %s, whose vocabulary has %d tokens", c.Vocab, c.Target, tgt.vocab)
		}
		hp.Vocab = tgt.vocab
	}
	if c.TargetLayers != 0 || c.TargetDepth != 0 || tgt != nil || hp.TargetLayerIDs == nil {
		n, depth := c.TargetLayers, c.TargetDepth
		if n == 0 {
			n = len(hp.TargetLayerIDs)
		}
		if n == 0 {
			n = hp.Layers
		}
		if depth == 0 && tgt != nil {
			depth = tgt.layers
		}
		if depth == 0 {
			depth = 8
		}
		// The reference rule spreads several captures over layers 1 .. depth-3; one capture takes the middle layer.
		if n <= 0 || (n > 1 && depth < 4) || depth < 1 {
			return fmt.Errorf("--target-layers (%d) must be positive and the target depth (%d) at least 4 (1 for one captured layer)", n, depth)
		}
		hp.TargetLayerIDs = targetLayerIDs(depth, n)
	}
	if c.DFlash2 {
		if l.arch != draftArch {
			return fmt.Errorf("--dflash2: DFlash2 drafts are written as %s, not %s", draftArch, l.arch)
		}
		or := func(v, def int) int {
			if v != 0 {
				return v
			}
			return def
		}
		hp.D2 = dflash2Params{Kernel: or(c.ConvKernel, 2), Group: or(c.ConvGroup, 16), SelectorRank: or(c.SelectorRank, 32), SelectorTopK: or(c.SelectorTopK, 8)}
		hp.NonCausal = true
		hp.BlockSize = 8 // the released DFlash2 draft's block; more is not run with it
	} else if c.ConvGroup != 0 || c.SelectorRank != 0 || c.SelectorTopK != 0 {
		return fmt.Errorf("--conv-group and --selector-* need --dflash2")
	}
	if c.BlockSize != 0 {
		hp.BlockSize = c.BlockSize
	}
	if c.MaskTokenID >= 0 {
		hp.MaskTokenID = c.MaskTokenID
	}
	if c.SlidingWindow > 0 {
		hp.SlidingWindow = c.SlidingWindow
		hp.SlidingLayers = make([]bool, hp.Layers)
		for i := 0; i < hp.Layers-1; i++ {
			hp.SlidingLayers[i] = true
		}
	}
	return nil
}

// targetModel is what a draft takes from its target's GGUF file.
type targetModel struct {
	tok    map[string]any // every tokenizer.* key
	vocab  int
	hidden int
	layers int // trunk layers (MTP layers not counted): capture ids index them
}

func readTarget(path string) (*targetModel, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--target: %w", err)
	}
	defer f.Close()
	p := f.Arch() + "."
	t := &targetModel{tok: map[string]any{}}
	for _, kv := range f.KVs() {
		if strings.HasPrefix(kv.Key, "tokenizer.") {
			if v, ok := f.Meta(kv.Key); ok {
				t.tok[kv.Key] = v
			}
		}
	}
	tokens, ok := t.tok["tokenizer.ggml.tokens"].([]string)
	if !ok {
		return nil, fmt.Errorf("--target %s: no tokenizer.ggml.tokens to copy into the draft", path)
	}
	t.vocab = len(tokens)
	h, err := f.Uint32(p + "embedding_length")
	if err != nil {
		return nil, fmt.Errorf("--target %s: %w", path, err)
	}
	n, err := f.Uint32(p + "block_count")
	if err != nil {
		return nil, fmt.Errorf("--target %s: %w", path, err)
	}
	mtp, _ := f.Uint32(p + "nextn_predict_layers")
	t.hidden, t.layers = int(h), int(n)-int(mtp)
	return t, nil
}

// defaultSections splits n rotary frequencies into M-RoPE sections in the
// 11:11:10 proportion of the released Qwen3.5 checkpoints.
func defaultSections(n int) []int32 {
	a := (11*n + 31) / 32
	b := int(math.Round(float64(11*n) / 32))
	if a+b > n {
		b = n - a
	}
	return []int32{int32(a), int32(b), int32(n - a - b), 0}
}

func (c *mkCmd) Run(out io.Writer) error {
	l, err := layoutFor(c.Arch)
	if err != nil {
		return err
	}
	want, fileType, err := parseOutputType(c.Type)
	if err != nil {
		return fmt.Errorf("--type: %w", err)
	}
	if c.DistinctRows < 0 {
		return fmt.Errorf("--distinct-rows %d: want 0 (every row drawn) or more", c.DistinctRows)
	}
	var expertWant *gguf.Type
	if c.ExpertType != "" {
		if l.arch != ds4Arch {
			return fmt.Errorf("--expert-type: architecture %s has no expert stacks", l.arch)
		}
		t, _, err := parseOutputType(c.ExpertType)
		if err != nil {
			return fmt.Errorf("--expert-type: %w", err)
		}
		expertWant = &t
	}
	var tgt *targetModel
	switch {
	case c.Target != "" && !isDraftArch(l.arch):
		return fmt.Errorf("--target is for DFlash draft models")
	case c.Target != "" && c.Tokenizer != "":
		return fmt.Errorf("--tokenizer and --target both give the tokenizer: use one")
	case c.Target != "":
		if tgt, err = readTarget(c.Target); err != nil {
			return err
		}
	case c.Tokenizer == "":
		return fmt.Errorf("--tokenizer is required (drafts may give --target instead)")
	}
	hp, err := c.hparams(l, tgt)
	if err != nil {
		return err
	}
	var tok map[string]any
	if tgt != nil {
		tok = tgt.tok
	} else {
		if _, err := os.Stat(c.Tokenizer); err != nil {
			return fmt.Errorf("--tokenizer: %w", err)
		}
		var vocab int
		if tok, vocab, err = tokenizerFor(c.Tokenizer, hp.Vocab); err != nil {
			return err
		}
		hp.Vocab = vocab
	}
	if isDraftArch(l.arch) && hp.MaskTokenID < 0 {
		hp.MaskTokenID = hp.Vocab - 1
	}
	if err := l.validate(hp); err != nil {
		return fmt.Errorf("%s shape: %w", l.arch, err)
	}
	if w := upstreamWarning(l.arch, hp); w != "" {
		fmt.Fprintln(os.Stderr, "warning:", w)
	}
	name := c.Name
	if name == "" {
		name = fmt.Sprintf("dflash random %s L%d H%d", l.arch, hp.Layers, hp.Hidden)
	}
	m := &modelFile{
		arch: l.arch, name: name, fileType: fileType, want: want, expertWant: expertWant,
		keys: l.keys(hp), tok: tok, plans: l.tensors(hp),
		rows:         func(p tensorPlan) (rowFunc, error) { return randomRows(p, c.Seed, float32(c.Std)), nil },
		distinctRows: c.DistinctRows,
	}
	var log io.Writer
	if c.Verbose {
		log = out
	}
	if err := m.write(c.Out, log); err != nil {
		return fmt.Errorf("mk %s: %w", c.Out, err)
	}
	fmt.Fprintf(out, "wrote %s: %s, %d tensors, %s\n", c.Out, l.arch, len(m.plans), c.Type)
	return nil
}

const sqrt3 = 1.7320508075688772

// randomRows fills a tensor with values drawn from a generator seeded by
// the seed, the tensor's name and the row, so each row is reproducible on
// its own (rows are filled in parallel). Uniform values are cheaper than
// normal ones and have the asked-for standard deviation.
func randomRows(p tensorPlan, seed uint64, std float32) rowFunc {
	h := fnv.New64a()
	h.Write([]byte(p.Name))
	key := h.Sum64()
	return func(row int, dst []float32) error {
		r := rand.New(rand.NewPCG(seed, key^uint64(row)*0x9e3779b97f4a7c15))
		sym := func(std float32) float32 { return (2*r.Float32() - 1) * std * sqrt3 }
		for i := range dst {
			switch p.Init {
			case initWeight:
				dst[i] = sym(std)
			case initNorm:
				dst[i] = 1 + sym(0.1/sqrt3)
			case initSsmA:
				dst[i] = -(0.5 + 3.5*r.Float32())
			case initDtBias:
				dst[i] = 1 + sym(0.1/sqrt3)
			case initConv:
				dst[i] = sym(0.2)
			case initSmall:
				dst[i] = sym(0.1)
			}
		}
		if p.Init == initExpertIDs { // a random choice of distinct experts
			perm := r.Perm(p.IDs)
			for i := range dst {
				dst[i] = float32(perm[i%len(perm)])
			}
		}
		return nil
	}
}
