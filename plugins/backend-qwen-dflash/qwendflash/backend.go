package qwendflash

import (
	"context"
	"slices"

	"github.com/dflash/dflash_server/plugins/nativebackend"
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/chat"
)

// Name is the plugin's name (binary dflash-backend-qwen-dflash).
const Name = "qwen-dflash"

// Architectures are the GGUF general.architecture values served.
var Architectures = []string{"qwen3", "qwen35"}

// Backend implements sdk.Backend for Qwen targets; nativebackend.Runner
// answers the calls every native backend answers alike.
type Backend struct {
	nativebackend.Runner
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

var _ nativebackend.Model = (*model)(nil)

// Base is the shared loaded model.
func (m *model) Base() *nativebackend.Loaded { return m.Loaded }

// loaded is the kept model, nil before Load.
func (b *Backend) loaded() *model {
	m, _ := b.Current().(*model)
	return m
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
		return desc, nativebackend.ErrLoaded
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
	if err := b.Keep(ctx, m); err != nil {
		return desc, err
	}
	report(sdk.LoadProgress{Stage: "ready", BytesDone: l.WeightFileBytes, BytesTotal: l.WeightFileBytes})
	return m.Desc, nil
}
