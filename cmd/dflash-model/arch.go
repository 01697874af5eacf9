package main

import (
	"fmt"
	"sort"
	"strings"

	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/hashicorp/go-multierror"
)

// hparams are a model's shape parameters. mk fills them from flags, convert
// from config.json, inspect's layout check from GGUF metadata; a layout turns
// them into metadata keys and a tensor plan.
type hparams struct {
	Layers    int // trunk decoder layers (MTP layers not included)
	NextN     int // MTP layers appended after the trunk (qwen35)
	Hidden    int
	Heads     int
	KVHeads   int
	HeadDim   int
	FFN       int
	Vocab     int
	Context   int
	RMSEps    float32
	RopeTheta float32
	Tied      bool // output.weight omitted; token_embd is reused

	// qwen35 (hybrid Gated DeltaNet)
	FullAttnInterval int
	LinKHeads        int
	LinVHeads        int
	LinKDim          int
	LinVDim          int
	ConvKernel       int
	RopeDims         int // rotary dims per head
	RopeSections     []int32

	// DFlash drafts (block-diffusion draft for a target model): see dflash.go
	Dialect        string  // "dflash" (upstream), "dflash-premerge" or "lucebox"
	TargetLayerIDs []int32 // HF numbering: target layers whose outputs feed fc, in order
	TargetHidden   int     // hidden size of the target
	BlockSize      int
	MaskTokenID    int
	SlidingWindow  int    // 0: no sliding-window layers
	SlidingLayers  []bool // per layer: sliding window (true) or full attention
	NonCausal      bool   // attention.causal = false is written
	D2             dflash2Params

	// deepseek4 (DeepSeek V4): see deepseek4.go
	DS ds4Params
}

// initKind says how mk fills a tensor with random values (GGUF
// conventions: norms are used as w·x̂, ssm_a is already −exp(A_log)).
type initKind int

const (
	initWeight    initKind = iota // uniform, standard deviation --std
	initNorm                      // 1 ± 0.1
	initSsmA                      // −U(0.5, 4): decay rates
	initDtBias                    // 1 ± 0.1
	initConv                      // uniform, standard deviation 0.2
	initSmall                     // uniform, standard deviation 0.1 (biases, sinks, HC scales)
	initExpertIDs                 // distinct expert ids per row, below tensorPlan.IDs
)

// tensorPlan is one tensor of a layout: its GGUF name and ggml dims, how mk
// fills it, and where convert takes it from.
type tensorPlan struct {
	Name string
	Dims []uint64 // ggml order, ne0 first
	Init initKind
	F32  bool // stays F32 whatever --type says
	Half bool // at least 16-bit floats: F16 when --type is a quantized type
	I32  bool // integer table (expert ids), stored as I32
	IDs  int  // initExpertIDs: ids are below this

	// Conversion from Hugging Face; see hfRule.
	HF hfRule
}

// hfRule says where convert finds a tensor in a Hugging Face checkpoint and
// how the values change on the way. Every conversion convention lives in these
// rules (built in qwen3.go, qwen35.go, deepseek4.go, ...) so it can be read
// and fixed in one place.
type hfRule struct {
	// Name is relative to the text model's prefix ("model.",
	// "model.language_model." or "" in the official DeepSeek layout),
	// unless Top is set (e.g. lm_head.weight).
	Name string
	Top  bool
	// Alt is another full (top-level) name of the tensor, read when Name is
	// absent: the official DeepSeek checkpoint spells a few top-level
	// tensors differently ("embed.weight", "hc_head_fn").
	Alt string
	// Parts, when set, builds the tensor from several checkpoint tensors
	// (named like Name, which is then unused): their rows are concatenated
	// in order, so output row k·n + r is part k's row r when each part has
	// n rows. DeepSeek V4 expert stacks are made this way from one matrix
	// per expert. Rows and Cols index the concatenation.
	Parts []string
	// Shape is the torch shape the checkpoint must have: every part's
	// shape when Parts is set.
	Shape []int64
	// PlusOne adds 1 to every value (zero-centred RMSNorm weights).
	PlusOne bool
	// NegExp stores −exp(x) (A_log → ssm_a).
	NegExp bool
	// Rows maps an output row (ggml ne1.. index) to its source row; nil
	// keeps the order. Built only when the tensor is converted (an expert
	// stack has millions of rows).
	Rows func() []int
	// Cols maps an output column (ne0 index) to its source column.
	Cols func() []int
}

// layout describes one GGUF architecture.
type layout struct {
	arch     string
	defaults hparams
	validate func(hp hparams) error
	keys     func(hp hparams) []kv
	tensors  func(hp hparams) []tensorPlan
	// fromGGUF reads hparams back from a file's metadata and tensors.
	fromGGUF func(f *gguf.File) (hparams, error)
	// fromHF reads hparams from a Hugging Face config.json.
	fromHF func(cfg hfConfig) (hparams, error)
}

var layouts = map[string]*layout{}

func register(l *layout) { layouts[l.arch] = l }

func layoutFor(arch string) (*layout, error) {
	if l, ok := layouts[arch]; ok {
		return l, nil
	}
	return nil, fmt.Errorf("unknown architecture %q (known: %s)", arch, strings.Join(archNames(), ", "))
}

func archNames() []string {
	var out []string
	for n := range layouts {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// kv is one metadata record, kept in write order.
type kv struct {
	key string
	val any
}

func u32(n int) uint32 { return uint32(n) }

// dims builds a ggml dims list.
func dims(d ...int) []uint64 {
	out := make([]uint64, len(d))
	for i, v := range d {
		out[i] = uint64(v)
	}
	return out
}

// layerNames returns the namers of decoder layer i: blk gives a tensor's
// GGUF name, hf the rule that reads it from the checkpoint's layers.i.
func layerNames(i int) (blk func(string) string, hf func(string, ...int) hfRule) {
	blk = func(name string) string { return fmt.Sprintf("blk.%d.%s", i, name) }
	hf = func(name string, shape ...int) hfRule {
		return hfRule{Name: fmt.Sprintf("layers.%d.%s", i, name), Shape: torch(shape...)}
	}
	return blk, hf
}

// torch builds a torch shape.
func torch(d ...int) []int64 {
	out := make([]int64, len(d))
	for i, v := range d {
		out[i] = int64(v)
	}
	return out
}

// positive checks named shape parameters.
func positive(fields ...any) error {
	var errs *multierror.Error
	for i := 0; i+1 < len(fields); i += 2 {
		if v := fields[i+1].(int); v <= 0 {
			errs = multierror.Append(errs, fmt.Errorf("%s must be positive, got %d", fields[i], v))
		}
	}
	return errs.ErrorOrNil()
}

// commonKeys are the keys every llama-style layout writes.
func commonKeys(arch string, hp hparams) []kv {
	p := arch + "."
	return []kv{
		{p + "block_count", u32(hp.Layers + hp.NextN)},
		{p + "context_length", u32(hp.Context)},
		{p + "embedding_length", u32(hp.Hidden)},
		{p + "feed_forward_length", u32(hp.FFN)},
		{p + "attention.head_count", u32(hp.Heads)},
		{p + "attention.head_count_kv", u32(hp.KVHeads)},
		{p + "attention.key_length", u32(hp.HeadDim)},
		{p + "attention.value_length", u32(hp.HeadDim)},
		{p + "attention.layer_norm_rms_epsilon", hp.RMSEps},
		{p + "rope.freq_base", hp.RopeTheta},
	}
}

// commonFromGGUF reads the keys commonKeys writes, plus the vocabulary size
// (token_embd rows) and whether the head is tied.
func commonFromGGUF(f *gguf.File) (hparams, error) {
	p := f.Arch() + "."
	var hp hparams
	var errs *multierror.Error
	geti := func(key string, dst *int) {
		v, err := f.Uint32(p + key)
		if err != nil {
			errs = multierror.Append(errs, err)
			return
		}
		*dst = int(v)
	}
	geti("block_count", &hp.Layers)
	geti("context_length", &hp.Context)
	geti("embedding_length", &hp.Hidden)
	geti("feed_forward_length", &hp.FFN)
	geti("attention.head_count", &hp.Heads)
	if _, ok := f.Meta(p + "attention.head_count_kv"); ok {
		geti("attention.head_count_kv", &hp.KVHeads)
	} else {
		hp.KVHeads = hp.Heads
	}
	if _, ok := f.Meta(p + "attention.key_length"); ok {
		geti("attention.key_length", &hp.HeadDim)
	} else if hp.Heads > 0 {
		hp.HeadDim = hp.Hidden / hp.Heads
	}
	if v, err := f.Float32(p + "attention.layer_norm_rms_epsilon"); err == nil {
		hp.RMSEps = v
	}
	if v, err := f.Float32(p + "rope.freq_base"); err == nil {
		hp.RopeTheta = v
	}
	// Vocabulary: the embedding's rows, else the vocab_size key (drafts
	// have no embedding), else the tokenizer's length.
	if t, ok := f.Tensor("token_embd.weight"); ok && len(t.Dims) == 2 {
		hp.Vocab = int(t.Dims[1])
	} else if v, err := f.Uint32(p + "vocab_size"); err == nil {
		hp.Vocab = int(v)
	} else if kv, ok := findKV(f, "tokenizer.ggml.tokens"); ok {
		hp.Vocab = int(kv.Len)
	} else {
		errs = multierror.Append(errs, fmt.Errorf("cannot tell the vocabulary size: no %q tensor, %q key or tokenizer", "token_embd.weight", p+"vocab_size"))
	}
	_, hasOutput := f.Tensor("output.weight")
	hp.Tied = !hasOutput
	return hp, errs.ErrorOrNil()
}

// checkLayout compares a file's tensors with its architecture's plan:
// missing tensors and wrong dims are errors; tensors the plan does not know
// (extras some converters add) are returned as notes. Architectures without
// a layout pass unchecked.
func checkLayout(f *gguf.File) error {
	_, err := checkLayoutNotes(f)
	return err
}

func checkLayoutNotes(f *gguf.File) (extra []string, err error) {
	l, ok := layouts[f.Arch()]
	if !ok {
		return nil, nil
	}
	hp, err := l.fromGGUF(f)
	if err != nil {
		return nil, err
	}
	if err := l.validate(hp); err != nil {
		return nil, err
	}
	var errs *multierror.Error
	want := map[string]bool{}
	for _, p := range l.tensors(hp) {
		want[p.Name] = true
		t, ok := f.Tensor(p.Name)
		if !ok {
			errs = multierror.Append(errs, fmt.Errorf("missing tensor %q (want dims %v)", p.Name, p.Dims))
			continue
		}
		if !equalDims(t.Dims, p.Dims) {
			errs = multierror.Append(errs, fmt.Errorf("tensor %q has dims %v, want %v", p.Name, t.Dims, p.Dims))
		}
	}
	for _, t := range f.Tensors() {
		if !want[t.Name] {
			extra = append(extra, t.Name)
		}
	}
	return extra, errs.ErrorOrNil()
}

func equalDims(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
