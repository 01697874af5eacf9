package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/matryer/is"
)

// TestRealCompletionsAndConstraints drives the real server and the real
// qwen backend on the tiny random-weight models through what issue 16 added:
// text completions, forced tool calls and json_schema. Random weights favour
// nothing sensible, so what holds here holds because the server enforces it.
func TestRealCompletionsAndConstraints(t *testing.T) {
	qwen3, qwen35 := tinyModels(t)
	s := startServer(t, serverOpts{plugins: []string{"backend-qwen-dflash", "policy-by-name"}, args: realPairArgs(qwen3, qwen35)})

	t.Run("completions with token ids, echo and logprobs", func(t *testing.T) {
		is := is.New(t)
		tok := s.post(t, "/tokenize", map[string]any{"model": "qwen3", "content": "Once upon a time"})
		is.Equal(tok.status, 200)
		ids := decode[struct {
			Tokens []int `json:"tokens"`
		}](t, tok.bodyBytes()).Tokens
		type completion struct {
			Choices []struct {
				Text         string `json:"text"`
				FinishReason string `json:"finish_reason"`
				Logprobs     *struct {
					Tokens     []string             `json:"tokens"`
					TopLogprob []map[string]float64 `json:"top_logprobs"`
					TextOffset []int                `json:"text_offset"`
				} `json:"logprobs"`
			} `json:"choices"`
			Model string `json:"model"`
			Usage struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		c := s.post(t, "/v1/completions", map[string]any{"model": "qwen3", "prompt": ids, "max_tokens": 8, "echo": true, "seed": 3})
		is.Equal(c.status, 200)
		r := decode[completion](t, c.bodyBytes())
		is.Equal(r.Model, "qwen3")
		is.True(strings.HasPrefix(r.Choices[0].Text, "Once upon a time")) // echo detokenized the ids
		is.Equal(r.Usage.PromptTokens, len(ids))                          // the ids as they are, no template

		c = s.post(t, "/v1/completions", map[string]any{"model": "qwen3", "prompt": "Once upon a time", "max_tokens": 8, "logprobs": 3, "seed": 3, "ignore_eos": true})
		is.Equal(c.status, 200)
		r = decode[completion](t, c.bodyBytes())
		lp := r.Choices[0].Logprobs
		is.Equal(len(lp.Tokens), r.Usage.CompletionTokens) // one entry per generated token
		is.Equal(len(lp.Tokens), 8)
		for i := range lp.TopLogprob {
			is.True(len(lp.TopLogprob[i]) >= 1 && len(lp.TopLogprob[i]) <= 3)
			if i > 0 {
				is.True(lp.TextOffset[i] >= lp.TextOffset[i-1]) // offsets grow
			}
		}

		c = s.post(t, "/v1/completions", map[string]any{"model": "qwen3", "prompt": "def f(", "suffix": "return 1", "max_tokens": 8})
		is.Equal(c.status, 400)
		is.True(strings.Contains(string(c.bodyBytes()), "fill-in-the-middle")) // suffix refused clearly
	})

	tools := []map[string]any{
		{"type": "function", "function": map[string]any{"name": "get_weather", "parameters": map[string]any{
			"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string", "maxLength": 12}}, "required": []string{"city"}}}},
		{"type": "function", "function": map[string]any{"name": "get_time", "parameters": map[string]any{"type": "object"}}},
	}
	for _, model := range []string{"qwen3", "qwen35"} {
		for _, tc := range []struct {
			name   string
			choice any
			want   string
		}{
			{"required", "required", ""},
			{"named", map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}}, "get_weather"},
		} {
			t.Run(fmt.Sprintf("%s tool_choice %s", model, tc.name), func(t *testing.T) {
				calls := 0
				for seed := 1; seed <= 3; seed++ {
					is := is.New(t)
					body := chatReq(model, "Hello.", 300, false)
					body["tools"], body["tool_choice"], body["seed"], body["temperature"] = tools, tc.choice, seed, 1.0
					c := s.post(t, pathChat, body)
					is.Equal(c.status, 200)
					r := decode[struct {
						Choices []struct {
							FinishReason string `json:"finish_reason"`
							Message      struct {
								Content   *string `json:"content"`
								ToolCalls []struct {
									Function struct{ Name, Arguments string } `json:"function"`
								} `json:"tool_calls"`
							} `json:"message"`
						} `json:"choices"`
					}](t, c.bodyBytes())
					ch := r.Choices[0]
					if ch.FinishReason == "length" {
						continue // out of tokens mid-call: the random model padded with whitespace
					}
					is.Equal(ch.FinishReason, "tool_calls") // every finished reply is a call
					is.Equal(len(ch.Message.ToolCalls), 1)
					f := ch.Message.ToolCalls[0].Function
					if tc.want != "" {
						is.Equal(f.Name, tc.want)
					}
					var args map[string]any
					is.NoErr(json.Unmarshal([]byte(f.Arguments), &args)) // arguments are an object
					calls++
				}
				is.New(t).True(calls > 0)
			})
		}
	}

	t.Run("messages tool_choice any", func(t *testing.T) {
		is := is.New(t)
		c := s.post(t, pathMessages, map[string]any{"model": "qwen3", "max_tokens": 300, "temperature": 1,
			"messages": []map[string]any{{"role": "user", "content": "Hello."}},
			"tools":    []map[string]any{{"name": "get_time", "input_schema": map[string]any{"type": "object"}}}, "tool_choice": map[string]any{"type": "any"}})
		is.Equal(c.status, 200)
		r := decode[struct {
			StopReason string `json:"stop_reason"`
			Content    []struct {
				Type, Name string
			} `json:"content"`
		}](t, c.bodyBytes())
		if r.StopReason != "max_tokens" {
			is.Equal(r.StopReason, "tool_use")
			is.Equal(r.Content[len(r.Content)-1].Name, "get_time")
		}
	})

	t.Run("json_schema", func(t *testing.T) {
		is := is.New(t)
		schema := map[string]any{"type": "object", "properties": map[string]any{
			"answer": map[string]any{"enum": []string{"yes", "no"}},
			"n":      map[string]any{"type": "integer", "minimum": 0, "maximum": 9}}, "required": []string{"answer", "n"}}
		done := 0
		for seed := 1; seed <= 3; seed++ {
			body := chatReq("qwen3", "JSON please.", 400, false)
			body["seed"], body["temperature"] = seed, 1.0
			body["chat_template_kwargs"] = map[string]any{"enable_thinking": false}
			body["response_format"] = map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "a", "schema": schema}}
			c := s.post(t, pathChat, body)
			is.Equal(c.status, 200)
			r := decode[struct {
				Choices []struct {
					FinishReason string `json:"finish_reason"`
					Message      struct {
						Content string `json:"content"`
					} `json:"message"`
				} `json:"choices"`
			}](t, c.bodyBytes())
			if r.Choices[0].FinishReason == "length" {
				continue
			}
			var v struct {
				Answer string `json:"answer"`
				N      *int   `json:"n"`
			}
			is.NoErr(json.Unmarshal([]byte(r.Choices[0].Message.Content), &v))
			is.True(v.Answer == "yes" || v.Answer == "no")
			is.True(v.N != nil && *v.N >= 0 && *v.N <= 9)
			done++
		}
		is.True(done > 0)

		schema["properties"].(map[string]any)["answer"] = map[string]any{"type": "string", "pattern": "y.*"}
		body := chatReq("qwen3", "JSON please.", 20, false)
		body["response_format"] = map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "a", "schema": schema}}
		c := s.post(t, pathChat, body)
		is.Equal(c.status, 400)
		is.True(strings.Contains(string(c.bodyBytes()), `keyword \"pattern\" is not supported`)) // names the keyword
	})
}
