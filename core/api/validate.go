package api

import (
	"math"

	"github.com/dflash/dflash_server/sdk"
)

func checkFloat(field string, v *float64, lo, hi float64) *apiError {
	if v == nil {
		return nil
	}
	if math.IsNaN(*v) || *v < lo || *v > hi {
		return badRequest(field, "%s must be between %g and %g, got %g", field, lo, hi, *v)
	}
	return nil
}

func checkInt(field string, v *int, lo, hi int) *apiError {
	if v == nil {
		return nil
	}
	if *v < lo || *v > hi {
		return badRequest(field, "%s must be between %d and %d, got %d", field, lo, hi, *v)
	}
	return nil
}

// checkCommon validates what every API shares once the request is in neutral
// form: token bounds, sampler ranges and the message count.
func checkCommon(req *sdk.ChatRequest, maxTokensField string, lim limits) *apiError {
	if req.MaxTokens < 0 || req.MaxTokens > lim.maxTokens {
		return badRequest(maxTokensField, "%s must be between 1 and %d, got %d", maxTokensField, lim.maxTokens, req.MaxTokens)
	}
	if req.MinTokens < 0 || req.MinTokens > lim.maxTokens {
		return badRequest("min_tokens", "min_tokens must be between 0 and %d, got %d", lim.maxTokens, req.MinTokens)
	}
	sp := &req.Sampling
	for _, c := range []*apiError{
		checkFloat("temperature", sp.Temperature, 0, 2),
		checkFloat("top_p", sp.TopP, 0, 1),
		checkInt("top_k", sp.TopK, -1, math.MaxInt32),
		checkFloat("min_p", sp.MinP, 0, 1),
		checkFloat("frequency_penalty", sp.FrequencyPenalty, -2, 2),
		checkFloat("presence_penalty", sp.PresencePenalty, -2, 2),
		checkFloat("repetition_penalty", sp.RepetitionPenalty, 0, 10),
		checkInt("top_logprobs", &req.TopLogprobs, 0, 20),
	} {
		if c != nil {
			return c
		}
	}
	if len(req.Stop) > maxStops {
		return badRequest("stop", "at most %d stop sequences are allowed, got %d", maxStops, len(req.Stop))
	}
	for _, s := range req.Stop {
		if s == "" {
			return badRequest("stop", "stop sequences must not be empty")
		}
	}
	if len(req.Messages) > lim.maxMessages {
		return badRequest("messages", "at most %d messages are allowed, got %d", lim.maxMessages, len(req.Messages))
	}
	nameToolResults(req.Messages)
	return nil
}

// maxStops bounds stop strings: each one is checked after every token.
const maxStops = 32

// nameToolResults fills the tool name of tool-result messages from the call
// they answer: neither OpenAI nor Anthropic results carry it, and some chat
// templates render it.
func nameToolResults(msgs []sdk.Message) {
	names := map[string]string{}
	for i := range msgs {
		m := &msgs[i]
		for _, c := range m.ToolCalls {
			if c.ID != "" {
				names[c.ID] = c.Name
			}
		}
		if m.Role == "tool" && m.Name == "" && m.ToolCallID != "" {
			m.Name = names[m.ToolCallID]
		}
	}
}
