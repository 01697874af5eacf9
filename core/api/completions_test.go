package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
)

func TestDecodeCompletionPrompt(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       *sdk.RawPrompt
		param      string // the field a refusal names
	}{
		{"string", `{"prompt":"Once upon"}`, &sdk.RawPrompt{Text: "Once upon"}, ""},
		{"token ids", `{"prompt":[1,2,3]}`, &sdk.RawPrompt{Tokens: []int32{1, 2, 3}}, ""},
		{"one string in an array", `{"prompt":["Once"]}`, &sdk.RawPrompt{Text: "Once"}, ""},
		{"one token array in an array", `{"prompt":[[7,8]]}`, &sdk.RawPrompt{Tokens: []int32{7, 8}}, ""},
		{"suffix kept for the backend", `{"prompt":"def f(","suffix":"return x"}`, &sdk.RawPrompt{Text: "def f(", Suffix: "return x"}, ""},
		{"missing", `{"model":"m"}`, nil, "prompt"},
		{"empty string", `{"prompt":""}`, nil, "prompt"},
		{"empty array", `{"prompt":[]}`, nil, "prompt"},
		{"several prompts", `{"prompt":["a","b"]}`, nil, "prompt"},
		{"negative token", `{"prompt":[1,-2]}`, nil, "prompt[1]"},
		{"fractional token", `{"prompt":[1.5]}`, nil, "prompt"},
		{"object", `{"prompt":{"text":"a"}}`, nil, "prompt"},
		{"array of objects", `{"prompt":[{"a":1}]}`, nil, "prompt[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			req, _, err := decodeCompletion([]byte(tc.body), testLimits)
			if tc.want == nil {
				is.True(err != nil)
				is.Equal(err.param, tc.param)
				is.Equal(err.status, http.StatusBadRequest)
				return
			}
			is.True(err == nil)
			is.Equal(mustJSON(req.Prompt), mustJSON(tc.want))
			is.Equal(len(req.Messages), 0)
		})
	}
}

func TestDecodeCompletionSettings(t *testing.T) {
	is := is.New(t)
	req, opts, err := decodeCompletion([]byte(`{"model":"m","prompt":"x","max_tokens":50,"temperature":0.2,"top_p":0.5,"seed":3,
		"stop":"\n","logprobs":2,"stream":true,"stream_options":{"include_usage":true},"n":1,"best_of":1}`), testLimits)
	is.True(err == nil)
	is.Equal(opts, completionOptions{stream: true, includeUsage: true, logprobs: true})
	is.Equal(req.MaxTokens, 50)
	is.Equal(*req.Sampling.Temperature, 0.2)
	is.Equal(*req.Sampling.Seed, int64(3))
	is.Equal(req.Stop, []string{"\n"})
	is.True(req.Logprobs)
	is.Equal(req.TopLogprobs, 2)

	// OpenAI's default length for this API.
	req, _, err = decodeCompletion([]byte(`{"prompt":"x"}`), testLimits)
	is.True(err == nil)
	is.Equal(req.MaxTokens, defaultCompletionTokens)

	for body, param := range map[string]string{
		`{"prompt":"x","n":2}`:                    "n",
		`{"prompt":"x","best_of":3}`:              "best_of",
		`{"prompt":"x","logprobs":21}`:            "logprobs",
		`{"prompt":"x","logprobs":1,"echo":true}`: "logprobs",
		`{"prompt":"x","max_tokens":0}`:           "max_tokens",
		`{"prompt":"x","temperature":3}`:          "temperature",
		`{"prompt":"x","stop":[""]}`:              "stop",
	} {
		_, _, err := decodeCompletion([]byte(body), testLimits)
		is.True(err != nil) // body refused
		is.Equal(err.param, param)
	}
}

func TestCompletionWhole(t *testing.T) {
	lp := func(tok string, v float64) sdk.TokenLogprob {
		return sdk.TokenLogprob{Token: tok, Logprob: v, Top: []sdk.TopLogprob{{Token: tok, Logprob: v}, {Token: "z", Logprob: -9}}}
	}
	for _, tc := range []struct {
		name, body, text string
		offsets          []int
	}{
		{"plain", `{"prompt":"Hi","logprobs":2}`, " there é!", []int{0, 6, 7}},
		{"echo of text", `{"prompt":"Hi","echo":true}`, "Hi there é!", nil},
		{"echo of token ids", `{"prompt":[72,105],"echo":true}`, "Hi there é!", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			fr := &fakeRouter{script: stream(
				sdk.Event{Text: " there", TokenIDs: []int32{1}, Logprobs: []sdk.TokenLogprob{lp(" there", -0.5)}},
				// é split across two tokens: the next token starts at the é.
				sdk.Event{Text: " \xc3", TokenIDs: []int32{2}, Logprobs: []sdk.TokenLogprob{lp(" \xc3", -1)}},
				sdk.Event{Text: "\xa9!", TokenIDs: []int32{3}, Logprobs: []sdk.TokenLogprob{lp("\xa9!", -2)}},
				finish(sdk.FinishLength, 2, 3))}
			rec := do(New(fr, Options{Logger: discardLogger()}), "POST", "/v1/completions", tc.body, nil)
			is.Equal(rec.Code, 200)
			var got struct {
				ID      string `json:"id"`
				Object  string `json:"object"`
				Model   string `json:"model"`
				Choices []struct {
					Text         string          `json:"text"`
					FinishReason string          `json:"finish_reason"`
					Logprobs     *legacyLogprobs `json:"logprobs"`
				} `json:"choices"`
				Usage completionUsage `json:"usage"`
			}
			is.NoErr(json.Unmarshal(rec.Body.Bytes(), &got))
			is.True(strings.HasPrefix(got.ID, "cmpl-"))
			is.Equal(got.Object, "text_completion")
			is.Equal(got.Model, "fake-model")
			is.Equal(len(got.Choices), 1)
			is.Equal(got.Choices[0].Text, tc.text)
			is.Equal(got.Choices[0].FinishReason, "length")
			is.Equal(got.Usage, completionUsage{PromptTokens: 2, CompletionTokens: 3, TotalTokens: 5})
			is.Equal(fr.lastRequest().Prompt != nil, true)
			if tc.offsets == nil {
				is.True(got.Choices[0].Logprobs == nil)
				return
			}
			l := got.Choices[0].Logprobs
			is.Equal(l.TextOffset, tc.offsets)
			is.Equal(l.TokenLogprobs, []float64{-0.5, -1, -2})
			is.Equal(l.Tokens[0], " there")
			is.Equal(l.TopLogprobs[0], map[string]float64{" there": -0.5, "z": -9})
		})
	}
}

func TestCompletionStream(t *testing.T) {
	is := is.New(t)
	fr := &fakeRouter{script: stream(sdk.Event{Text: "a"}, sdk.Event{Text: "b"}, finish(sdk.FinishStop, 4, 2))}
	rec := do(New(fr, Options{Logger: discardLogger()}), "POST", "/v1/completions",
		`{"prompt":"Q","echo":true,"stream":true,"stream_options":{"include_usage":true}}`, nil)
	is.Equal(rec.Code, 200)
	var texts []string
	var finishes []string
	var usage *completionUsage
	var done bool
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var ch struct {
			Object  string `json:"object"`
			Choices []struct {
				Text         string  `json:"text"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *completionUsage `json:"usage"`
		}
		is.NoErr(json.Unmarshal([]byte(data), &ch))
		is.Equal(ch.Object, "text_completion")
		if ch.Usage != nil {
			is.Equal(len(ch.Choices), 0) // the usage chunk has no choices
			usage = ch.Usage
		}
		for _, c := range ch.Choices {
			texts = append(texts, c.Text)
			if c.FinishReason != nil {
				finishes = append(finishes, *c.FinishReason)
			}
		}
	}
	is.Equal(texts, []string{"Q", "a", "b", ""})
	is.Equal(finishes, []string{"stop"})
	is.Equal(*usage, completionUsage{PromptTokens: 4, CompletionTokens: 2, TotalTokens: 6})
	is.True(done)
}

func TestDecodeStructuredOutputs(t *testing.T) {
	const schema = `{"type":"object","properties":{"a":{"type":"string"}}}`
	for _, tc := range []struct {
		name, path, body string
		param            string // refusal names it; "" for accepted
	}{
		{"chat json_schema", "chat", `{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":` + schema + `}}}`, ""},
		{"responses json_schema", "responses", `{"input":"x","text":{"format":{"type":"json_schema","name":"n","schema":` + schema + `}}}`, ""},
		{"anthropic output_format", "messages", `{"max_tokens":5,"messages":[{"role":"user","content":"x"}],"output_format":{"type":"json_schema","schema":` + schema + `}}`, ""},
		{"anthropic output_config", "messages", `{"max_tokens":5,"messages":[{"role":"user","content":"x"}],"output_config":{"format":{"type":"json_schema","schema":` + schema + `}}}`, ""},
		{"anthropic both", "messages", `{"max_tokens":5,"messages":[{"role":"user","content":"x"}],"output_format":{"type":"json_schema","schema":{}},"output_config":{"format":{"type":"json_schema","schema":{}}}}`, "output_config.format"},
		{"anthropic other type", "messages", `{"max_tokens":5,"messages":[{"role":"user","content":"x"}],"output_format":{"type":"xml"}}`, "output_format.type"},
		{"anthropic no schema", "messages", `{"max_tokens":5,"messages":[{"role":"user","content":"x"}],"output_format":{"type":"json_schema"}}`, "output_format.schema"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			var req *sdk.ChatRequest
			var err *apiError
			switch tc.path {
			case "chat":
				req, _, err = decodeChat([]byte(tc.body), testLimits)
			case "responses":
				req, _, _, err = decodeResponses([]byte(tc.body), testLimits)
			case "messages":
				req, _, err = decodeMessages([]byte(tc.body), testLimits, false)
			}
			if tc.param != "" {
				is.True(err != nil)
				is.Equal(err.param, tc.param)
				return
			}
			is.True(err == nil)
			is.Equal(req.ResponseFormat, "json_schema")
			is.Equal(string(req.JSONSchema), schema)
		})
	}
}
