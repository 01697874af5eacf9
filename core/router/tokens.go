package router

import (
	"context"
	"fmt"
	"strings"

	"github.com/dflash/dflash_server/core/health"
	"github.com/dflash/dflash_server/sdk"
)

// resolve picks the model for a token utility: with one model loaded any
// name uses it; with several the name must be one of them.
func (r *Router) resolve(name string) (*Model, error) {
	switch {
	case len(r.models) == 0:
		return nil, rejection(ReasonBackendUnavailable, nil, "no model is loaded")
	case len(r.models) == 1:
		return r.ready(r.models[0])
	case name == "" || name == "auto":
		return nil, rejection(ReasonModelRequired, nil,
			"several models are loaded: name one of %s", strings.Join(r.names, ", "))
	}
	i, ok := r.index[name]
	if !ok {
		return nil, rejection(ReasonUnknownModel, ErrUnknownModel,
			"model %q is not loaded; loaded models: %s", name, strings.Join(r.names, ", "))
	}
	return r.ready(r.models[i])
}

func (r *Router) ready(m *Model) (*Model, error) {
	if st, _ := m.health(); st != health.Ready {
		return nil, rejection(ReasonBackendUnavailable, nil, "model %s is %s", m.Name, st)
	}
	return m, nil
}

// Tokenize turns text into the named model's token ids (see resolve for
// the name rules). No fallback and no queueing.
func (r *Router) Tokenize(ctx context.Context, model, text string, addSpecial bool) (string, []int32, error) {
	m, err := r.resolve(model)
	if err != nil {
		return "", nil, err
	}
	ids, err := m.Backend.Tokenize(ctx, text, addSpecial)
	if err != nil {
		return m.Name, nil, fmt.Errorf("tokenize with %s: %w", m.Name, err)
	}
	return m.Name, ids, nil
}

// Detokenize turns ids into text with the named model's tokenizer.
func (r *Router) Detokenize(ctx context.Context, model string, ids []int32) (string, string, error) {
	m, err := r.resolve(model)
	if err != nil {
		return "", "", err
	}
	text, err := m.Backend.Detokenize(ctx, ids)
	if err != nil {
		return m.Name, "", fmt.Errorf("detokenize with %s: %w", m.Name, err)
	}
	return m.Name, text, nil
}

// CountTokens renders req with the template of the model req.Model names
// and counts its prompt tokens, admitting nothing.
func (r *Router) CountTokens(ctx context.Context, req *sdk.ChatRequest) (string, int, error) {
	if req == nil {
		return "", 0, rejection(ReasonInvalidRequest, nil, "no request")
	}
	m, err := r.resolve(req.Model)
	if err != nil {
		return "", 0, err
	}
	n, err := m.Backend.CountTokens(ctx, req)
	if err != nil {
		return m.Name, 0, fmt.Errorf("count tokens with %s: %w", m.Name, err)
	}
	return m.Name, n, nil
}
