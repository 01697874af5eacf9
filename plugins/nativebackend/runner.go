package nativebackend

import (
	"context"
	"errors"
	"sync"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/engine"
)

// Model is a loaded model as its backend completes it: the shared wiring
// plus how the backend turns a request into prompt text and engine work.
type Model interface {
	// Base is the shared loaded model.
	Base() *Loaded
	// Render is the request's prompt text.
	Render(req *sdk.ChatRequest) (string, error)
	// Prepare is the request as engine work; an error is the request's
	// fault and is answered as invalid.
	Prepare(req *sdk.ChatRequest) (*engine.Request, error)
}

// Runner answers the sdk.Backend calls that are the same for every native
// backend, over the model the backend loaded. A backend embeds it and adds
// Info, ValidateOptions and Load, which hands its model to Keep. Its
// methods are safe for concurrent use.
type Runner struct {
	mu sync.Mutex
	m  Model // nil until Keep
}

var errNotLoaded = errors.New("model not loaded")

// ErrLoaded is Load's answer when the process already holds a model.
var ErrLoaded = errors.New("load: a model is already loaded in this process")

// Current is the kept model, nil before Keep and after Shutdown.
func (r *Runner) Current() Model {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m
}

// Keep makes m the model served. A process serves one model: when one is
// already kept, m is closed and ErrLoaded returned.
func (r *Runner) Keep(ctx context.Context, m Model) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m != nil {
		_ = m.Base().Close(ctx)
		return ErrLoaded
	}
	r.m = m
	return nil
}

// LoadChat is a chat backend's Load: it loads cfg's model for spec with
// the engine options opts, completes it with the Chat that family gives for
// it, keeps it and reports it ready. progress may be nil.
func (r *Runner) LoadChat(ctx context.Context, cfg sdk.ModelConfig, spec Spec, opts EngineOptions,
	family func(*Loaded) Chat, progress func(sdk.LoadProgress)) (sdk.ModelDescription, error) {
	if r.Current() != nil {
		return sdk.ModelDescription{}, ErrLoaded
	}
	report := func(p sdk.LoadProgress) {
		if progress != nil {
			progress(p)
		}
	}
	l, err := Load(cfg, spec, opts, report)
	if err != nil {
		return sdk.ModelDescription{}, err
	}
	m := NewChatModel(l, family(l))
	if err := r.Keep(ctx, m); err != nil {
		return sdk.ModelDescription{}, err
	}
	report(sdk.LoadProgress{Stage: "ready", BytesDone: l.WeightFileBytes, BytesTotal: l.WeightFileBytes})
	return m.Desc, nil
}

func (r *Runner) Start(ctx context.Context, req *sdk.ChatRequest, emit sdk.Emitter) error {
	m := r.Current()
	if m == nil {
		return emit.Admit(sdk.Admission{Outcome: sdk.OutcomeInvalid, Reason: errNotLoaded.Error()})
	}
	er, err := m.Prepare(req)
	if err != nil {
		return emit.Admit(sdk.Admission{Outcome: sdk.OutcomeInvalid, Reason: err.Error()})
	}
	return m.Base().Engine.Run(ctx, er, emit)
}

func (r *Runner) Tokenize(_ context.Context, text string, addSpecial bool) ([]int32, error) {
	m := r.Current()
	if m == nil {
		return nil, errNotLoaded
	}
	return m.Base().Tok.Encode(text, addSpecial, true), nil
}

func (r *Runner) Detokenize(_ context.Context, ids []int32) (string, error) {
	m := r.Current()
	if m == nil {
		return "", errNotLoaded
	}
	tok := m.Base().Tok
	for _, id := range ids {
		if id < 0 || int(id) >= tok.VocabSize() {
			return "", sdk.Invalidf("token id %d out of range [0, %d)", id, tok.VocabSize())
		}
	}
	return tok.Decode(ids), nil
}

func (r *Runner) CountTokens(_ context.Context, req *sdk.ChatRequest) (int, error) {
	m := r.Current()
	if m == nil {
		return 0, errNotLoaded
	}
	prompt, err := m.Render(req)
	if err != nil {
		return 0, err
	}
	return len(m.Base().Tok.Encode(prompt, true, true)), nil
}

func (r *Runner) Stats(context.Context) (sdk.ModelStats, error) {
	m := r.Current()
	if m == nil {
		return sdk.ModelStats{}, nil
	}
	return m.Base().Engine.Stats(), nil
}

// Shutdown stops the engine and frees the model; the process then serves
// nothing.
func (r *Runner) Shutdown(ctx context.Context) error {
	r.mu.Lock()
	m := r.m
	r.m = nil
	r.mu.Unlock()
	if m == nil {
		return nil
	}
	return m.Base().Close(ctx)
}
