package qwendflash

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/jsonprefix"
)

// TestJSONObject runs json_object requests on the tiny random-weight
// models: whatever the weights favour, the answer is a JSON object, or the
// start of one cut by max_tokens.
func TestJSONObject(t *testing.T) {
	q3, q35 := tinyModels(t)
	for _, tc := range []struct {
		name  string
		path  string
		think bool
		// thinkMax closes the reasoning (the prompt opens it) after this
		// many tokens.
		thinkMax int
	}{
		{name: "qwen3 no thinking", path: q3},
		{name: "qwen35 no thinking", path: q35},
		{name: "qwen3 thinking", path: q3, think: true, thinkMax: 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := blockConfig(t, tc.path)
			cfg.ThinkMaxTokens = tc.thinkMax
			_, c, _ := load(t, cfg)
			complete := 0
			for seed := range int64(6) {
				is := is.New(t)
				req := &sdk.ChatRequest{
					Messages: []sdk.Message{{Role: "user", Content: "Answer in JSON."}}, MaxTokens: 120, ResponseFormat: "json_object",
					Sampling: sdk.Sampling{Temperature: f64(1), Seed: i64(seed)},
				}
				req.Reasoning.Enabled = boolp(tc.think)
				s := newStream()
				is.NoErr(c.Start(context.Background(), req, s))
				is.Equal(s.admission().Outcome, sdk.OutcomeAdmitted)
				r := s.summary()
				is.True(r.finish != nil)
				if tc.think {
					is.True(r.reasoning != "") // reasoning is free text
				}
				t.Logf("seed %d: %s %q", seed, r.finish.Reason, r.text)
				var st jsonprefix.State
				is.True(st.Feed([]byte(r.text))) // the text is a JSON object's prefix
				switch r.finish.Reason {
				case sdk.FinishStop:
					var v map[string]any
					is.NoErr(json.Unmarshal([]byte(r.text), &v)) // a complete JSON object
					complete++
				case sdk.FinishLength:
					is.Equal(r.finish.Usage.CompletionTokens, 120)
				default:
					t.Fatalf("seed %d: finish %q", seed, r.finish.Reason)
				}
			}
			t.Logf("%d of 6 complete", complete)
		})
	}
}

func TestJSONSchemaRefused(t *testing.T) {
	q3, _ := tinyModels(t)
	is := is.New(t)
	_, c, _ := load(t, blockConfig(t, q3))
	s := newStream()
	is.NoErr(c.Start(context.Background(), &sdk.ChatRequest{
		ResponseFormat: "json_schema", JSONSchema: json.RawMessage(`{"type":"object","properties":{"a":{"type":"string","format":"email"}}}`),
		Messages: []sdk.Message{{Role: "user", Content: "x"}},
	}, s))
	is.Equal(s.admission().Outcome, sdk.OutcomeInvalid)
	is.True(strings.Contains(s.admission().Reason, `keyword "format" is not supported`)) // names the keyword
}

// TestJSONSchema runs json_schema requests on the tiny random-weight
// models: every answer that finishes is an object the schema admits.
func TestJSONSchema(t *testing.T) {
	q3, _ := tinyModels(t)
	cfg := blockConfig(t, q3)
	cfg.MaxCtx = 512
	_, c, _ := load(t, cfg)
	schema := `{"type":"object","properties":{"answer":{"enum":["yes","no"]},"n":{"type":"integer","minimum":1,"maximum":9}},"required":["answer","n"]}`
	complete := 0
	for seed := range int64(6) {
		is := is.New(t)
		req := &sdk.ChatRequest{
			Messages: []sdk.Message{{Role: "user", Content: "Answer in JSON."}}, MaxTokens: 400,
			ResponseFormat: "json_schema", JSONSchema: json.RawMessage(schema),
			Sampling: sdk.Sampling{Temperature: f64(1), Seed: i64(seed)},
		}
		req.Reasoning.Enabled = boolp(false)
		s := newStream()
		is.NoErr(c.Start(context.Background(), req, s))
		is.Equal(s.admission().Outcome, sdk.OutcomeAdmitted)
		r := s.summary()
		t.Logf("seed %d: %s %q", seed, r.finish.Reason, r.text)
		if r.finish.Reason == sdk.FinishLength {
			continue
		}
		is.Equal(r.finish.Reason, sdk.FinishStop)
		var v struct {
			Answer string `json:"answer"`
			N      int    `json:"n"`
		}
		is.NoErr(json.Unmarshal([]byte(r.text), &v))
		is.True(v.Answer == "yes" || v.Answer == "no") // enum
		is.True(v.N >= 1 && v.N <= 9)                  // bounds
		complete++
	}
	is.New(t).True(complete > 0)
}
