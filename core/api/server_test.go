package api

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
)

func do(s http.Handler, method, path, body string, hdr map[string]string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	return rec
}

func TestAPIKeys(t *testing.T) {
	metrics := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "dflash_up 1\n") })
	tests := []struct {
		name    string
		protect bool
		method  string
		path    string
		body    string
		hdr     map[string]string
		status  int
	}{
		{"chat without key", false, "POST", "/v1/chat/completions", chatBody + `}`, nil, 401},
		{"chat wrong key", false, "POST", "/v1/chat/completions", chatBody + `}`, map[string]string{"Authorization": "Bearer nope"}, 401},
		{"chat bearer", false, "POST", "/v1/chat/completions", chatBody + `}`, map[string]string{"Authorization": "Bearer k2"}, 200},
		{"chat x-api-key", false, "POST", "/v1/chat/completions", chatBody + `}`, map[string]string{"x-api-key": "k1"}, 200},
		{"messages without key", false, "POST", "/v1/messages", messagesBody + `}`, map[string]string{"anthropic-version": "2023-06-01"}, 401},
		{"messages x-api-key", false, "POST", "/v1/messages", messagesBody + `}`, map[string]string{"x-api-key": "k1", "anthropic-version": "2023-06-01"}, 200},
		{"models without key", false, "GET", "/v1/models", "", nil, 401},
		{"health open", true, "GET", "/health", "", nil, 200},
		{"ready open", true, "GET", "/ready", "", nil, 200},
		{"metrics open by default", false, "GET", "/metrics", "", nil, 200},
		{"metrics protected", true, "GET", "/metrics", "", nil, 401},
		{"status protected", true, "GET", "/status/json", "", nil, 401},
		{"status protected with key", true, "GET", "/status/json", "", map[string]string{"Authorization": "bearer k1"}, 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			s := newTestServer(&fakeRouter{script: stream(evLength...)}, Options{APIKeys: []string{"k1", "k2"}, ProtectInfo: tc.protect, Metrics: metrics})
			rec := do(s, tc.method, tc.path, tc.body, tc.hdr)
			is.Equal(rec.Code, tc.status)
			if tc.status == 401 {
				checkErrorBody(t, rec.Body.Bytes(), shapeOf(tc.path), "authentication_error", "invalid_api_key", "", "authentication_error")
			}
		})
	}
}

func TestCORS(t *testing.T) {
	s := newTestServer(&fakeRouter{script: stream(evLength...)}, Options{CORSOrigins: []string{"https://app.example"}, APIKeys: []string{"k"}})
	t.Run("preflight allowed", func(t *testing.T) {
		is := is.New(t)
		rec := do(s, "OPTIONS", "/v1/chat/completions", "", map[string]string{"Origin": "https://app.example",
			"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"})
		is.Equal(rec.Code, 204) // preflight needs no API key
		is.Equal(rec.Header().Get("Access-Control-Allow-Origin"), "https://app.example")
		is.Equal(rec.Header().Get("Access-Control-Allow-Headers"), "authorization, content-type, x-stainless-os")
		is.True(strings.Contains(rec.Header().Get("Access-Control-Allow-Methods"), "POST"))
	})
	t.Run("preflight refused", func(t *testing.T) {
		is := is.New(t)
		rec := do(s, "OPTIONS", "/v1/chat/completions", "", map[string]string{"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
		is.Equal(rec.Code, 403)
		is.Equal(rec.Header().Get("Access-Control-Allow-Origin"), "")
	})
	t.Run("simple request exposes headers", func(t *testing.T) {
		is := is.New(t)
		rec := do(s, "POST", "/v1/chat/completions", chatBody+`}`, map[string]string{"Origin": "https://app.example", "Authorization": "Bearer k"})
		is.Equal(rec.Code, 200)
		is.Equal(rec.Header().Get("Access-Control-Allow-Origin"), "https://app.example")
		is.True(strings.Contains(rec.Header().Get("Access-Control-Expose-Headers"), "Retry-After"))
	})
	t.Run("wildcard", func(t *testing.T) {
		is := is.New(t)
		s := newTestServer(&fakeRouter{script: stream(evLength...)}, Options{CORSOrigins: []string{"*"}})
		rec := do(s, "GET", "/v1/models", "", map[string]string{"Origin": "http://localhost:3000"})
		is.Equal(rec.Header().Get("Access-Control-Allow-Origin"), "http://localhost:3000")
	})
	t.Run("no origin no headers", func(t *testing.T) {
		is := is.New(t)
		rec := do(s, "GET", "/health", "", nil)
		is.Equal(rec.Header().Get("Access-Control-Allow-Origin"), "")
	})
}

func TestPanicAnswers500InRouteShape(t *testing.T) {
	for _, tc := range []struct{ path, body string }{{"/v1/chat/completions", chatBody + `}`}, {"/v1/messages", messagesBody + `}`}} {
		t.Run(tc.path, func(t *testing.T) {
			is := is.New(t)
			fr := &fakeRouter{script: func(*sdk.ChatRequest) (*fakeStream, error) { panic("boom") }}
			s := newTestServer(fr, Options{Logger: discardLogger()})
			rec := do(s, "POST", tc.path, tc.body, nil)
			is.Equal(rec.Code, 500)
			checkErrorBody(t, rec.Body.Bytes(), shapeOf(tc.path), "server_error", "internal_error", "", "api_error")
		})
	}
}

func TestHealthReadyStatusMetrics(t *testing.T) {
	ready, state := false, "loading"
	s := newTestServer(&fakeRouter{}, Options{Ready: func() (bool, string) { return ready, state }})
	is := is.New(t)
	is.Equal(do(s, "GET", "/health", "", nil).Code, 200)
	is.Equal(do(s, "GET", "/livez", "", nil).Code, 200)
	rec := do(s, "GET", "/ready", "", nil)
	is.Equal(rec.Code, 503)
	is.Equal(strings.TrimSpace(rec.Body.String()), `{"status":"loading"}`)
	ready = true
	is.Equal(do(s, "GET", "/readyz", "", nil).Code, 200)
	ready, state = false, "draining"
	rec = do(s, "GET", "/ready", "", nil)
	is.Equal(rec.Code, 503)
	is.Equal(strings.TrimSpace(rec.Body.String()), `{"status":"draining"}`)
	is.Equal(do(s, "GET", "/health", "", nil).Code, 200) // liveness ignores readiness
	props, status := do(s, "GET", "/props", "", nil), do(s, "GET", "/status/json", "", nil)
	is.Equal(props.Code, 200)
	is.Equal(props.Body.String(), status.Body.String())
	var pr struct {
		Policy string `json:"policy"`
		API    struct {
			Endpoints          []string `json:"endpoints"`
			ResponseFormats    []string `json:"response_formats"`
			JSONSchemaKeywords []string `json:"json_schema_keywords"`
		} `json:"api"`
	}
	is.NoErr(json.Unmarshal(props.Body.Bytes(), &pr))
	is.Equal(pr.Policy, "primary-first")                            // the router's status is still there
	is.True(slices.Contains(pr.API.Endpoints, "/v1/completions"))   // advertised
	is.True(slices.Contains(pr.API.ResponseFormats, "json_schema")) // advertised
	is.True(slices.Contains(pr.API.JSONSchemaKeywords, "anyOf"))    // supported keywords listed
	is.True(!slices.Contains(pr.API.JSONSchemaKeywords, "pattern")) // and only those
	is.Equal(do(s, "GET", "/metrics", "", nil).Code, 404)           // no metrics handler given
	is.Equal(do(s, "GET", "/v1/chat/completions", "", nil).Code, 405)
	rec = do(s, "GET", "/v1/models", "", nil)
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	is.NoErr(json.Unmarshal(rec.Body.Bytes(), &list))
	is.Equal(list.Object, "list")
	is.Equal(len(list.Data), 2)
	is.Equal(list.Data[0].ID, "fake-model")
	is.Equal(list.Data[1].Object, "model")
}

// TestClientGoneWhileQueued: a client that leaves while the router makes
// it wait gets nothing written and no stream is opened.
func TestClientGoneWhileQueued(t *testing.T) {
	is := is.New(t)
	started := make(chan struct{})
	fr := &fakeRouter{}
	fr.script = func(*sdk.ChatRequest) (*fakeStream, error) { panic("unused") }
	blocking := &blockingRouter{fakeRouter: fr, started: started}
	s := New(blocking, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(chatBody+`,"stream":true}`)).WithContext(ctx)
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() { defer close(done); s.ServeHTTP(rec, req) }()
	<-started
	cancel()
	<-done
	is.Equal(rec.Body.Len(), 0)
	is.Equal(rec.Header().Get("Content-Type"), "")
}

// blockingRouter's Start waits, like a queued request, until ctx is done.
type blockingRouter struct {
	*fakeRouter
	started chan struct{}
}

func (b *blockingRouter) Start(ctx context.Context, _ *sdk.ChatRequest) (Stream, error) {
	close(b.started)
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestDisconnectMidStreamCloses: when the client goes away mid-stream, the
// handler stops and closes the stream (cancelling generation).
func TestDisconnectMidStreamCloses(t *testing.T) {
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", chatBody + `,"stream":true}`},
		{"/v1/messages", messagesBody + `,"stream":true}`},
		{"/v1/responses", responsesBody + `,"stream":true}`},
	} {
		t.Run(tc.path, func(t *testing.T) {
			is := is.New(t)
			st := &fakeStream{events: []sdk.Event{{Text: "first"}}, hang: true, closedCh: make(chan struct{})}
			fr := &fakeRouter{script: func(*sdk.ChatRequest) (*fakeStream, error) { return st, nil }}
			srv := httptest.NewServer(newTestServer(fr, Options{}))
			defer srv.Close()
			res, err := http.Post(srv.URL+tc.path, "application/json", strings.NewReader(tc.body))
			is.NoErr(err)
			is.Equal(res.StatusCode, 200)
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
			case <-st.closedCh:
			case <-time.After(10 * time.Second):
				t.Fatal("stream was not closed after the client disconnected")
			}
		})
	}
}

// TestHeartbeat: a quiet stream gets keep-alives in each API's form.
func TestHeartbeat(t *testing.T) {
	for _, tc := range []struct{ path, body, beat string }{
		{"/v1/chat/completions", chatBody + `,"stream":true}`, ": keep-alive"},
		{"/v1/messages", messagesBody + `,"stream":true}`, "event: ping"},
		{"/v1/responses", responsesBody + `,"stream":true}`, ": keep-alive"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			is := is.New(t)
			gate := make(chan struct{})
			st := &fakeStream{events: []sdk.Event{{Text: "late"}, finish(sdk.FinishStop, 1, 1)}, gate: gate}
			fr := &fakeRouter{script: func(*sdk.ChatRequest) (*fakeStream, error) { return st, nil }}
			srv := httptest.NewServer(newTestServer(fr, Options{Heartbeat: time.Millisecond}))
			defer srv.Close()
			res, err := http.Post(srv.URL+tc.path, "application/json", strings.NewReader(tc.body))
			is.NoErr(err)
			defer res.Body.Close()
			r := bufio.NewReader(res.Body)
			beats := 0
			if tc.beat == "event: ping" {
				beats = -1 // the stream opens with one ping
			}
			for beats < 2 {
				line, err := r.ReadString('\n')
				is.NoErr(err)
				if strings.HasPrefix(line, tc.beat) {
					beats++
				}
			}
			close(gate)
			rest, err := io.ReadAll(r)
			is.NoErr(err)
			is.True(strings.Contains(string(rest), "late")) // events flow after the heartbeats
		})
	}
}

func TestUTF8SplitHeldBack(t *testing.T) {
	tests := []struct {
		name   string
		pieces []string
		want   []string
	}{
		{"whole", []string{"héllo"}, []string{"héllo"}},
		{"2-byte split", []string{"h\xC3", "\xA9llo"}, []string{"h", "éllo"}},
		{"4-byte split thrice", []string{"\xF0", "\x9F", "\x99", "\x82!"}, []string{"🙂!"}},
		{"dangling at end", []string{"ok\xE2\x82"}, []string{"ok", "\xE2\x82"}},
		{"invalid byte passes", []string{"a\xFFb"}, []string{"a\xFFb"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			rec := &recordingSink{}
			tr := newTracker(rec, func(p string) string { return p + "x" })
			for _, p := range tc.pieces {
				tr.feed(&sdk.Event{Text: p})
			}
			tr.feed(&sdk.Event{Finish: &sdk.Finish{Reason: sdk.FinishStop}})
			is.Equal(rec.pieces, tc.want)
		})
	}
}

type recordingSink struct{ pieces []string }

func (r *recordingSink) open(*block) {}
func (r *recordingSink) piece(_ *block, s string, _ []sdk.TokenLogprob) {
	r.pieces = append(r.pieces, s)
}
func (r *recordingSink) close(*block)                                   {}
func (r *recordingSink) finish(*sdk.Finish, sdk.FinishReason, []*block) {}
func (r *recordingSink) fail(error)                                     {}

func TestModelsShapes(t *testing.T) {
	s := newTestServer(&fakeRouter{}, Options{})
	anth := map[string]string{"anthropic-version": "2023-06-01"}
	t.Run("retrieve", func(t *testing.T) {
		is := is.New(t)
		rec := do(s, "GET", "/v1/models/fake-fallback", "", nil)
		is.Equal(rec.Code, 200)
		var m modelEntry
		is.NoErr(json.Unmarshal(rec.Body.Bytes(), &m))
		is.Equal(m.ID, "fake-fallback")
		is.Equal(string(m.Dflash), `{"name":"fake-fallback","state":"loading","slots":1}`)
	})
	t.Run("retrieve unknown", func(t *testing.T) {
		is := is.New(t)
		rec := do(s, "GET", "/v1/models/nope", "", nil)
		is.Equal(rec.Code, 404)
		checkErrorBody(t, rec.Body.Bytes(), shapeOpenAI, "invalid_request_error", "model_not_found", "model", "")
		rec = do(s, "GET", "/v1/models/nope", "", anth)
		is.Equal(rec.Code, 404)
		checkErrorBody(t, rec.Body.Bytes(), shapeAnthropic, "", "", "", "not_found_error")
	})
	t.Run("anthropic list", func(t *testing.T) {
		is := is.New(t)
		rec := do(s, "GET", "/v1/models", "", anth)
		is.Equal(rec.Code, 200)
		is.Equal(strings.TrimSpace(rec.Body.String()), `{"data":[{"type":"model","id":"fake-model","display_name":"fake-model","created_at":"2026-01-01T00:00:00Z"},`+
			`{"type":"model","id":"fake-fallback","display_name":"fake-fallback","created_at":"2026-01-01T00:00:00Z"}],"has_more":false,"first_id":"fake-model","last_id":"fake-fallback"}`)
	})
}

// TestPanicAfterHeaders: a panic once the stream started ends it with the
// API's in-stream error event, with and without the heartbeat reader.
func TestPanicAfterHeaders(t *testing.T) {
	for _, hb := range []time.Duration{0, -1} {
		for _, tc := range []struct{ path, body, want string }{
			{"/v1/chat/completions", chatBody + `,"stream":true}`, `data: {"error":{"message":"generation failed: stream receive panicked`},
			{"/v1/messages", messagesBody + `,"stream":true}`, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\""},
			{"/v1/responses", responsesBody + `,"stream":true}`, "event: response.failed"},
			{"/v1/chat/completions", chatBody + `}`, `"code":"backend_error"`},
		} {
			t.Run(fmt.Sprintf("%s/heartbeat=%v", tc.path, hb), func(t *testing.T) {
				is := is.New(t)
				st := &fakeStream{events: []sdk.Event{{Text: "a"}, {Text: "b"}}, panicAt: 2}
				fr := &fakeRouter{script: func(*sdk.ChatRequest) (*fakeStream, error) { return st, nil }}
				s := newTestServer(fr, Options{Heartbeat: hb, Logger: discardLogger()})
				rec := do(s, "POST", tc.path, tc.body, nil)
				body := rec.Body.String()
				if hb < 0 {
					// The direct reader's panic is caught by run's recover.
					tc.want = strings.Replace(tc.want, "generation failed: stream receive panicked", "internal error while generating", 1)
				}
				is.True(strings.Contains(body, tc.want)) // in-stream error event
				is.True(st.closed.Load())                // stream closed
			})
		}
	}
}
