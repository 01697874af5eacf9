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

// loaded is the kept model, nil before Load.
func (b *Backend) loaded() *nativebackend.ChatModel {
	m, _ := b.Current().(*nativebackend.ChatModel)
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

func (b *Backend) Load(ctx context.Context, cfg sdk.ModelConfig, progress func(sdk.LoadProgress)) (sdk.ModelDescription, error) {
	opts, err := parseOptions(cfg.Options)
	if err != nil {
		return sdk.ModelDescription{}, err
	}
	return b.LoadChat(ctx, cfg, nativebackend.Spec{
		Name: Name, Architectures: Architectures,
		Features: sdk.Features{Tools: true, Reasoning: true, Logprobs: true},
	}, opts.engine, func(l *nativebackend.Loaded) nativebackend.Chat {
		return qwenChat(chat.DetectFamily(l.Desc.Architecture, l.TemplateSource), l.Tok)
	}, progress)
}
