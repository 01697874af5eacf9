package qwendflash

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/dflash/dflash_server/plugins/nativebackend"
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/chat"
)

// Name is the plugin's name (binary dflash-backend-qwen-dflash).
const Name = "qwen-dflash"

// Architectures are the GGUF general.architecture values served.
var Architectures = []string{"qwen3", "qwen35"}

// Backend implements sdk.Backend for Qwen targets.
type Backend struct {
	mu sync.Mutex
	m  *model // nil until Load
}

var _ sdk.Backend = (*Backend)(nil)

// New returns an unloaded backend.
func New() *Backend { return &Backend{} }

// model is a loaded model block: the shared native wiring plus what the
// Qwen families need to render and parse.
type model struct {
	*nativebackend.Loaded
	family    chat.Family
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
	l, err := nativebackend.Load(cfg, nativebackend.Spec{
		Name: Name, Architectures: Architectures,
		Features: sdk.Features{Tools: true, Reasoning: true, Logprobs: true},
	}, opts.engine, report)
	if err != nil {
		return desc, err
	}
	m := &model{Loaded: l, family: chat.DetectFamily(l.Desc.Architecture, l.TemplateSource)}
	tok := l.Tok
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
		_ = l.Close(ctx)
		return desc, errors.New("load: a model is already loaded in this process")
	}
	b.m = m
	report(sdk.LoadProgress{Stage: "ready", BytesDone: l.WeightFileBytes, BytesTotal: l.WeightFileBytes})
	return m.Desc, nil
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
	return m.Engine.Run(ctx, er, emit)
}

func (b *Backend) Tokenize(_ context.Context, text string, addSpecial bool) ([]int32, error) {
	m := b.loaded()
	if m == nil {
		return nil, errors.New("model not loaded")
	}
	return m.Tok.Encode(text, addSpecial, true), nil
}

func (b *Backend) Detokenize(_ context.Context, ids []int32) (string, error) {
	m := b.loaded()
	if m == nil {
		return "", errors.New("model not loaded")
	}
	for _, id := range ids {
		if id < 0 || int(id) >= m.Tok.VocabSize() {
			return "", sdk.Invalidf("token id %d out of range [0, %d)", id, m.Tok.VocabSize())
		}
	}
	return m.Tok.Decode(ids), nil
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
	return len(m.Tok.Encode(prompt, true, true)), nil
}

func (b *Backend) Stats(context.Context) (sdk.ModelStats, error) {
	m := b.loaded()
	if m == nil {
		return sdk.ModelStats{}, nil
	}
	return m.Engine.Stats(), nil
}

func (b *Backend) Shutdown(ctx context.Context) error {
	b.mu.Lock()
	m := b.m
	b.m = nil
	b.mu.Unlock()
	if m == nil {
		return nil
	}
	return m.Close(ctx)
}
