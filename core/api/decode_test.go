package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
)

var testLimits = limits{maxBody: 1 << 20, maxDepth: 32, maxMessages: 8, maxTokens: 4096}

func ptr[T any](v T) *T { return &v }

func TestDecodeChat(t *testing.T) {
	is := is.New(t)
	body := `{"model":"qwen","messages":[
		{"role":"developer","content":"Be brief."},
		{"role":"user","content":[{"type":"text","text":"Weather "},{"type":"text","text":"in Oslo?"}]},
		{"role":"assistant","content":null,"reasoning_content":"Use the tool.","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}}]},
		{"role":"tool","tool_call_id":"call_1","content":"sunny"}],
		"max_tokens":100,"max_completion_tokens":200,"temperature":0.5,"top_p":0.9,"top_k":40,"min_p":0.05,"seed":7,
		"stop":["\n\n","END"],"frequency_penalty":0.1,"presence_penalty":-0.1,"repetition_penalty":1.1,"n":1,
		"logprobs":true,"top_logprobs":3,
		"tools":[{"type":"function","function":{"name":"get_weather","description":"d","parameters":{"type":"object"}}}],
		"tool_choice":{"type":"function","function":{"name":"get_weather"}},"parallel_tool_calls":false,
		"response_format":{"type":"json_object"},"reasoning_effort":"high",
		"chat_template_kwargs":{"enable_thinking":false},"stream":true,"stream_options":{"include_usage":true},
		"ignore_eos":true,"min_tokens":5,"user":"ignored","metadata":{"x":"y"}}`
	req, opts, err := decodeChat([]byte(body), testLimits)
	is.True(err == nil)
	is.Equal(opts, chatOptions{stream: true, includeUsage: true})
	want := &sdk.ChatRequest{
		Model: "qwen",
		Messages: []sdk.Message{
			{Role: "system", Content: "Be brief."},
			{Role: "user", Content: "Weather in Oslo?"},
			{Role: "assistant", ReasoningContent: "Use the tool.", ToolCalls: []sdk.ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Oslo"}`}}},
			{Role: "tool", ToolCallID: "call_1", Name: "get_weather", Content: "sunny"},
		},
		Tools:             []sdk.Tool{{Name: "get_weather", Description: "d", Parameters: json.RawMessage(`{"type":"object"}`)}},
		ToolChoice:        "function:get_weather",
		ParallelToolCalls: ptr(false),
		MaxTokens:         200,
		Sampling: sdk.Sampling{Temperature: ptr(0.5), TopP: ptr(0.9), TopK: ptr(40), MinP: ptr(0.05), Seed: ptr(int64(7)),
			FrequencyPenalty: ptr(0.1), PresencePenalty: ptr(-0.1), RepetitionPenalty: ptr(1.1)},
		Stop:           []string{"\n\n", "END"},
		Logprobs:       true,
		TopLogprobs:    3,
		ResponseFormat: "json_object",
		Reasoning:      sdk.Reasoning{Enabled: ptr(false), Effort: "high"},
		IgnoreEOS:      true,
		MinTokens:      5,
		TemplateKwargs: map[string]any{"enable_thinking": false},
	}
	is.Equal(mustJSON(req), mustJSON(want))
}

func TestDecodeMessages(t *testing.T) {
	is := is.New(t)
	body := `{"model":"claude-x","max_tokens":512,"system":[{"type":"text","text":"Be brief."},{"type":"text","text":"Be kind."}],
		"messages":[
		{"role":"user","content":"Weather?"},
		{"role":"assistant","content":[{"type":"thinking","thinking":"Use the tool.","signature":"abc"},{"type":"text","text":"Checking."},
			{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city": "Oslo"}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"sunny"}]},{"type":"text","text":"And tomorrow?"}]}],
		"stop_sequences":["END"],"temperature":0.2,"top_p":0.8,"top_k":20,
		"tools":[{"name":"get_weather","description":"d","input_schema":{"type":"object"}}],
		"tool_choice":{"type":"any","disable_parallel_tool_use":true},
		"thinking":{"type":"enabled","budget_tokens":256},"stream":true,"ignore_eos":true,"min_tokens":3,"metadata":{"user_id":"u"}}`
	req, stream, err := decodeMessages([]byte(body), testLimits, false)
	is.True(err == nil)
	is.True(stream)
	want := &sdk.ChatRequest{
		Model: "claude-x",
		Messages: []sdk.Message{
			{Role: "system", Content: "Be brief.\nBe kind."},
			{Role: "user", Content: "Weather?"},
			{Role: "assistant", Content: "Checking.", ReasoningContent: "Use the tool.", ToolCalls: []sdk.ToolCall{{ID: "toolu_1", Name: "get_weather", Arguments: `{"city":"Oslo"}`}}},
			{Role: "tool", ToolCallID: "toolu_1", Name: "get_weather", Content: "sunny"},
			{Role: "user", Content: "And tomorrow?"},
		},
		Tools:             []sdk.Tool{{Name: "get_weather", Description: "d", Parameters: json.RawMessage(`{"type":"object"}`)}},
		ToolChoice:        "required",
		ParallelToolCalls: ptr(false),
		MaxTokens:         512,
		Sampling:          sdk.Sampling{Temperature: ptr(0.2), TopP: ptr(0.8), TopK: ptr(20)},
		Stop:              []string{"END"},
		Reasoning:         sdk.Reasoning{Enabled: ptr(true), BudgetTokens: 256},
		IgnoreEOS:         true,
		MinTokens:         3,
	}
	is.Equal(mustJSON(req), mustJSON(want))
}

func TestDecodeResponses(t *testing.T) {
	is := is.New(t)
	body := `{"model":"gpt-x","instructions":"Be brief.","max_output_tokens":300,"temperature":0.3,"top_p":0.7,
		"input":[
		{"role":"user","content":"Weather?"},
		{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"Use "}],"content":[{"type":"reasoning_text","text":"the tool."}]},
		{"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Oslo\"}"},
		{"type":"function_call_output","call_id":"call_1","output":"sunny"},
		{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Sunny."}]},
		{"type":"message","role":"user","content":[{"type":"input_text","text":"Thanks"}]}],
		"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}],"tool_choice":"required",
		"parallel_tool_calls":true,"reasoning":{"effort":"medium","summary":"auto"},"text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object"}}},
		"stream":true,"store":false,"min_tokens":2}`
	req, stream, echo, err := decodeResponses([]byte(body), testLimits)
	is.True(err == nil)
	is.True(stream)
	is.Equal(*echo.instructions, "Be brief.")
	want := &sdk.ChatRequest{
		Model: "gpt-x",
		Messages: []sdk.Message{
			{Role: "system", Content: "Be brief."},
			{Role: "user", Content: "Weather?"},
			{Role: "assistant", ReasoningContent: "Use the tool.", ToolCalls: []sdk.ToolCall{{ID: "call_1", Name: "get_weather", Arguments: `{"city":"Oslo"}`}}},
			{Role: "tool", ToolCallID: "call_1", Name: "get_weather", Content: "sunny"},
			{Role: "assistant", Content: "Sunny."},
			{Role: "user", Content: "Thanks"},
		},
		Tools:             []sdk.Tool{{Name: "get_weather", Parameters: json.RawMessage(`{"type":"object"}`)}},
		ToolChoice:        "required",
		ParallelToolCalls: ptr(true),
		MaxTokens:         300,
		Sampling:          sdk.Sampling{Temperature: ptr(0.3), TopP: ptr(0.7)},
		ResponseFormat:    "json_schema",
		JSONSchema:        json.RawMessage(`{"type":"object"}`),
		Reasoning:         sdk.Reasoning{Effort: "medium"},
		MinTokens:         2,
	}
	is.Equal(mustJSON(req), mustJSON(want))
}

func mustJSON(v any) string {
	b, err := json.MarshalIndent(v, "", " ")
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestRequestErrors checks that bad bodies get one clear 400/413 naming the
// culprit, in the route's shape.
func TestRequestErrors(t *testing.T) {
	deep := strings.Repeat("[", 40) + strings.Repeat("]", 40)
	manyMsgs := `{"model":"m","max_tokens":5,"messages":[` + strings.TrimSuffix(strings.Repeat(`{"role":"user","content":"x"},`, 9), ",") + `]`
	tests := []struct {
		name   string
		path   string
		body   string
		status int
		param  string
		inMsg  string
	}{
		{"empty body", "/v1/chat/completions", ``, 400, "", "empty"},
		{"not json", "/v1/chat/completions", `{"model":`, 400, "", "invalid JSON"},
		{"array body", "/v1/chat/completions", `[1]`, 400, "", "JSON object"},
		{"too deep", "/v1/chat/completions", `{"x":` + deep + `}`, 400, "", "nested deeper than 32"},
		{"too large", "/v1/chat/completions", `{"model":"` + strings.Repeat("x", 2<<20) + `"}`, 413, "", "larger than the limit"},
		{"wrong type", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}`, 400, "temperature", "temperature"},
		{"no messages", "/v1/chat/completions", `{"model":"m"}`, 400, "messages", "messages is required"},
		{"too many messages", "/v1/chat/completions", manyMsgs + `}`, 400, "messages", "at most 8 messages"},
		{"max_tokens zero", "/v1/chat/completions", chatBody + `,"max_tokens":0}`, 400, "max_tokens", "at least 1"},
		{"max_tokens too big", "/v1/chat/completions", chatBody + `,"max_tokens":5000}`, 400, "max_tokens", "between 1 and 4096"},
		{"max_completion_tokens negative", "/v1/chat/completions", chatBody + `,"max_completion_tokens":-1}`, 400, "max_completion_tokens", "at least 1"},
		{"temperature range", "/v1/chat/completions", chatBody + `,"temperature":3}`, 400, "temperature", "between 0 and 2"},
		{"n=2", "/v1/chat/completions", chatBody + `,"n":2}`, 400, "n", "n must be 1"},
		{"bad role", "/v1/chat/completions", `{"messages":[{"role":"robot","content":"x"}]}`, 400, "messages[0].role", "robot"},
		{"image part", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "messages[0].content[0].type", "image_url"},
		{"bad tool type", "/v1/chat/completions", chatBody + `,"tools":[{"type":"retrieval"}]}`, 400, "tools[0].type", "function"},
		{"unknown tool_choice", "/v1/chat/completions", chatBody + `,"tool_choice":{"type":"function","function":{"name":"nope"}}}`, 400, "tool_choice.function.name", "nope"},
		{"bad tool_choice mode", "/v1/chat/completions", chatBody + `,"tool_choice":"sometimes"}`, 400, "tool_choice", `got "sometimes"`},
		{"bad stop", "/v1/chat/completions", chatBody + `,"stop":5}`, 400, "stop", "string"},
		{"bad effort", "/v1/chat/completions", chatBody + `,"reasoning_effort":"max"}`, 400, "reasoning_effort", "max"},
		{"bad response_format", "/v1/chat/completions", chatBody + `,"response_format":{"type":"xml"}}`, 400, "response_format.type", "xml"},
		{"top_logprobs without logprobs", "/v1/chat/completions", chatBody + `,"top_logprobs":2}`, 400, "top_logprobs", "logprobs"},
		{"enable_thinking not bool", "/v1/chat/completions", chatBody + `,"chat_template_kwargs":{"enable_thinking":"yes"}}`, 400, "chat_template_kwargs.enable_thinking", "boolean"},

		{"messages no max_tokens", "/v1/messages", `{"messages":[{"role":"user","content":"x"}]}`, 400, "", "max_tokens is required"},
		{"messages system role", "/v1/messages", `{"max_tokens":5,"messages":[{"role":"system","content":"x"}]}`, 400, "", "messages[0].role"},
		{"messages image", "/v1/messages", `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`, 400, "", `"image"`},
		{"messages budget", "/v1/messages", `{"max_tokens":5,"thinking":{"type":"enabled","budget_tokens":10},"messages":[{"role":"user","content":"x"}]}`, 400, "", "budget_tokens"},
		{"messages server tool", "/v1/messages", `{"max_tokens":5,"tools":[{"type":"web_search_20250305","name":"web_search"}],"messages":[{"role":"user","content":"x"}]}`, 400, "", "server tools"},
		{"messages too large", "/v1/messages", `{"x":"` + strings.Repeat("x", 2<<20) + `"}`, 413, "", "larger than the limit"},
		{"messages too many", "/v1/messages", manyMsgs + `}`, 400, "", "at most 8 messages"},
		{"messages max_tokens too big", "/v1/messages", `{"max_tokens":99999,"messages":[{"role":"user","content":"x"}]}`, 400, "", "between 1 and 4096"},
		{"count_tokens bad block", "/v1/messages/count_tokens", `{"messages":[{"role":"user","content":[{"type":"document"}]}]}`, 400, "", "document"},

		{"responses previous_response_id", "/v1/responses", `{"input":"x","previous_response_id":"resp_1"}`, 400, "previous_response_id", "not supported"},
		{"responses store", "/v1/responses", `{"input":"x","store":true}`, 400, "store", "not supported"},
		{"responses no input", "/v1/responses", `{"model":"m"}`, 400, "input", "input is required"},
		{"responses web_search", "/v1/responses", `{"input":"x","tools":[{"type":"web_search"}]}`, 400, "tools[0].type", "function"},
		{"responses bad tool_choice mode", "/v1/responses", `{"input":"x","tool_choice":"sometimes"}`, 400, "tool_choice", `got "sometimes"`},
		{"responses item_reference", "/v1/responses", `{"input":[{"type":"item_reference","id":"x"}]}`, 400, "input[0].type", "item_reference"},
		{"responses max_output_tokens", "/v1/responses", `{"input":"x","max_output_tokens":0}`, 400, "max_output_tokens", "at least 1"},
		{"responses too many items", "/v1/responses", `{"input":[` + strings.TrimSuffix(strings.Repeat(`{"role":"user","content":"x"},`, 9), ",") + `]}`, 400, "input", "at most 8"},

		{"tokenize no content", "/tokenize", `{"model":"m"}`, 400, "content", "content is required"},
		{"detokenize not ints", "/detokenize", `{"tokens":["a"]}`, 400, "tokens", "tokens"},
		{"detokenize out of range", "/detokenize", `{"tokens":[99999999999]}`, 400, "tokens", "tokens"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			fr := &fakeRouter{script: stream(evLength...)}
			s := newTestServer(fr, Options{MaxBodyBytes: 1 << 20, MaxJSONDepth: 32, MaxMessages: 8, MaxTokens: 4096})
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, tc.path, strings.NewReader(tc.body)))
			is.Equal(rec.Code, tc.status)
			is.True(fr.lastRequest() == nil) // refused before routing
			sh := shapeOf(tc.path)
			if sh == shapeAnthropic {
				var b anthropicErrorBody
				is.NoErr(json.Unmarshal(rec.Body.Bytes(), &b))
				is.Equal(b.Type, "error")
				want := "invalid_request_error"
				if tc.status == 413 {
					want = "request_too_large"
				}
				is.Equal(b.Error.Type, want)
				is.True(strings.Contains(b.Error.Message, tc.inMsg)) // message names the problem
				return
			}
			var b openAIErrorBody
			is.NoErr(json.Unmarshal(rec.Body.Bytes(), &b))
			is.Equal(b.Error.Type, "invalid_request_error")
			is.Equal(deref(b.Error.Param), tc.param)
			is.True(strings.Contains(b.Error.Message, tc.inMsg)) // message names the problem
		})
	}
}
