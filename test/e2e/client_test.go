package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// httpClient keeps enough idle connections for the load test.
var httpClient = &http.Client{Transport: &http.Transport{
	MaxIdleConns:        256,
	MaxIdleConnsPerHost: 256,
	IdleConnTimeout:     30 * time.Second,
}}

// Routes of the three generation APIs.
const (
	pathChat      = "/v1/chat/completions"
	pathMessages  = "/v1/messages"
	pathResponses = "/v1/responses"
	// pathCompletions is OpenAI's legacy text completions.
	pathCompletions = "/v1/completions"
)

// call is one HTTP request in flight. head is closed when the response
// headers (or an error) arrived, done when the body was read to its end.
type call struct {
	cancel context.CancelFunc
	head   chan struct{}
	done   chan struct{}

	// Set before head is closed.
	status int
	header http.Header
	err    error

	mu   sync.Mutex
	body bytes.Buffer
}

// start sends a POST with a JSON body and reads the response in the
// background.
func (s *server) start(t *testing.T, path string, body any) *call {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &call{cancel: cancel, head: make(chan struct{}), done: make(chan struct{})}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+path, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if path == pathMessages {
		req.Header.Set("anthropic-version", "2023-06-01")
	}
	go func() {
		defer close(c.done)
		resp, err := httpClient.Do(req)
		if err != nil {
			c.err = err
			close(c.head)
			return
		}
		c.status, c.header = resp.StatusCode, resp.Header
		close(c.head)
		defer resp.Body.Close()
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			c.mu.Lock()
			c.body.Write(buf[:n])
			c.mu.Unlock()
			if err != nil {
				if err != io.EOF {
					c.mu.Lock()
					c.err = err
					c.mu.Unlock()
				}
				return
			}
		}
	}()
	t.Cleanup(cancel)
	return c
}

// waitHead waits for the response headers.
func (c *call) waitHead(t *testing.T) {
	t.Helper()
	select {
	case <-c.head:
	case <-time.After(pollBound):
		t.Fatal("no response headers within the poll bound")
	}
	if c.err != nil {
		t.Fatalf("request failed: %v", c.err)
	}
}

// wait waits for the whole response.
func (c *call) wait(t *testing.T) {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(pollBound):
		t.Fatal("response did not end within the poll bound")
	}
}

// admitted reports whether the response headers arrived (a request that
// still waits in the routing queue has none).
func (c *call) admitted() bool {
	select {
	case <-c.head:
		return true
	default:
		return false
	}
}

func (c *call) bodyBytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.body.Bytes()...)
}

func (c *call) model() string { return c.header.Get("X-Dflash-Model") }

// sseEvent is one server-sent event.
type sseEvent struct {
	name string
	data string
}

// events parses the body read so far as SSE.
func (c *call) events() []sseEvent { return parseSSE(c.bodyBytes()) }

func parseSSE(b []byte) []sseEvent {
	var out []sseEvent
	var cur sseEvent
	var data []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if data != nil {
				cur.data = strings.Join(data, "\n")
				out = append(out, cur)
			}
			cur, data = sseEvent{}, nil
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event:"):
			cur.name = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
	return out
}

// post sends a request and waits for the whole answer.
func (s *server) post(t *testing.T, path string, body any) *call {
	t.Helper()
	c := s.start(t, path, body)
	c.wait(t)
	if c.err != nil {
		t.Fatalf("POST %s: %v", path, c.err)
	}
	return c
}

// getJSON GETs path and decodes the JSON answer into v.
func (s *server) getJSON(t *testing.T, path string, v any) int {
	t.Helper()
	resp, err := httpClient.Get(s.url + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatalf("GET %s: decode %q: %v", path, b, err)
		}
	}
	return resp.StatusCode
}

// chatReq is a Chat Completions body; model "" leaves the field out.
func chatReq(model, content string, maxTokens int, stream bool) map[string]any {
	b := map[string]any{
		"messages":   []any{map[string]any{"role": "user", "content": content}},
		"max_tokens": maxTokens,
	}
	if model != "" {
		b["model"] = model
	}
	if stream {
		b["stream"] = true
	}
	return b
}

// Status mirrors /status/json (and /props).
type status struct {
	Policy              string        `json:"policy"`
	LoadBalancing       bool          `json:"load_balancing"`
	Priority            []string      `json:"priority"`
	QueueLimit          int           `json:"queue_limit"`
	QueueTimeoutSeconds float64       `json:"queue_timeout_seconds"`
	Waiting             int           `json:"waiting"`
	ShuttingDown        bool          `json:"shutting_down"`
	Models              []modelStatus `json:"models"`
}

type modelStatus struct {
	Name     string `json:"name"`
	Priority int    `json:"priority"`
	Primary  bool   `json:"primary"`
	Arch     string `json:"arch"`
	File     string `json:"file"`
	Device   string `json:"device"`
	// DraftDevice is the speculative draft's device ("" without a draft).
	DraftDevice string `json:"draft_device"`
	Backend     string `json:"backend"`
	State       string `json:"state"`
	Restarts    int    `json:"restarts"`
	Capacity    struct {
		Slots        int `json:"slots"`
		KVPoolTokens int `json:"kv_pool_tokens"`
		MaxCtx       int `json:"max_ctx"`
	} `json:"capacity"`
	InFlight        int `json:"in_flight"`
	Waiting         int `json:"waiting"`
	ActiveSequences int `json:"active_sequences"`
	KVTokensUsed    int `json:"kv_tokens_used"`
	// AcceptanceLength is tokens per verify forward of a speculating model.
	AcceptanceLength float64 `json:"acceptance_length"`
}

func (st status) model(name string) modelStatus {
	for _, m := range st.Models {
		if m.Name == name {
			return m
		}
	}
	return modelStatus{Name: name, State: "absent"}
}

func (st status) String() string {
	b, _ := json.Marshal(st)
	return string(b)
}

func (s *server) status(t *testing.T) status {
	t.Helper()
	var st status
	if code := s.getJSON(t, "/status/json", &st); code != http.StatusOK {
		t.Fatalf("/status/json: %d", code)
	}
	return st
}

// waitStatus polls /status/json until cond holds.
func (s *server) waitStatus(t *testing.T, what string, cond func(status) bool) status {
	t.Helper()
	deadline := time.Now().Add(pollBound)
	for {
		st := s.status(t)
		if cond(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: last /status/json %v", what, st)
		}
		time.Sleep(pollEvery)
	}
}

// waitIdle waits until nothing is in flight or waiting, so that the next
// subtest starts from an empty server.
func (s *server) waitIdle(t *testing.T) {
	t.Helper()
	s.waitStatus(t, "an idle server", func(st status) bool {
		if st.Waiting != 0 {
			return false
		}
		for _, m := range st.Models {
			if m.InFlight != 0 || m.Waiting != 0 {
				return false
			}
		}
		return true
	})
}

// waitWaiting waits until n requests wait in the routing queue.
func (s *server) waitWaiting(t *testing.T, n int) status {
	t.Helper()
	return s.waitStatus(t, fmt.Sprintf("%d waiting", n), func(st status) bool { return st.Waiting == n })
}

// metrics is one /metrics scrape.
type metrics map[string]*dto.MetricFamily

func (s *server) metrics(t *testing.T) metrics {
	t.Helper()
	resp, err := httpClient.Get(s.url + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// series reports whether the family has a series with these labels.
func (m metrics) series(name string, labels ...string) bool {
	_, ok := m.get(name, labels...)
	return ok
}

// value sums the series of a family whose labels include the given
// name/value pairs: a gauge's or counter's value, a histogram's count.
func (m metrics) value(name string, labels ...string) float64 {
	v, _ := m.get(name, labels...)
	return v
}

func (m metrics) get(name string, labels ...string) (float64, bool) {
	fam := m[name]
	if fam == nil {
		return 0, false
	}
	var sum float64
	found := false
next:
	for _, s := range fam.Metric {
		for i := 0; i+1 < len(labels); i += 2 {
			ok := false
			for _, lp := range s.Label {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					ok = true
				}
			}
			if !ok {
				continue next
			}
		}
		found = true
		switch {
		case s.Counter != nil:
			sum += s.Counter.GetValue()
		case s.Gauge != nil:
			sum += s.Gauge.GetValue()
		case s.Histogram != nil:
			sum += float64(s.Histogram.GetSampleCount())
		case s.Untyped != nil:
			sum += s.Untyped.GetValue()
		}
	}
	return sum, found
}

// chatResult is the part of a Chat Completions body the tests read.
type chatResult struct {
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decode %q: %v", b, err)
	}
	return v
}

// terminalEvents names the one event that ends a stream of each API.
var terminalEvents = map[string][]string{
	pathChat:        {"[DONE]"},
	pathCompletions: {"[DONE]"},
	pathMessages:    {"message_stop"},
	pathResponses:   {"response.completed", "response.incomplete"},
}

// streamEnding is how a finished stream ended.
type streamEnding struct {
	// finish is the API's reason: finish_reason (OpenAI), stop_reason
	// (Anthropic) or the response's status (Responses).
	finish string
	// tokens is the output tokens the stream reports (chat and completions
	// report them only with stream_options.include_usage: 0 otherwise).
	tokens int
	// text is the generated text of a chat or completions stream.
	text string
}

// streamEnd checks that a finished stream of path carries no error event
// and exactly one terminal event, its last, and reads how it ended. Every
// test of streams that must end normally (drain, soak) goes through it, so
// they agree on what "ended normally" means for each API.
func streamEnd(path string, evs []sseEvent) (streamEnding, error) {
	var end streamEnding
	terminals := 0
	for i, e := range evs {
		if e.name == "error" || strings.Contains(e.data, `"error":{`) || strings.Contains(e.data, `"type":"error"`) {
			return end, fmt.Errorf("an error event: %.200s", e.data)
		}
		for _, term := range terminalEvents[path] {
			if e.name == term || e.data == term {
				terminals++
				if i != len(evs)-1 {
					return end, fmt.Errorf("terminal event %q is event %d of %d", term, i+1, len(evs))
				}
			}
		}
		if e.data == "[DONE]" {
			continue
		}
		var ev struct {
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			// Anthropic's message_delta carries an object, Responses'
			// text deltas a string.
			Delta json.RawMessage `json:"delta"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
				OutputTokens     int `json:"output_tokens"`
			} `json:"usage"`
			Response struct {
				Status string `json:"status"`
				Usage  struct {
					OutputTokens int `json:"output_tokens"`
				} `json:"usage"`
			} `json:"response"`
		}
		if err := json.Unmarshal([]byte(e.data), &ev); err != nil {
			return end, fmt.Errorf("event %d is not JSON: %w: %.200s", i+1, err, e.data)
		}
		for _, c := range ev.Choices {
			end.text += c.Text + c.Delta.Content
			if c.FinishReason != nil {
				end.finish = *c.FinishReason
			}
		}
		switch {
		case e.name == "message_delta":
			var d struct {
				StopReason string `json:"stop_reason"`
			}
			if err := json.Unmarshal(ev.Delta, &d); err != nil {
				return end, fmt.Errorf("message_delta: %w: %.200s", err, e.data)
			}
			end.finish = d.StopReason
		case e.name == "response.completed" || e.name == "response.incomplete":
			end.finish, end.tokens = ev.Response.Status, ev.Response.Usage.OutputTokens
		}
		if ev.Usage != nil {
			end.tokens = max(ev.Usage.CompletionTokens, ev.Usage.OutputTokens)
		}
	}
	if terminals != 1 {
		return end, fmt.Errorf("%d terminal events in %d", terminals, len(evs))
	}
	return end, nil
}

// apiBody is a request of path's API (chat, completions, messages or
// responses) with one user turn; model "" leaves the field out. Streams ask
// for usage, so streamEnd can count their tokens on every API.
func apiBody(path, model, content string, maxTokens int, stream bool) map[string]any {
	var b map[string]any
	user := []any{map[string]any{"role": "user", "content": content}}
	switch path {
	case pathMessages:
		b = map[string]any{"messages": user, "max_tokens": maxTokens}
	case pathResponses:
		b = map[string]any{"input": content, "max_output_tokens": maxTokens}
	case pathCompletions:
		b = map[string]any{"prompt": content, "max_tokens": maxTokens}
	default:
		b = map[string]any{"messages": user, "max_tokens": maxTokens}
	}
	if model != "" {
		b["model"] = model
	}
	if stream {
		b["stream"] = true
		if path == pathChat || path == pathCompletions {
			b["stream_options"] = map[string]any{"include_usage": true}
		}
	}
	return b
}
