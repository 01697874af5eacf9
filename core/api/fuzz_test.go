package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// fuzzRoute posts arbitrary bodies to one generation route: the handler must
// never panic, and every refusal must be a 4xx in the route's error shape.
func fuzzRoute(f *testing.F, path string, seeds []string) {
	for _, s := range seeds {
		f.Add(s)
	}
	fr := &fakeRouter{script: stream(evTools...)}
	srv := New(fr, Options{MaxBodyBytes: 1 << 16, MaxJSONDepth: 16, MaxMessages: 16, MaxTokens: 4096})
	// A handler panic is recovered into a 500, which fails the check below.
	srv.opts.Logger = discardLogger()
	f.Fuzz(func(t *testing.T, body string) {
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
		if rec.Code == http.StatusOK {
			return
		}
		if rec.Code != http.StatusBadRequest && rec.Code != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d for body %q: %s", rec.Code, body, rec.Body.String())
		}
		checkFuzzError(t, path, rec.Body.Bytes())
	})
}

func checkFuzzError(t *testing.T, path string, body []byte) {
	t.Helper()
	if shapeOf(path) == shapeAnthropic {
		var e anthropicErrorBody
		if err := json.Unmarshal(body, &e); err != nil || e.Type != "error" || e.Error.Type == "" || e.Error.Message == "" {
			t.Fatalf("not an Anthropic error body: %s", body)
		}
		return
	}
	var e struct {
		Error *openAIErrorObject `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil || e.Error.Type == "" || e.Error.Message == "" {
		t.Fatalf("not an OpenAI error body: %s", body)
	}
}

func FuzzDecodeChat(f *testing.F) {
	fuzzRoute(f, "/v1/chat/completions", []string{
		chatBody + `}`,
		chatBody + `,"stream":true,"stream_options":{"include_usage":true},"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"tool_choice":"auto"}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}]}]}`,
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","function":{"name":"f","arguments":{"a":1}}}]}]}`,
		`{"messages":[],"stop":["a",1],"max_tokens":-1}`,
		`{"messages":[{"role":"tool","content":"x","tool_call_id":"c"}],"response_format":{"type":"json_schema","json_schema":{"schema":{}}}}`,
		`[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]`,
		`{"messages":"hi"}`,
		`{"messages":[{"role":"user","content":"\ud800"}],"temperature":1e999}`,
		``, `null`, `"x"`, `{`,
	})
}

func FuzzDecodeMessages(f *testing.F) {
	fuzzRoute(f, "/v1/messages", []string{
		messagesBody + `}`,
		`{"max_tokens":10,"system":[{"type":"text","text":"s"}],"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"t"},{"type":"tool_use","id":"t","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"r"}]}]}],"thinking":{"type":"enabled","budget_tokens":5},"tool_choice":{"type":"tool","name":"f"},"tools":[{"name":"f","input_schema":{}}]}`,
		`{"max_tokens":10,"messages":[{"role":"user","content":[{"type":"image"}]}]}`,
		`{"max_tokens":10,"messages":[{"role":"user","content":[{"type":"tool_result","content":5}]}]}`,
		`{"max_tokens":"10","messages":null}`,
		`{"max_tokens":10,"system":5,"messages":[{"role":"user","content":[{"text":null}]}]}`,
		``, `[]`, `{"messages":[{"content":[[[[[]]]]]}]}`,
	})
}

func FuzzDecodeResponses(f *testing.F) {
	fuzzRoute(f, "/v1/responses", []string{
		responsesBody + `}`,
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"},{"type":"reasoning","summary":[{"text":"s"}]}],"tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"f"},"reasoning":{"effort":"low"},"text":{"format":{"type":"json_object"}},"stream":true}`,
		`{"input":"x","previous_response_id":"r","store":true}`,
		`{"input":[{"type":"item_reference","id":"x"}]}`,
		`{"input":[{"type":"function_call_output","output":[{"type":"input_image"}]}]}`,
		`{"input":5,"max_output_tokens":0}`,
		``, `{}`, `{"input":[]}`,
	})
}
