package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/core/router"
	"github.com/dflash/dflash_server/sdk"
)

type routeCase struct {
	path  string
	body  string
	shape shape
	// tokens routes fail through the token utilities, not Start.
	tokens bool
}

var errorRoutes = []routeCase{
	{path: "/v1/chat/completions", body: chatBody + `}`, shape: shapeOpenAI},
	{path: "/v1/chat/completions", body: chatBody + `,"stream":true}`, shape: shapeOpenAI},
	{path: "/v1/messages", body: messagesBody + `}`, shape: shapeAnthropic},
	{path: "/v1/messages", body: messagesBody + `,"stream":true}`, shape: shapeAnthropic},
	{path: "/v1/responses", body: responsesBody + `}`, shape: shapeOpenAI},
	{path: "/v1/responses", body: responsesBody + `,"stream":true}`, shape: shapeOpenAI},
	{path: "/v1/messages/count_tokens", body: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, shape: shapeAnthropic, tokens: true},
	{path: "/tokenize", body: `{"model":"m","content":"hi"}`, shape: shapeOpenAI, tokens: true},
	{path: "/detokenize", body: `{"model":"m","tokens":[1]}`, shape: shapeOpenAI, tokens: true},
}

// TestErrorMapping checks every route × refusal: status, the route's body
// shape, Retry-After and the reject-reason header.
func TestErrorMapping(t *testing.T) {
	reasons := []struct {
		err           error
		status        int
		openAIType    string
		code          string
		param         string
		anthropicType string
		retryAfter    string
		reasonHeader  string
	}{
		{&router.Rejection{Reason: router.ReasonQueueFull, Message: "queue is full (32)"}, 503, "unavailable_error", "queue_full", "", "overloaded_error", "1", "queue-full"},
		{&router.Rejection{Reason: router.ReasonQueueTimeout, Message: "waited 30s"}, 503, "unavailable_error", "queue_timeout", "", "overloaded_error", "1", "queue-timeout"},
		{&router.Rejection{Reason: router.ReasonShuttingDown, Message: "draining"}, 503, "unavailable_error", "shutting_down", "", "overloaded_error", "1", "shutting-down"},
		{&router.Rejection{Reason: router.ReasonBackendUnavailable, Message: "restarting"}, 503, "unavailable_error", "backend_unavailable", "", "overloaded_error", "1", "backend-unavailable"},
		{&router.Rejection{Reason: router.ReasonNeverFits, Message: "needs 9000 tokens; qwen holds 4096"}, 400, "invalid_request_error", "context_length_exceeded", "", "invalid_request_error", "", "never-fits"},
		{&router.Rejection{Reason: router.ReasonInvalidRequest, Message: "template error"}, 400, "invalid_request_error", "invalid_value", "", "invalid_request_error", "", "invalid-request"},
		{&router.Rejection{Reason: router.ReasonUnknownModel, Message: `model "x" is not loaded`}, 404, "invalid_request_error", "model_not_found", "model", "not_found_error", "", "unknown-model"},
		{&router.Rejection{Reason: router.ReasonModelRequired, Message: "name one of: a, b"}, 400, "invalid_request_error", "model_required", "model", "invalid_request_error", "", "model-required"},
		{errors.New("plugin connection lost"), 500, "server_error", "internal_error", "", "api_error", "", ""},
		// A plugin's refusal of bad input (an out-of-range token id) is the
		// client's error, not the server's.
		{fmt.Errorf("detokenize with m: %w", &sdk.InvalidError{Msg: "token id -1 out of range [0, 151669)"}), 400, "invalid_request_error", "invalid_value", "", "invalid_request_error", "", ""},
	}
	for _, rc := range errorRoutes {
		for _, rs := range reasons {
			name := rc.path + "/" + strings.ReplaceAll(rs.err.Error(), " ", "_")
			if strings.Contains(rc.body, `"stream":true`) {
				name += "/stream"
			}
			t.Run(name, func(t *testing.T) {
				is := is.New(t)
				fr := &fakeRouter{script: refuse(rs.err)}
				if rc.tokens {
					fr.tokenErr = rs.err
				}
				s := newTestServer(fr, Options{})
				rec := httptest.NewRecorder()
				s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, rc.path, strings.NewReader(rc.body)))
				is.Equal(rec.Code, rs.status)
				is.Equal(rec.Header().Get("Content-Type"), "application/json")
				is.Equal(rec.Header().Get("Retry-After"), rs.retryAfter)
				is.Equal(rec.Header().Get(rejectReasonHeader), rs.reasonHeader)
				is.True(rec.Header().Get("X-Request-Id") != "")
				checkErrorBody(t, rec.Body.Bytes(), rc.shape, rs.openAIType, rs.code, rs.param, rs.anthropicType)
			})
		}
	}
}

// checkErrorBody asserts the API's error shape (api-conventions §6.1/6.2).
func checkErrorBody(t *testing.T, body []byte, sh shape, openAIType, code, param, anthropicType string) {
	t.Helper()
	is := is.NewRelaxed(t)
	var m map[string]json.RawMessage
	is.NoErr(json.Unmarshal(body, &m))
	if sh == shapeAnthropic {
		var b struct {
			Type  string `json:"type"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
			RequestID string `json:"request_id"`
		}
		is.NoErr(json.Unmarshal(body, &b))
		is.Equal(b.Type, "error")
		is.Equal(b.Error.Type, anthropicType)
		is.True(b.Error.Message != "")
		is.True(b.RequestID != "")
		return
	}
	var e map[string]json.RawMessage
	is.NoErr(json.Unmarshal(m["error"], &e)) // error is an object
	for _, k := range []string{"message", "type", "param", "code"} {
		_, ok := e[k]
		is.True(ok) // all four keys are present
	}
	var b openAIErrorBody
	is.NoErr(json.Unmarshal(body, &b))
	is.True(b.Error.Message != "")
	is.Equal(b.Error.Type, openAIType)
	is.Equal(deref(b.Error.Code), code)
	is.Equal(deref(b.Error.Param), param)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func TestOverloadStatus(t *testing.T) {
	queueFull := &router.Rejection{Reason: router.ReasonQueueFull, Message: "full"}
	tests := []struct {
		name     string
		option   int
		err      error
		path     string
		body     string
		status   int
		wantType string
	}{
		{"default openai", 0, queueFull, "/v1/chat/completions", chatBody + `}`, 503, "unavailable_error"},
		{"429 openai", 429, queueFull, "/v1/chat/completions", chatBody + `}`, 429, "rate_limit_error"},
		{"429 anthropic", 429, queueFull, "/v1/messages", messagesBody + `}`, 429, "rate_limit_error"},
		{"529 anthropic", 529, queueFull, "/v1/messages", messagesBody + `}`, 529, "overloaded_error"},
		{"529 keeps openai at 503", 529, queueFull, "/v1/responses", responsesBody + `}`, 503, "unavailable_error"},
		{"429 leaves draining at 503", 429, &router.Rejection{Reason: router.ReasonShuttingDown, Message: "draining"}, "/v1/chat/completions", chatBody + `}`, 503, "unavailable_error"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			s := newTestServer(&fakeRouter{script: refuse(tc.err)}, Options{OverloadStatus: tc.option})
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, tc.path, strings.NewReader(tc.body)))
			is.Equal(rec.Code, tc.status)
			var b struct {
				Error struct {
					Type string `json:"type"`
				} `json:"error"`
			}
			is.NoErr(json.Unmarshal(rec.Body.Bytes(), &b))
			is.Equal(b.Error.Type, tc.wantType)
			if tc.status != 503 || tc.err == queueFull {
				is.Equal(rec.Header().Get("Retry-After"), "1")
			}
		})
	}
}
