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
)

type mkCmd struct {
	Arch      string `arg:"" help:"Architecture: qwen3, qwen35, dflash-draft or deepseek4."`
	Out       string `arg:"" help:"Output GGUF file."`
	Tokenizer string `required:"" help:"Hugging Face tokenizer.json, or the folder holding it (with tokenizer_config.json for the chat template)."`

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

	TargetLayers  int `name:"target-layers" help:"dflash-draft: how many target layers feed the draft (default: the draft's layer count)."`
	TargetDepth   int `name:"target-depth" help:"dflash-draft: the target's layer count, which places the captured layers (default 8)."`
	TargetHidden  int `name:"target-hidden" help:"dflash-draft: the target's hidden size (default: --hidden)."`
	BlockSize     int `name:"block-size" help:"dflash-draft: tokens per draft block (default 16)."`
	MaskTokenID   int `name:"mask-token-id" default:"-1" help:"dflash-draft: id of the mask token (default: the last vocabulary id)."`
	SlidingWindow int `name:"sliding-window" help:"dflash-draft: sliding window of every layer but the last (default 0: all full attention)."`

	Type    string  `default:"f16" help:"Weight type: ${types}." placeholder:"TYPE"`
	Seed    uint64  `default:"1" help:"Random seed; the same seed and shape give the same file."`
	Std     float64 `default:"0.02" help:"Standard deviation of the random weights."`
	Name    string  `help:"general.name (default: a description of the shape)."`
	Verbose bool    `short:"v" help:"Print each tensor as it is written."`
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

// hparams merges arch defaults, the preset and the flags.
func (c *mkCmd) hparams(l *layout) (hparams, error) {
	hp := l.defaults
	hp.RopeSections = append([]int32(nil), hp.RopeSections...)
	if c.Preset != "" {
		p, ok := presets[c.Preset]
		if !ok {
			return hp, fmt.Errorf("unknown preset %q (known: %s)", c.Preset, presetNames())
		}
		if p.arch != l.arch {
			return hp, fmt.Errorf("preset %q is a %s model, not %s", c.Preset, p.arch, l.arch)
		}
		hp = p.hp
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
	if l.arch == draftArch {
		if c.TargetHidden != 0 || hp.TargetHidden == 0 {
			hp.TargetHidden = c.TargetHidden
			if hp.TargetHidden == 0 {
				hp.TargetHidden = hp.Hidden
			}
		}
		if c.TargetLayers != 0 || c.TargetDepth != 0 || hp.TargetLayerIDs == nil {
			n, depth := c.TargetLayers, c.TargetDepth
			if n == 0 {
				n = hp.Layers
			}
			if depth == 0 {
				depth = 8
			}
			if n <= 0 || depth < 4 {
				return hp, fmt.Errorf("--target-layers (%d) must be positive and --target-depth (%d) at least 4", n, depth)
			}
			hp.TargetLayerIDs = targetLayerIDs(depth, n)
		}
		set(&hp.BlockSize, c.BlockSize)
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
	} else if c.TargetLayers != 0 || c.TargetDepth != 0 || c.TargetHidden != 0 || c.BlockSize != 0 || c.MaskTokenID >= 0 || c.SlidingWindow != 0 {
		return hp, fmt.Errorf("the --target-*, --block-size, --mask-token-id and --sliding-window flags are for dflash-draft models")
	}
	return hp, nil
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
	hp, err := c.hparams(l)
	if err != nil {
		return err
	}
	if _, err := os.Stat(c.Tokenizer); err != nil {
		return fmt.Errorf("--tokenizer: %w", err)
	}
	tok, vocab, err := tokenizerFor(c.Tokenizer, hp.Vocab)
	if err != nil {
		return err
	}
	hp.Vocab = vocab
	if l.arch == draftArch && hp.MaskTokenID < 0 {
		hp.MaskTokenID = vocab - 1
	}
	if err := l.validate(hp); err != nil {
		return fmt.Errorf("%s shape: %w", l.arch, err)
	}
	name := c.Name
	if name == "" {
		name = fmt.Sprintf("dflash random %s L%d H%d", l.arch, hp.Layers, hp.Hidden)
	}
	m := &modelFile{
		arch: l.arch, name: name, fileType: fileType, want: want,
		keys: l.keys(hp), tok: tok, plans: l.tensors(hp),
		rows: func(p tensorPlan) (rowFunc, error) { return randomRows(p, c.Seed, float32(c.Std)), nil },
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
