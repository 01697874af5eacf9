package ds4

import (
	"context"
	"slices"

	"github.com/hashicorp/go-hclog"

	native "github.com/dflash/dflash_server/native/engine"
	"github.com/dflash/dflash_server/plugins/nativebackend"
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/chat"
	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/transport"
)

// Name is the plugin's name (binary dflash-backend-ds4).
const Name = "ds4"

// Arch is the GGUF general.architecture served.
const Arch = "deepseek4"

// Architectures are the GGUF general.architecture values served.
var Architectures = []string{Arch}

// Backend implements sdk.Backend for DeepSeek V4 targets;
// nativebackend.Runner answers the calls every native backend answers
// alike.
type Backend struct {
	nativebackend.Runner
	// log is the plugin's log (stderr, relayed by the server): where an
	// approximating option is reported at load.
	log hclog.Logger
}

var _ sdk.Backend = (*Backend)(nil)

// New returns an unloaded backend.
func New() *Backend { return &Backend{log: transport.PluginLogger(Name)} }

func (b *Backend) Info(context.Context) (sdk.BackendInfo, error) {
	return sdk.BackendInfo{
		Name: Name, Architectures: Architectures, Devices: []string{"cpu", "cuda"},
		Options: slices.Clone(optionSpecs), APIVersion: sdk.APIVersion,
	}, nil
}

func (b *Backend) ValidateOptions(_ context.Context, cfg sdk.ModelConfig) error {
	_, err := parseOptions(cfg.Options, cfg.Device)
	return err
}

func (b *Backend) Load(ctx context.Context, cfg sdk.ModelConfig, progress func(sdk.LoadProgress)) (sdk.ModelDescription, error) {
	opts, err := parseOptions(cfg.Options, cfg.Device)
	if err != nil {
		return sdk.ModelDescription{}, err
	}
	return b.LoadChat(ctx, cfg, nativebackend.Spec{
		Name: Name, Architectures: Architectures,
		Features: sdk.Features{Tools: true, Reasoning: true, Logprobs: true},
		Configure: func(ms *native.ModelSpec) error {
			warning, err := opts.configure(ms)
			if warning != "" {
				b.log.Warn(warning, "model", cfg.Name)
			}
			return err
		},
	}, opts.engine, deepseekChat, progress)
}

// deepseekChat is how requests to a DeepSeek V4 model become engine work:
// the generation prompt opens with <｜Assistant｜>; a request thinks only
// when it asks to (the template's default); DSML calls are not forced.
func deepseekChat(l *nativebackend.Loaded) nativebackend.Chat {
	return nativebackend.Chat{
		Backend: Name, Family: chat.DetectFamily(l.Desc.Architecture, l.TemplateSource),
		TurnStart: nativebackend.SpecialID(l.Tok, "<｜Assistant｜>"),
		ThinkOpen: nativebackend.SpecialID(l.Tok, "<think>"),
		Preset:    preset,
	}
}

// preset is DeepSeek's recommended sampling for V4 (temperature 1.0,
// top_p 1.0), thinking or not.
func preset(bool) engine.Sampling {
	return engine.Sampling{Temperature: 1.0, TopP: 1.0, RepeatPenalty: 1, PenaltyLastN: -1}
}
