package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/matryer/is"
)

// Soak shape: a bounded count of requests from a bounded set of clients.
const (
	soakRequests = 240
	soakClients  = 12
)

// soakOutcome is what one client saw of one request: exactly one of
// completed, refused and left (it disconnected on purpose).
type soakOutcome struct {
	completed, refused, left bool
	problem                  string // anything else
}

// soakBody is request i: the three APIs in turn, streaming every other
// round, on either model.
func soakBody(i int) (path string, body map[string]any, stream bool) {
	path = []string{pathChat, pathMessages, pathResponses}[i%3]
	stream = (i/3)%2 == 0
	model := []string{"qwen3", "qwen35"}[(i/6)%2]
	maxTok := 6
	if stream {
		maxTok = 24
	}
	body = apiBody(path, model, fmt.Sprintf("request %d: say something", i), maxTok, stream)
	body["stream"] = stream // also false: the non-streaming bodies say so
	body["ignore_eos"] = true
	return path, body, stream
}

// soakOne sends request i; leaveAfter > 0 makes a streaming client
// disconnect after that many SSE events.
func soakOne(s *server, i, leaveAfter int) soakOutcome {
	path, body, stream := soakBody(i)
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url+path, strings.NewReader(string(b)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		return soakOutcome{problem: fmt.Sprintf("request %d: %v", i, err)}
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == 503:
		if msg := errorMessageOf(resp.Body); msg == "" {
			return soakOutcome{problem: fmt.Sprintf("request %d: 503 without a message", i)}
		}
		return soakOutcome{refused: true}
	case resp.StatusCode != 200:
		all, _ := io.ReadAll(resp.Body)
		return soakOutcome{problem: fmt.Sprintf("request %d: status %d: %.200s", i, resp.StatusCode, all)}
	case !stream:
		var r struct {
			Choices []struct {
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			StopReason string `json:"stop_reason"`
			Status     string `json:"status"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			return soakOutcome{problem: fmt.Sprintf("request %d: decode: %v", i, err)}
		}
		if (len(r.Choices) == 1 && r.Choices[0].FinishReason != "") || r.StopReason != "" || r.Status == "completed" || r.Status == "incomplete" {
			return soakOutcome{completed: true}
		}
		return soakOutcome{problem: fmt.Sprintf("request %d: an unfinished body", i)}
	}
	// A stream: read events until the end or until the client leaves.
	var evs []sseEvent
	buf := make([]byte, 4096)
	var raw []byte
	for {
		n, err := resp.Body.Read(buf)
		raw = append(raw, buf[:n]...)
		evs = parseSSE(raw)
		if leaveAfter > 0 && len(evs) >= leaveAfter {
			cancel()
			return soakOutcome{left: true}
		}
		if err != nil {
			break
		}
	}
	if _, err := streamEnd(path, evs); err != nil {
		return soakOutcome{problem: fmt.Sprintf("request %d: %v", i, err)}
	}
	return soakOutcome{completed: true}
}

func errorMessageOf(r io.Reader) string {
	b, _ := io.ReadAll(r)
	return errorMessage(b)
}

// goroutines is the server's go_goroutines.
func (s *server) goroutines(t *testing.T) float64 {
	t.Helper()
	v, ok := s.metrics(t).get("go_goroutines")
	if !ok {
		t.Fatal("/metrics has no go_goroutines")
	}
	return v
}

// TestSoak runs a bounded load against two tiny real models (4 slots, 7
// queue places): 12 clients send 240 requests over the three APIs, streaming and not, and one stream
// in five disconnects part way. Every request must have exactly one
// outcome for its client and be counted exactly once by the server; after
// it every slot, reservation and KV block is back and the server's
// goroutines are back to where they were.
func TestSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak skipped in -short mode")
	}
	is := is.New(t)
	qwen3, qwen35 := tinyModels(t)
	args := []string{"--routing-policy", "by-name", "--routing-queue-limit", "7",
		"--model", qwen3, "--model-name", "qwen3", "--max-ctx", "512", "--max-concurrency", "2",
		"--model", qwen35, "--model-name", "qwen35", "--max-ctx", "512", "--max-concurrency", "2"}
	s := startServer(t, serverOpts{plugins: []string{"backend-qwen-dflash", "policy-by-name"}, args: args})

	// Warm up every path once, then take the baseline with no client
	// connection open.
	for i := 0; i < 12; i++ {
		if o := soakOne(s, i, 0); o.problem != "" {
			t.Fatal(o.problem)
		}
	}
	s.waitIdle(t)
	httpClient.CloseIdleConnections()
	base := s.goroutines(t)
	warm := s.metrics(t).value("dflash_requests_total")

	rng := rand.New(rand.NewPCG(240, 12))
	leave := make([]int, soakRequests)
	for i := range leave {
		if _, _, stream := soakBody(i); stream && rng.IntN(5) == 0 {
			leave[i] = 1 + rng.IntN(8)
		}
	}
	outcomes := make([]soakOutcome, soakRequests)
	jobs := make(chan int)
	var wg sync.WaitGroup
	begin := time.Now()
	for c := 0; c < soakClients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				outcomes[i] = soakOne(s, i, leave[i])
				if outcomes[i].refused {
					// A polite client backs off before its next request
					// (Retry-After is a whole second, too long here).
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
	}
	for i := 0; i < soakRequests; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	wall := time.Since(begin)

	var completed, refused, left int
	for _, o := range outcomes {
		n := 0
		for _, b := range []bool{o.completed, o.refused, o.left} {
			if b {
				n++
			}
		}
		if o.problem != "" {
			t.Error(o.problem)
			continue
		}
		is.Equal(n, 1) // exactly one outcome per request
		switch {
		case o.completed:
			completed++
		case o.refused:
			refused++
		case o.left:
			left++
		}
	}
	is.Equal(completed+refused+left, soakRequests) // none lost

	s.waitIdle(t)
	s.waitKVReturned(t)
	m := s.metrics(t)
	is.Equal(m.value("dflash_requests_total")-warm, float64(soakRequests)) // the server counted each request once
	is.Equal(m.value("dflash_requests_running"), 0.0)
	is.Equal(m.value("dflash_requests_waiting"), 0.0)
	for _, st := range s.status(t).Models {
		is.Equal(st.InFlight, 0)
		is.Equal(st.Restarts, 0)
	}
	httpClient.CloseIdleConnections()
	var now float64
	waitFor(t, "the server's goroutines back to the baseline", func() bool {
		now = s.goroutines(t)
		httpClient.CloseIdleConnections()
		return now <= base+4 // the scrape's own connection
	})
	t.Logf("soak: %d requests from %d clients in %s: %d completed, %d refused (503), %d disconnected; goroutines %v before, %v after",
		soakRequests, soakClients, wall.Round(time.Millisecond), completed, refused, left, base, now)
}
