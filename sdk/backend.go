package sdk

import "context"

// Backend is what a backend plugin implements: one process serves one model
// block. The core calls Info, then ValidateOptions (also for blocks it only
// checks), then Load once, then any number of concurrent Start, Tokenize,
// Detokenize, CountTokens and Stats calls, and finally Shutdown.
//
// All methods must be safe for concurrent use. Every method honours ctx;
// Start must stop generating and free the sequence's KV as soon as ctx is
// cancelled.
type Backend interface {
	// Info describes the plugin: its name, the GGUF architectures it serves
	// and the block options it accepts. It must not load anything.
	Info(ctx context.Context) (BackendInfo, error)
	// ValidateOptions checks a block's plugin-owned options without loading
	// the model; the error names the offending option.
	ValidateOptions(ctx context.Context, cfg ModelConfig) error
	// Load loads the model described by cfg, reporting progress through
	// progress (which may be nil), and returns what the model can do.
	Load(ctx context.Context, cfg ModelConfig, progress func(LoadProgress)) (ModelDescription, error)
	// Start runs one request. Its first emitted event must be the admission
	// (exactly once); when the outcome is not admitted Start returns after
	// emitting it. Admitted requests then emit events and end with one whose
	// Finish is set. emit returns an error when the consumer is gone; Start
	// must then stop and return.
	Start(ctx context.Context, req *ChatRequest, emit Emitter) error
	// Tokenize turns text into this model's token ids.
	Tokenize(ctx context.Context, text string, addSpecial bool) ([]int32, error)
	// Detokenize turns token ids into text.
	Detokenize(ctx context.Context, ids []int32) (string, error)
	// CountTokens renders req with the model's template and counts the
	// prompt tokens, without admitting anything.
	CountTokens(ctx context.Context, req *ChatRequest) (int, error)
	// Stats is a cheap snapshot of the engine's state.
	Stats(ctx context.Context) (ModelStats, error)
	// Shutdown stops generation and frees device memory; the process is
	// killed after it returns.
	Shutdown(ctx context.Context) error
}

// Emitter receives a Start stream: one Admission first, then events.
type Emitter interface {
	Admit(a Admission) error
	Emit(e Event) error
}

// BackendInfo describes a backend plugin.
type BackendInfo struct {
	// Name is the plugin's name without the dflash-backend- prefix.
	Name string
	// Architectures are the GGUF general.architecture values it serves.
	Architectures []string
	// Devices are the device kinds it can place a model on ("cpu", "cuda").
	Devices []string
	// Options are the block flags this plugin owns.
	Options []OptionSpec
	// APIVersion is this SDK's API version the plugin was built with.
	APIVersion int
}

// OptionKind is the value type of a plugin-owned block option.
type OptionKind int

const (
	OptionString OptionKind = iota
	OptionBool
	OptionInt
	OptionFloat
	OptionEnum
)

// OptionSpec declares one plugin-owned block flag, e.g. --cache-type-k.
type OptionSpec struct {
	// Name without leading dashes, e.g. "cache-type-k".
	Name    string
	Kind    OptionKind
	Default string
	Help    string
	// Enum lists the allowed values for OptionEnum.
	Enum []string
	// SharedProcessPolicy marks options the seed refuses when load
	// balancing is enabled (KV paging controls, compression, remote drafts,
	// target splitting); the core refuses them when set to a non-default
	// value with --load-balancing.
	SharedProcessPolicy bool
}

// ModelConfig is one model block as the core hands it to its backend.
type ModelConfig struct {
	// Path is the GGUF file.
	Path string
	// Name is the served model name (--model-name, default the file's base
	// name without extension).
	Name string
	// Architecture is general.architecture read by the core.
	Architecture string
	// Device is the target device, e.g. "cpu:0", "cuda:1".
	Device string
	// LibDir is where the engine libraries (libdflash_<device>.so) live.
	LibDir string

	// Core-owned capacity and defaults; 0 means "the backend's default".
	MaxCtx           int
	MaxConcurrency   int
	KVPoolTokens     int
	DefaultMaxTokens int
	MaxTokens        int
	// HardLimitReplyBudget closes the reasoning section when this many
	// tokens of the cap remain; 0 disables.
	HardLimitReplyBudget int
	// ThinkMaxTokens caps the reasoning section; 0 means no cap.
	ThinkMaxTokens int
	// EffortBudgets maps reasoning effort ("low", "medium", "high") to a
	// thinking token budget.
	EffortBudgets map[string]int

	// Options are the plugin-owned flags of the block, by name without
	// dashes; bool flags given without a value are "true".
	Options map[string]string
	// MultiModel is true when this block is one of several models served
	// by one listener (load balancing or by-name routing). Backends then
	// refuse what the seed lists as unshareable (KV paging controls,
	// compression, remote drafts, target splitting).
	MultiModel bool
}

// LoadProgress reports loading progress.
type LoadProgress struct {
	// Stage is a short word: "mapping", "uploading", "warming", "ready".
	Stage      string
	BytesDone  int64
	BytesTotal int64
}

// ModelDescription is what a loaded model can do.
type ModelDescription struct {
	Name         string
	Architecture string
	Device       string
	DraftDevice  string
	// Capacity as the engine enforces it.
	MaxConcurrency int
	KVPoolTokens   int
	MaxCtx         int
	// Defaults applied to requests that do not set them.
	DefaultMaxTokens int
	MaxTokens        int
	Features         Features
	// ParameterCount and WeightBytes are informational.
	ParameterCount int64
	WeightBytes    int64
}

// Features are optional capabilities of a loaded model.
type Features struct {
	Tools       bool
	Reasoning   bool
	Logprobs    bool
	Speculative bool
}

// ModelStats is a snapshot of a model's engine.
type ModelStats struct {
	ActiveSequences int
	KVTokensUsed    int
	KVTokensTotal   int
	// DraftAccepted / DraftProposed are cumulative speculative counts.
	DraftAccepted   int64
	DraftProposed   int64
	DraftSteps      int64 // target forwards that verified a draft block
	TokensGenerated int64
	PromptTokens    int64
}
