package qwendflash

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/hashicorp/go-multierror"

	native "github.com/dflash/dflash_server/native/engine"
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/chat"
	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/dflash/dflash_server/sdk/tokenizer"
)

// Name is the plugin's name (binary dflash-backend-qwen-dflash).
const Name = "qwen-dflash"

// Architectures are the GGUF general.architecture values served.
var Architectures = []string{"qwen3", "qwen35"}

// Defaults applied when the block leaves a capacity flag at 0.
const (
	defaultMaxCtx         = 4096
	defaultMaxConcurrency = 4
	defaultMaxTokens      = 1024
)

// Backend implements sdk.Backend for Qwen targets.
type Backend struct {
	mu sync.Mutex
	m  *model // nil until Load
}

var _ sdk.Backend = (*Backend)(nil)

// New returns an unloaded backend.
func New() *Backend { return &Backend{} }

// model is a loaded model block.
type model struct {
	cfg       sdk.ModelConfig
	file      *gguf.File
	native    *native.Model
	eng       *engine.Engine
	tok       *tokenizer.Tokenizer
	tmpl      *chat.Template
	family    chat.Family
	desc      sdk.ModelDescription
	bos       string
	eos       string
	imStart   int32 // <|im_start|>, -1 if the vocabulary has none
	thinkOpen int32 // <think>, -1 if the vocabulary has none
}

func (b *Backend) loaded() *model {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.m
}

func (b *Backend) Info(context.Context) (sdk.BackendInfo, error) {
	return sdk.BackendInfo{
		Name: Name, Architectures: Architectures, Devices: []string{"cpu"},
		Options: slices.Clone(optionSpecs), APIVersion: sdk.APIVersion,
	}, nil
}

func (b *Backend) ValidateOptions(_ context.Context, cfg sdk.ModelConfig) error {
	_, err := parseOptions(cfg.Options)
	return err
}

// libDir finds the engine libraries: the block's LibDir, $DFLASH_LIB_DIR,
// else ../lib next to this binary (bin/plugins → bin/lib).
func libDir(cfg sdk.ModelConfig) string {
	if cfg.LibDir != "" {
		return cfg.LibDir
	}
	if d := os.Getenv("DFLASH_LIB_DIR"); d != "" {
		return d
	}
	exe, err := os.Executable()
	if err != nil {
		return "lib"
	}
	return filepath.Join(filepath.Dir(exe), "..", "lib")
}

func orDefault(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

func (b *Backend) Load(ctx context.Context, cfg sdk.ModelConfig, progress func(sdk.LoadProgress)) (desc sdk.ModelDescription, err error) {
	if b.loaded() != nil {
		return desc, errors.New("load: a model is already loaded in this process")
	}
	report := func(p sdk.LoadProgress) {
		if progress != nil {
			progress(p)
		}
	}
	opts, err := parseOptions(cfg.Options)
	if err != nil {
		return desc, err
	}
	device := cfg.Device
	if device == "" {
		device = "cpu"
	}
	lib, err := native.Open(libDir(cfg), device)
	if err != nil {
		return desc, fmt.Errorf("load %s: %w", cfg.Path, err)
	}
	report(sdk.LoadProgress{Stage: "mapping"})
	f, err := gguf.Open(cfg.Path)
	if err != nil {
		return desc, fmt.Errorf("load %s: %w", cfg.Path, err)
	}
	defer func() {
		if err == nil {
			return
		}
		if cerr := f.Close(); cerr != nil {
			err = multierror.Append(err, cerr)
		}
	}()
	arch := f.Arch()
	if !slices.Contains(Architectures, arch) {
		return desc, fmt.Errorf("load %s: architecture %q is not served by %s (serves %v)", cfg.Path, arch, Name, Architectures)
	}
	tok, err := tokenizer.FromMetadata(f.Meta)
	if err != nil {
		return desc, fmt.Errorf("load %s: tokenizer: %w", cfg.Path, err)
	}
	src, err := f.String("tokenizer.chat_template")
	if err != nil {
		return desc, fmt.Errorf("load %s: chat template: %w", cfg.Path, err)
	}
	tmpl, err := chat.NewTemplate(src)
	if err != nil {
		return desc, fmt.Errorf("load %s: %w", cfg.Path, err)
	}

	maxCtx := cfg.MaxCtx
	if maxCtx <= 0 {
		maxCtx = defaultMaxCtx
		if n, err := f.Uint32(arch + ".context_length"); err == nil && n > 0 {
			maxCtx = min(maxCtx, int(n))
		}
	}
	slots := orDefault(cfg.MaxConcurrency, defaultMaxConcurrency)
	pool := orDefault(cfg.KVPoolTokens, slots*maxCtx)
	spec, err := native.SpecFromGGUF(f)
	if err != nil {
		return desc, fmt.Errorf("load %s: %w", cfg.Path, err)
	}
	var total, params int64
	for _, t := range f.Tensors() {
		total += int64(t.Size)
		params += int64(t.Elements())
	}
	report(sdk.LoadProgress{Stage: "uploading", BytesTotal: total})
	spec.Options = native.Options{
		KVPoolTokens: pool, BlockSize: opts.kvBlockSize, MaxSeqs: slots + opts.prefixSlots,
		CacheK: opts.cacheK, CacheV: opts.cacheV, Threads: opts.threads,
	}
	nm, err := lib.LoadModel(spec)
	if err != nil {
		return desc, fmt.Errorf("load %s: %w", cfg.Path, err)
	}
	info := nm.Info()
	if info.AttnLayers == 0 {
		// The engine's admission counts KV blocks; a model without any
		// full-attention layer has none to count.
		_ = nm.Close()
		return desc, fmt.Errorf("load %s: the model has no full-attention layer (%d layers, all recurrent); this backend needs at least one (for qwen35 see %s.full_attention_interval)", cfg.Path, info.Layers, arch)
	}
	if tok.VocabSize() > info.Vocab {
		_ = nm.Close()
		return desc, fmt.Errorf("load %s: tokenizer has %d tokens, the model's output only %d", cfg.Path, tok.VocabSize(), info.Vocab)
	}
	eng, err := engine.New(engine.Config{
		Model: newNativeModel(nm), Vocab: tok, MaxConcurrency: slots, MaxCtx: maxCtx,
		StepTokens: opts.stepTokens, DecodeHeadroom: opts.decodeHeadroom, PrefixCacheSlots: opts.prefixSlots,
		Special: func(id int32) bool {
			switch tok.TokenType(id) {
			case tokenizer.TypeNormal, tokenizer.TypeUndefined, tokenizer.TypeByte:
				return false
			}
			return true
		},
	})
	if err != nil {
		_ = nm.Close()
		return desc, fmt.Errorf("load %s: %w", cfg.Path, err)
	}
	lim := eng.Limits()
	defMax := orDefault(cfg.DefaultMaxTokens, min(defaultMaxTokens, maxCtx/2))
	capTok := orDefault(cfg.MaxTokens, maxCtx)
	m := &model{
		cfg: cfg, file: f, native: nm, eng: eng, tok: tok, tmpl: tmpl, family: chat.DetectFamily(arch, src),
		desc: sdk.ModelDescription{
			Name: cfg.Name, Architecture: arch, Device: device,
			MaxConcurrency: lim.MaxConcurrency, KVPoolTokens: lim.KVPoolTokens, MaxCtx: lim.MaxCtx,
			DefaultMaxTokens: defMax, MaxTokens: capTok,
			Features:       sdk.Features{Tools: true, Reasoning: true, Logprobs: true},
			ParameterCount: params, WeightBytes: int64(info.WeightBytes),
		},
	}
	m.imStart, m.thinkOpen = -1, -1
	if id, ok := tok.Special("<|im_start|>"); ok {
		m.imStart = id
	}
	if id, ok := tok.Special("<think>"); ok {
		m.thinkOpen = id
	}
	if id := tok.BOS(); id >= 0 {
		m.bos = tok.TokenText(id)
	}
	if id := tok.EOS(); id >= 0 {
		m.eos = tok.TokenText(id)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m != nil {
		_ = eng.Close(ctx)
		_ = nm.Close()
		return desc, errors.New("load: a model is already loaded in this process")
	}
	b.m = m
	report(sdk.LoadProgress{Stage: "ready", BytesDone: total, BytesTotal: total})
	return m.desc, nil
}

func (b *Backend) Start(ctx context.Context, req *sdk.ChatRequest, emit sdk.Emitter) error {
	m := b.loaded()
	if m == nil {
		return emit.Admit(sdk.Admission{Outcome: sdk.OutcomeInvalid, Reason: "model not loaded"})
	}
	er, err := m.prepare(req)
	if err != nil {
		return emit.Admit(sdk.Admission{Outcome: sdk.OutcomeInvalid, Reason: err.Error()})
	}
	return m.eng.Run(ctx, er, emit)
}

func (b *Backend) Tokenize(_ context.Context, text string, addSpecial bool) ([]int32, error) {
	m := b.loaded()
	if m == nil {
		return nil, errors.New("model not loaded")
	}
	return m.tok.Encode(text, addSpecial, true), nil
}

func (b *Backend) Detokenize(_ context.Context, ids []int32) (string, error) {
	m := b.loaded()
	if m == nil {
		return "", errors.New("model not loaded")
	}
	for _, id := range ids {
		if id < 0 || int(id) >= m.tok.VocabSize() {
			return "", sdk.Invalidf("token id %d out of range [0, %d)", id, m.tok.VocabSize())
		}
	}
	return m.tok.Decode(ids), nil
}

func (b *Backend) CountTokens(_ context.Context, req *sdk.ChatRequest) (int, error) {
	m := b.loaded()
	if m == nil {
		return 0, errors.New("model not loaded")
	}
	prompt, err := m.render(req)
	if err != nil {
		return 0, err
	}
	return len(m.tok.Encode(prompt, true, true)), nil
}

func (b *Backend) Stats(context.Context) (sdk.ModelStats, error) {
	m := b.loaded()
	if m == nil {
		return sdk.ModelStats{}, nil
	}
	return m.eng.Stats(), nil
}

func (b *Backend) Shutdown(ctx context.Context) error {
	b.mu.Lock()
	m := b.m
	b.m = nil
	b.mu.Unlock()
	if m == nil {
		return nil
	}
	var errs *multierror.Error
	errs = multierror.Append(errs, m.eng.Close(ctx))
	errs = multierror.Append(errs, m.native.Close())
	errs = multierror.Append(errs, m.file.Close())
	return errs.ErrorOrNil()
}
