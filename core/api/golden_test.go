package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/core/router"
	"github.com/dflash/dflash_server/sdk"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// newTestServer builds a Server with stable ids and clock, so outputs can be
// compared byte for byte.
func newTestServer(fr *fakeRouter, opts Options) *Server {
	s := New(fr, opts)
	var n atomic.Int64
	s.newID = func(prefix string) string { return fmt.Sprintf("%s%03d", prefix, n.Add(1)) }
	s.now = func() time.Time { return time.Unix(1767225600, 0) }
	s.created = 1767225600
	return s
}

// Scripts shared by the golden cases.
var (
	// reasoning, then text whose 🙂 (F0 9F 99 82) is split across events.
	evReasoningText = []sdk.Event{
		{Reasoning: "The user greets; "},
		{Reasoning: "answer briefly."},
		{Text: "Hi \xF0\x9F"},
		{Text: "\x99\x82 <there> & \"you\"!"},
		{Finish: &sdk.Finish{Reason: sdk.FinishStop, Usage: sdk.Usage{PromptTokens: 21, CompletionTokens: 11, ReasoningTokens: 6, CachedTokens: 8},
			Timings: sdk.Timings{PrefillMS: 12.5, DecodeMS: 80, DraftAccepted: 7, DraftProposed: 10}}},
	}
	// text, then two tool calls streamed in pieces.
	evTools = []sdk.Event{
		{Text: "Let me check."},
		{ToolCalls: []sdk.ToolCallDelta{{Index: 0, ID: "call_a", Name: "get_weather"}}},
		{ToolCalls: []sdk.ToolCallDelta{{Index: 0, ArgumentsDelta: `{"city":`}}},
		{ToolCalls: []sdk.ToolCallDelta{{Index: 0, ArgumentsDelta: `"Oslo"}`}, {Index: 1, ID: "call_b", Name: "get_time", ArgumentsDelta: `{"tz":"Europe/Oslo"}`}}},
		{Finish: &sdk.Finish{Reason: sdk.FinishToolCalls, Usage: sdk.Usage{PromptTokens: 61, CompletionTokens: 23}}},
	}
	// 日 (E6 97 A5) split across two byte-level BPE tokens: token text is
	// not valid UTF-8 on its own (U+FFFD in "token"), "bytes" stay exact.
	evPartialCharacter = []sdk.Event{
		{Text: "\xE6\x97", TokenIDs: []int32{100}, Logprobs: []sdk.TokenLogprob{{Token: "\xE6\x97", Bytes: []byte("\xE6\x97"), Logprob: -0.25,
			Top: []sdk.TopLogprob{{Token: "\xE6\x97", Bytes: []byte("\xE6\x97"), Logprob: -0.25}, {Token: "\xF0", Bytes: []byte("\xF0"), Logprob: -2}}}}},
		{Text: "\xA5", TokenIDs: []int32{101}, Logprobs: []sdk.TokenLogprob{{Token: "\xA5", Bytes: []byte("\xA5"), Logprob: -0.5}}},
		finish(sdk.FinishStop, 9, 2),
	}
	evStopSequence = []sdk.Event{
		{Text: "1, 2, 3"},
		{Finish: &sdk.Finish{Reason: sdk.FinishStopSequence, StopSequence: ", 4", Usage: sdk.Usage{PromptTokens: 9, CompletionTokens: 5}}},
	}
	evLength = []sdk.Event{
		{Reasoning: "Long thought"},
		{Text: "The answer is"},
		finish(sdk.FinishLength, 9, 16),
	}
	evLogprobs = []sdk.Event{
		{Text: "Hi", TokenIDs: []int32{17}, Logprobs: []sdk.TokenLogprob{{Token: "Hi", Logprob: -0.125, Top: []sdk.TopLogprob{{Token: "Hi", Logprob: -0.125}, {Token: "Hello", Logprob: -2.5}}}}},
		{Text: "!", TokenIDs: []int32{0}, Logprobs: []sdk.TokenLogprob{{Token: "!", Logprob: -0.5, Bytes: []byte("!")}}},
		finish(sdk.FinishStop, 4, 2),
	}
)

func failing(err error, events ...sdk.Event) func(*sdk.ChatRequest) (*fakeStream, error) {
	return func(*sdk.ChatRequest) (*fakeStream, error) {
		return &fakeStream{route: "fallback:qwen=busy", admission: sdk.Admission{Outcome: sdk.OutcomeAdmitted, PromptTokens: 5},
			events: events, failWith: err}, nil
	}
}

const (
	chatBody      = `{"model":"any","messages":[{"role":"user","content":"hi"}]`
	messagesBody  = `{"model":"any","max_tokens":64,"messages":[{"role":"user","content":"hi"}]`
	responsesBody = `{"model":"any","input":"hi","instructions":"Be brief.","max_output_tokens":64`
)

type goldenCase struct {
	name   string
	method string
	path   string
	body   string
	script func(*sdk.ChatRequest) (*fakeStream, error)
	opts   Options
}

func goldenCases() []goldenCase {
	backendDied := errors.New("backend qwen3-8b restarted during generation")
	return []goldenCase{
		{name: "chat_reasoning", path: "/v1/chat/completions", body: chatBody + `}`, script: stream(evReasoningText...)},
		{name: "chat_stream_reasoning_usage", path: "/v1/chat/completions", body: chatBody + `,"stream":true,"stream_options":{"include_usage":true}}`, script: stream(evReasoningText...)},
		{name: "chat_tools", path: "/v1/chat/completions", body: chatBody + `}`, script: stream(evTools...)},
		{name: "chat_stream_tools", path: "/v1/chat/completions", body: chatBody + `,"stream":true}`, script: stream(evTools...)},
		{name: "chat_stream_stop_sequence", path: "/v1/chat/completions", body: chatBody + `,"stream":true,"stop":", 4"}`, script: stream(evStopSequence...)},
		{name: "chat_stream_length", path: "/v1/chat/completions", body: chatBody + `,"stream":true,"max_tokens":16}`, script: stream(evLength...)},
		{name: "chat_logprobs", path: "/v1/chat/completions", body: chatBody + `,"logprobs":true,"top_logprobs":2}`, script: stream(evLogprobs...)},
		{name: "chat_stream_logprobs", path: "/v1/chat/completions", body: chatBody + `,"stream":true,"logprobs":true}`, script: stream(evLogprobs...)},
		{name: "chat_stream_logprobs_partial_character", path: "/v1/chat/completions", body: chatBody + `,"stream":true,"logprobs":true,"top_logprobs":2}`, script: stream(evPartialCharacter...)},
		{name: "chat_logprobs_partial_character", path: "/v1/chat/completions", body: chatBody + `,"logprobs":true,"top_logprobs":2}`, script: stream(evPartialCharacter...)},
		{name: "chat_stream_fail", path: "/v1/chat/completions", body: chatBody + `,"stream":true}`, script: failing(backendDied, sdk.Event{Text: "Partial"})},
		{name: "chat_fail", path: "/v1/chat/completions", body: chatBody + `}`, script: failing(backendDied, sdk.Event{Text: "Partial"})},
		{name: "chat_queue_full", path: "/v1/chat/completions", body: chatBody + `}`,
			script: refuse(&router.Rejection{Reason: router.ReasonQueueFull, Message: "all models are busy; the waiting queue is full (32)"})},

		{name: "messages_reasoning", path: "/v1/messages", body: messagesBody + `}`, script: stream(evReasoningText...)},
		{name: "messages_stream_reasoning", path: "/v1/messages", body: messagesBody + `,"stream":true}`, script: stream(evReasoningText...)},
		{name: "messages_tools", path: "/v1/messages", body: messagesBody + `}`, script: stream(evTools...)},
		{name: "messages_stream_tools", path: "/v1/messages", body: messagesBody + `,"stream":true}`, script: stream(evTools...)},
		{name: "messages_stream_stop_sequence", path: "/v1/messages", body: messagesBody + `,"stream":true,"stop_sequences":[", 4"]}`, script: stream(evStopSequence...)},
		{name: "messages_length", path: "/v1/messages", body: messagesBody + `}`, script: stream(evLength...)},
		{name: "messages_stream_fail", path: "/v1/messages", body: messagesBody + `,"stream":true}`, script: failing(backendDied, sdk.Event{Reasoning: "Hmm"})},
		{name: "messages_queue_full", path: "/v1/messages", body: messagesBody + `}`,
			script: refuse(&router.Rejection{Reason: router.ReasonQueueFull, Message: "all models are busy; the waiting queue is full (32)"})},
		{name: "messages_missing_max_tokens", path: "/v1/messages", body: `{"model":"any","messages":[{"role":"user","content":"hi"}]}`},

		{name: "responses_reasoning", path: "/v1/responses", body: responsesBody + `,"reasoning":{"effort":"low"}}`, script: stream(evReasoningText...)},
		{name: "responses_stream_reasoning", path: "/v1/responses", body: responsesBody + `,"stream":true}`, script: stream(evReasoningText...)},
		{name: "responses_tools", path: "/v1/responses", body: responsesBody + `,"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}},{"type":"function","name":"get_time"}]}`, script: stream(evTools...)},
		{name: "responses_stream_tools", path: "/v1/responses", body: responsesBody + `,"stream":true}`, script: stream(evTools...)},
		{name: "responses_stream_incomplete", path: "/v1/responses", body: responsesBody + `,"stream":true}`, script: stream(evLength...)},
		{name: "responses_stream_fail", path: "/v1/responses", body: responsesBody + `,"stream":true}`, script: failing(backendDied, sdk.Event{Text: "Partial"})},
		{name: "responses_previous_response_id", path: "/v1/responses", body: responsesBody + `,"previous_response_id":"resp_1"}`},

		{name: "count_tokens", path: "/v1/messages/count_tokens", body: `{"model":"any","system":"Be brief.","messages":[{"role":"user","content":"hi"}]}`},
		{name: "tokenize", path: "/tokenize", body: `{"model":"any","content":"héllo","add_special":true}`},
		{name: "detokenize", path: "/detokenize", body: `{"tokens":[104,195,169,108,108,111]}`},
		{name: "models", method: http.MethodGet, path: "/v1/models"},
		{name: "status", method: http.MethodGet, path: "/status/json"},
		{name: "not_found_anthropic", method: http.MethodGet, path: "/v1/messages/nope"},
	}
}

func TestGolden(t *testing.T) {
	for _, tc := range goldenCases() {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			fr := &fakeRouter{script: tc.script}
			if fr.script == nil {
				fr.script = refuse(errors.New("the router must not be called"))
			}
			s := newTestServer(fr, tc.opts)
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			req := httptest.NewRequest(method, tc.path, strings.NewReader(tc.body))
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, req)
			got := renderExchange(method, tc.path, tc.body, rec.Result(), rec.Body.Bytes())
			path := filepath.Join("testdata", tc.name+".golden")
			if *update {
				is.NoErr(os.WriteFile(path, got, 0o644))
				return
			}
			want, err := os.ReadFile(path)
			is.NoErr(err) // missing golden file: run go test -run TestGolden -update
			if !bytes.Equal(got, want) {
				t.Errorf("output differs from %s (go test -run TestGolden -update rewrites it)\n--- got:\n%s", path, got)
			}
			for _, st := range fr.streams {
				is.True(st.closed.Load()) // every admitted stream is closed
			}
		})
	}
}

// renderExchange writes a request and its response in a readable, stable
// form: sorted headers, JSON bodies indented, SSE bodies verbatim.
func renderExchange(method, path, body string, res *http.Response, resBody []byte) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s\n", method, path)
	if body != "" {
		b.WriteString(body)
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "\nHTTP %d\n", res.StatusCode)
	keys := make([]string, 0, len(res.Header))
	for k := range res.Header {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range res.Header[k] {
			fmt.Fprintf(&b, "%s: %s\n", k, v)
		}
	}
	b.WriteString("\n")
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		var ind bytes.Buffer
		if err := json.Indent(&ind, resBody, "", "  "); err == nil {
			resBody = ind.Bytes()
		}
	}
	b.Write(resBody)
	return b.Bytes()
}
