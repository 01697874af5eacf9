package api

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/core/router"
	"github.com/dflash/dflash_server/sdk"
)

// inprocBackend is an in-process sdk.Backend for the tests against the real
// router: its answer to Start is chosen per test.
type inprocBackend struct {
	name string
	mu   sync.Mutex
	// outcome is the admission answer; admitted requests emit events.
	outcome sdk.Outcome
	reason  string
	events  []sdk.Event
	// hang keeps an admitted request generating until ctx is done; the
	// cancellation is reported on cancelled.
	hang      bool
	started   chan struct{}
	cancelled chan struct{}
}

func (b *inprocBackend) Info(context.Context) (sdk.BackendInfo, error) {
	return sdk.BackendInfo{Name: "inproc"}, nil
}
func (b *inprocBackend) ValidateOptions(context.Context, sdk.ModelConfig) error { return nil }
func (b *inprocBackend) Load(context.Context, sdk.ModelConfig, func(sdk.LoadProgress)) (sdk.ModelDescription, error) {
	return sdk.ModelDescription{}, nil
}
func (b *inprocBackend) Tokenize(_ context.Context, text string, _ bool) ([]int32, error) {
	ids := make([]int32, len(text))
	for i := range text {
		ids[i] = int32(text[i])
	}
	return ids, nil
}
func (b *inprocBackend) Detokenize(_ context.Context, ids []int32) (string, error) {
	out := make([]byte, len(ids))
	for i, id := range ids {
		out[i] = byte(id)
	}
	return string(out), nil
}
func (b *inprocBackend) CountTokens(_ context.Context, req *sdk.ChatRequest) (int, error) {
	n := 0
	for _, m := range req.Messages {
		n += len(m.Content)
	}
	return n, nil
}
func (b *inprocBackend) Stats(context.Context) (sdk.ModelStats, error) { return sdk.ModelStats{}, nil }
func (b *inprocBackend) Shutdown(context.Context) error                { return nil }

func (b *inprocBackend) Start(ctx context.Context, req *sdk.ChatRequest, emit sdk.Emitter) error {
	b.mu.Lock()
	outcome, reason, events, hang := b.outcome, b.reason, b.events, b.hang
	b.mu.Unlock()
	n, _ := b.CountTokens(ctx, req)
	a := sdk.Admission{Outcome: outcome, PromptTokens: n, Reason: reason}
	if outcome == sdk.OutcomeNeverFits {
		a.NeededTokens, a.LimitTokens = 9000, 4096
	}
	if err := emit.Admit(a); err != nil || outcome != sdk.OutcomeAdmitted {
		return err
	}
	if b.started != nil {
		close(b.started)
	}
	for _, ev := range events {
		if err := emit.Emit(ev); err != nil {
			return err
		}
	}
	if hang {
		<-ctx.Done()
		if b.cancelled != nil {
			close(b.cancelled)
		}
		return ctx.Err()
	}
	return nil
}

func newRealRouter(cfg router.Config, backends ...*inprocBackend) *router.Router {
	models := make([]*router.Model, len(backends))
	for i, b := range backends {
		models[i] = &router.Model{Name: b.name, Backend: b, Desc: sdk.ModelDescription{MaxConcurrency: 1, KVPoolTokens: 4096, MaxCtx: 4096},
			Info: router.ModelInfo{Arch: "qwen3", Device: "cpu:0", BackendName: "inproc"}}
	}
	return router.New(cfg, models)
}

var helloEvents = []sdk.Event{{Text: "Hello"}, {Text: " there"}, finish(sdk.FinishStop, 2, 2)}

// TestWithRealRouter drives core/api over core/router with in-process
// backends: admission outcomes map to the right answers in every API.
func TestWithRealRouter(t *testing.T) {
	tests := []struct {
		name     string
		lb       bool
		primary  sdk.Outcome
		second   sdk.Outcome
		path     string
		body     string
		status   int
		model    string
		reject   string
		inBody   string
		retryHdr string
	}{
		{"primary serves chat", false, sdk.OutcomeAdmitted, sdk.OutcomeAdmitted, "/v1/chat/completions", chatBody + `}`, 200, "qwen", "", `"model":"qwen"`, ""},
		{"fallback serves messages", true, sdk.OutcomeBusy, sdk.OutcomeAdmitted, "/v1/messages", messagesBody + `}`, 200, "ds4", "", `"model":"ds4"`, ""},
		{"fallback serves a responses stream", true, sdk.OutcomeBusy, sdk.OutcomeAdmitted, "/v1/responses", responsesBody + `,"stream":true}`, 200, "ds4", "", `"delta":" there"`, ""},
		{"all busy, no queue: 503", true, sdk.OutcomeBusy, sdk.OutcomeBusy, "/v1/chat/completions", chatBody + `,"stream":true}`, 503, "", "queue-full", `"code":"queue_full"`, "1"},
		{"all busy, anthropic 503", true, sdk.OutcomeBusy, sdk.OutcomeBusy, "/v1/messages", messagesBody + `}`, 503, "", "queue-full", `"overloaded_error"`, "1"},
		{"never fits anywhere: 400", true, sdk.OutcomeNeverFits, sdk.OutcomeNeverFits, "/v1/responses", responsesBody + `}`, 400, "", "never-fits", `"code":"context_length_exceeded"`, ""},
		{"invalid: 400 without fallback", true, sdk.OutcomeInvalid, sdk.OutcomeAdmitted, "/v1/messages", messagesBody + `}`, 400, "", "invalid-request", `"invalid_request_error"`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			qwen := &inprocBackend{name: "qwen", outcome: tc.primary, reason: "bad template", events: helloEvents}
			ds4 := &inprocBackend{name: "ds4", outcome: tc.second, events: helloEvents}
			rt := newRealRouter(router.Config{LoadBalancing: tc.lb}, qwen, ds4)
			s := New(FromRouter(rt), Options{})
			rec := do(s, "POST", tc.path, tc.body, nil)
			is.Equal(rec.Code, tc.status)
			is.Equal(rec.Header().Get("X-Dflash-Model"), tc.model)
			is.Equal(rec.Header().Get(rejectReasonHeader), tc.reject)
			is.Equal(rec.Header().Get("Retry-After"), tc.retryHdr)
			is.True(strings.Contains(rec.Body.String(), tc.inBody)) // body
			if tc.model == "ds4" {
				is.True(strings.Contains(rec.Header().Get("X-Dflash-Route"), "fallback")) // route names the fallback
			}
		})
	}
}

func TestWithRealRouterTokensAndInfo(t *testing.T) {
	is := is.New(t)
	rt := newRealRouter(router.Config{LoadBalancing: true}, &inprocBackend{name: "qwen"}, &inprocBackend{name: "ds4"})
	s := New(FromRouter(rt), Options{})

	rec := do(s, "POST", "/tokenize", `{"model":"ds4","content":"hi"}`, nil)
	is.Equal(rec.Code, 200)
	is.Equal(strings.TrimSpace(rec.Body.String()), `{"tokens":[104,105]}`)
	is.Equal(rec.Header().Get("X-Dflash-Model"), "ds4")
	rec = do(s, "POST", "/tokenize", `{"content":"hi"}`, nil)
	is.Equal(rec.Code, 400) // several models: model is required
	checkErrorBody(t, rec.Body.Bytes(), shapeOpenAI, "invalid_request_error", "model_required", "model", "")
	rec = do(s, "POST", "/detokenize", `{"model":"nope","tokens":[104]}`, nil)
	is.Equal(rec.Code, 404)
	checkErrorBody(t, rec.Body.Bytes(), shapeOpenAI, "invalid_request_error", "model_not_found", "model", "")
	rec = do(s, "POST", "/v1/messages/count_tokens", `{"model":"qwen","system":"ab","messages":[{"role":"user","content":"cde"}]}`, nil)
	is.Equal(rec.Code, 200)
	is.Equal(strings.TrimSpace(rec.Body.String()), `{"input_tokens":5}`)
	rec = do(s, "POST", "/v1/messages/count_tokens", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, nil)
	is.Equal(rec.Code, 404)
	checkErrorBody(t, rec.Body.Bytes(), shapeAnthropic, "", "", "", "not_found_error")

	rec = do(s, "GET", "/v1/models", "", nil)
	var list struct {
		Data []struct {
			ID     string          `json:"id"`
			Dflash json.RawMessage `json:"dflash"`
		} `json:"data"`
	}
	is.NoErr(json.Unmarshal(rec.Body.Bytes(), &list))
	is.Equal(len(list.Data), 2)
	is.Equal(list.Data[0].ID, "qwen")
	is.Equal(list.Data[1].ID, "ds4")
	rec = do(s, "GET", "/status/json", "", nil)
	is.Equal(rec.Code, 200)
	var st router.Status
	is.NoErr(json.Unmarshal(rec.Body.Bytes(), &st))
	is.Equal(len(st.Models), 2)

	rt.Quiesce()
	rec = do(s, "POST", "/v1/chat/completions", chatBody+`}`, nil)
	is.Equal(rec.Code, 503)
	is.Equal(rec.Header().Get(rejectReasonHeader), "shutting-down")
}

// TestWithRealRouterDisconnect: a client leaving mid-stream cancels the
// backend's generation and frees the slot for the next request.
func TestWithRealRouterDisconnect(t *testing.T) {
	is := is.New(t)
	qwen := &inprocBackend{name: "qwen", outcome: sdk.OutcomeAdmitted, events: []sdk.Event{{Text: "first"}}, hang: true,
		started: make(chan struct{}), cancelled: make(chan struct{})}
	rt := newRealRouter(router.Config{}, qwen)
	srv := httptest.NewServer(New(FromRouter(rt), Options{}))
	defer srv.Close()
	res, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody+`,"stream":true}`))
	is.NoErr(err)
	r := bufio.NewReader(res.Body)
	for {
		line, err := r.ReadString('\n')
		is.NoErr(err)
		if strings.Contains(line, "first") {
			break
		}
	}
	res.Body.Close()
	select {
	case <-qwen.cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("backend generation was not cancelled after the client left")
	}
	// The slot comes back: the next request is admitted, not refused.
	qwen.mu.Lock()
	qwen.hang, qwen.events, qwen.started = false, helloEvents, nil
	qwen.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	is.NoErr(rt.Wait(ctx)) // every reservation released
	rec := do(New(FromRouter(rt), Options{}), "POST", "/v1/chat/completions", chatBody+`}`, nil)
	is.Equal(rec.Code, 200)
}
