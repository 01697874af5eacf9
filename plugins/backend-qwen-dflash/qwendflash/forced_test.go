package qwendflash

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
)

// calls gathers the tool calls of a stream: names by index and the
// concatenated arguments.
func (s *stream) calls() (names []string, args []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range s.events {
		for _, d := range ev.ToolCalls {
			for len(names) <= d.Index {
				names, args = append(names, ""), append(args, "")
			}
			if d.Name != "" {
				names[d.Index] = d.Name
			}
			args[d.Index] += d.ArgumentsDelta
		}
	}
	return names, args
}

// TestForcedToolChoice runs forced tool choices on the tiny random-weight
// models: whatever the weights favour, every seed's reply is one call of
// the right function with a JSON object of arguments (unless max_tokens
// cut it).
func TestForcedToolChoice(t *testing.T) {
	q3, q35 := tinyModels(t)
	tools := []sdk.Tool{
		{Name: "get_weather", Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string","maxLength":8}},"required":["city"]}`)},
		{Name: "get_time", Parameters: json.RawMessage(`{"type":"object"}`)},
	}
	for _, tc := range []struct {
		name, path string
		choice     sdk.ToolChoice
		tools      []sdk.Tool
		think      bool
		want       string // the function called
	}{
		{"qwen3 named", q3, "function:get_time", tools, false, "get_time"},
		{"qwen35 named, thinking open", q35, "function:get_weather", tools, true, "get_weather"},
		{"qwen3 required, one tool", q3, "required", tools[:1], false, "get_weather"},
		{"qwen3 required, two tools", q3, "required", tools, false, ""},
		{"qwen35 required, two tools", q35, "required", tools, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Room for the whitespace a random model pads JSON with.
			cfg := blockConfig(t, tc.path)
			cfg.MaxCtx = 512
			b, c, _ := load(t, cfg)
			complete := 0
			for seed := range int64(6) {
				is := is.New(t)
				req := &sdk.ChatRequest{
					Messages: []sdk.Message{{Role: "user", Content: "What now?"}}, MaxTokens: 400,
					Tools: tc.tools, ToolChoice: tc.choice,
					Sampling: sdk.Sampling{Temperature: f64(1), Seed: i64(seed)},
				}
				req.Reasoning.Enabled = boolp(tc.think)
				s := newStream()
				is.NoErr(c.Start(context.Background(), req, s))
				is.Equal(s.admission().Outcome, sdk.OutcomeAdmitted)
				r := s.summary()
				names, args := s.calls()
				t.Logf("seed %d: %s %q %q text %q generated %q", seed, r.finish.Reason, names, args, r.text, b.loaded().Tok.Decode(r.tokens))
				is.Equal(strings.TrimSpace(r.text), "") // no text, only the call
				if r.finish.Reason == sdk.FinishLength && len(names) == 0 {
					continue // cut before the name was complete
				}
				is.Equal(len(names), 1) // one call
				if tc.want != "" {
					is.Equal(names[0], tc.want) // of the forced function
				} else {
					is.True(names[0] == "get_weather" || names[0] == "get_time") // of one of the tools
				}
				if r.finish.Reason == sdk.FinishToolCalls {
					var v map[string]any
					is.NoErr(json.Unmarshal([]byte(args[0]), &v)) // arguments are a JSON object
					if names[0] == "get_weather" && tc.want != "" {
						city, ok := v["city"].(string)
						is.True(ok && len([]rune(city)) <= 8) // held to the parameters' schema
					}
					complete++
				} else {
					is.Equal(r.finish.Reason, sdk.FinishLength)
				}
			}
			is.New(t).True(complete > 0) // some seed finished its call
		})
	}
}

func TestForcedToolChoiceNeedsTools(t *testing.T) {
	is := is.New(t)
	q3, _ := tinyModels(t)
	_, c, _ := load(t, blockConfig(t, q3))
	req := &sdk.ChatRequest{Messages: []sdk.Message{{Role: "user", Content: "x"}}, ToolChoice: "required"}
	s := newStream()
	is.NoErr(c.Start(context.Background(), req, s))
	is.Equal(s.admission().Outcome, sdk.OutcomeInvalid)
	is.True(strings.Contains(s.admission().Reason, "needs tools"))
}

// TestRawPrompt runs text completions: the prompt is tokenized as it is
// (no template), ids out of the vocabulary and a suffix are refused.
func TestRawPrompt(t *testing.T) {
	q3, _ := tinyModels(t)
	b, c, _ := load(t, blockConfig(t, q3))
	text := "<|im_start|>user\nhi"
	for _, tc := range []struct {
		name   string
		prompt sdk.RawPrompt
		reason string // refusal, or "" for admitted
	}{
		{"text", sdk.RawPrompt{Text: text}, ""},
		{"token ids", sdk.RawPrompt{Tokens: b.loaded().Tok.Encode(text, true, true)}, ""},
		{"id out of range", sdk.RawPrompt{Tokens: []int32{1, 1 << 30}}, "prompt[1]: token id"},
		{"suffix", sdk.RawPrompt{Text: "a", Suffix: "b"}, "no fill-in-the-middle"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			p := tc.prompt
			req := &sdk.ChatRequest{Prompt: &p, MaxTokens: 5, Sampling: sdk.Sampling{Temperature: f64(0)}}
			s := newStream()
			is.NoErr(c.Start(context.Background(), req, s))
			adm := s.admission()
			if tc.reason != "" {
				is.Equal(adm.Outcome, sdk.OutcomeInvalid)
				is.True(strings.Contains(adm.Reason, tc.reason))
				return
			}
			is.Equal(adm.Outcome, sdk.OutcomeAdmitted)
			// Special tokens in the text are recognised: 4 tokens, not the bytes.
			is.Equal(adm.PromptTokens, len(b.loaded().Tok.Encode(text, true, true)))
			is.True(adm.PromptTokens < len(text))
			r := s.summary()
			is.Equal(r.finish.Usage.PromptTokens, adm.PromptTokens)
			is.Equal(r.reasoning, "") // no output parser: nothing is reasoning
		})
	}
}

func TestForcedToolChoiceWithResponseFormat(t *testing.T) {
	is := is.New(t)
	q3, _ := tinyModels(t)
	_, c, _ := load(t, blockConfig(t, q3))
	req := &sdk.ChatRequest{Messages: []sdk.Message{{Role: "user", Content: "x"}}, ToolChoice: "required",
		Tools: []sdk.Tool{{Name: "f"}}, ResponseFormat: "json_object"}
	s := newStream()
	is.NoErr(c.Start(context.Background(), req, s))
	is.Equal(s.admission().Outcome, sdk.OutcomeInvalid)
	is.True(strings.Contains(s.admission().Reason, "cannot be combined")) // one clear refusal, not a silent choice
}
