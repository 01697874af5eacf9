package nativebackend

import (
	"math/rand/v2"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/jsonprefix"
)

// ResponseFormat maps a request's response_format to the engine's output
// constraint (and the compiled schema of json_schema); what the engine
// cannot constrain is refused naming backend, a schema keyword it cannot
// enforce naming the keyword.
func ResponseFormat(backend string, req *sdk.ChatRequest) (engine.Format, *jsonprefix.Schema, error) {
	switch req.ResponseFormat {
	case "", "text":
		return engine.FormatText, nil, nil
	case "json_object":
		return engine.FormatJSONObject, nil, nil
	case "json_schema":
		s, err := jsonprefix.CompileSchema(req.JSONSchema)
		if err != nil {
			return engine.FormatText, nil, sdk.Invalidf("response_format json_schema: %v", err)
		}
		return engine.FormatJSONSchema, s, nil
	}
	return engine.FormatText, nil, sdk.Invalidf("response_format %q is not supported by the %s backend", req.ResponseFormat, backend)
}

// MaxTokens is the request's max tokens, else the model's default, capped
// at the model's most.
func MaxTokens(req *sdk.ChatRequest, desc sdk.ModelDescription) int {
	n := req.MaxTokens
	if n <= 0 {
		n = desc.DefaultMaxTokens
	}
	return min(n, desc.MaxTokens)
}

// ReasoningBudget is the tightest of the operator's --think-max-tokens, the
// effort budget of the request's reasoning effort, and the request's own
// budget_tokens; 0 means none.
func ReasoningBudget(cfg sdk.ModelConfig, req *sdk.ChatRequest) int {
	budget := 0
	tighten := func(n int) {
		if n > 0 && (budget == 0 || n < budget) {
			budget = n
		}
	}
	tighten(cfg.ThinkMaxTokens)
	if e := req.Reasoning.Effort; e != "" {
		tighten(cfg.EffortBudgets[e])
	}
	tighten(req.Reasoning.BudgetTokens)
	return budget
}

// Sampling applies the settings a request gives over preset (the model
// family's recommendation), refusing values out of range, and draws a seed
// when the request has none.
func Sampling(s sdk.Sampling, preset engine.Sampling) (engine.Sampling, error) {
	out := preset
	if s.Temperature != nil {
		if *s.Temperature < 0 {
			return out, sdk.Invalidf("temperature %g must not be negative", *s.Temperature)
		}
		out.Temperature = float32(*s.Temperature)
	}
	if s.TopP != nil {
		if *s.TopP <= 0 || *s.TopP > 1 {
			return out, sdk.Invalidf("top_p %g must be in (0, 1]", *s.TopP)
		}
		out.TopP = float32(*s.TopP)
	}
	if s.TopK != nil {
		if *s.TopK < 0 {
			return out, sdk.Invalidf("top_k %d must not be negative", *s.TopK)
		}
		out.TopK = *s.TopK
	}
	if s.MinP != nil {
		if *s.MinP < 0 || *s.MinP > 1 {
			return out, sdk.Invalidf("min_p %g must be in [0, 1]", *s.MinP)
		}
		out.MinP = float32(*s.MinP)
	}
	if s.FrequencyPenalty != nil {
		out.FrequencyPenalty = float32(*s.FrequencyPenalty)
	}
	if s.PresencePenalty != nil {
		out.PresencePenalty = float32(*s.PresencePenalty)
	}
	if s.RepetitionPenalty != nil {
		if *s.RepetitionPenalty <= 0 {
			return out, sdk.Invalidf("repetition_penalty %g must be positive", *s.RepetitionPenalty)
		}
		out.RepeatPenalty = float32(*s.RepetitionPenalty)
	}
	if s.Seed != nil {
		out.Seed = uint64(*s.Seed)
	} else {
		out.Seed = rand.Uint64()
	}
	return out, nil
}
