package e2e

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/matryer/is"
)

// Load test shape: requests, concurrency, and one request in neverFitsEvery
// that can never fit either model.
const (
	loadRequests    = 1000
	loadConcurrency = 64
	neverFitsEvery  = 10
	loadKV          = 512
)

// TestLoad sends 1,000 requests, 64 at a time, to two small scripted
// models through the real server. Every request must end with exactly one
// terminal outcome (200, 503 or 400), none lost, and the server's metrics
// must account for each of them. It asserts no timing; the wall time is
// logged for docs/PERFORMANCE.md (end-to-end section).
func TestLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("load test skipped in -short mode")
	}
	is := is.New(t)
	dir := t.TempDir()
	block := func(name, dev string) []string {
		return []string{"--model", scriptedModel(t, dir, name), "--model-name", name, "--target-device", dev,
			"--max-concurrency", "2", "--kv-pool-tokens", itoa(loadKV), "--max-ctx", itoa(loadKV),
			"--scripted-token-delay", "2ms"}
	}
	args := append([]string{"--load-balancing", "--routing-queue-limit", "56"}, block("a", "cpu:0")...)
	s := startServer(t, serverOpts{args: append(args, block("b", "cpu:1")...)})

	type outcome struct {
		status           int
		model            string
		prompt, generate int
		err              string
	}
	results := make([]outcome, loadRequests)
	jobs := make(chan int)
	var wg sync.WaitGroup
	begin := time.Now()
	for w := 0; w < loadConcurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				maxTokens := 4
				if i%neverFitsEvery == 0 {
					maxTokens = loadKV + 1
				}
				c := s.start(t, pathChat, chatReq("", fmt.Sprintf("request %d", i), maxTokens, false))
				<-c.done
				o := outcome{status: c.status, model: c.model()}
				if c.err != nil {
					o.err = c.err.Error()
				} else if c.status == 200 {
					var res chatResult
					if err := json.Unmarshal(c.bodyBytes(), &res); err != nil || len(res.Choices) != 1 || res.Choices[0].FinishReason == "" {
						o.err = fmt.Sprintf("incomplete 200 body %q", c.bodyBytes())
					}
					o.prompt, o.generate = res.Usage.PromptTokens, res.Usage.CompletionTokens
				}
				results[i] = o
			}
		}()
	}
	for i := 0; i < loadRequests; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	wall := time.Since(begin)

	counts := map[int]int{}
	byModel := map[string]int{}
	var prompt, generated int
	for i, o := range results {
		if o.err != "" {
			t.Fatalf("request %d: %s", i, o.err)
		}
		counts[o.status]++
		switch o.status {
		case 200:
			byModel[o.model]++
			prompt += o.prompt
			generated += o.generate
		case 400:
			is.Equal(i%neverFitsEvery, 0) // only the never-fitting requests get 400
		case 503:
		default:
			t.Fatalf("request %d: status %d", i, o.status)
		}
	}
	is.Equal(counts[200]+counts[400]+counts[503], loadRequests) // none lost
	is.Equal(counts[400], loadRequests/neverFitsEvery)
	s.waitIdle(t)

	// The server's books balance with what the clients saw.
	m := s.metrics(t)
	is.Equal(m.value("dflash_queue_wait_seconds"), float64(counts[200])) // one observation per admission
	is.Equal(m.value("dflash_queue_wait_seconds", "model", "a"), float64(byModel["a"]))
	is.Equal(m.value("dflash_queue_wait_seconds", "model", "b"), float64(byModel["b"]))
	is.Equal(m.value("dflash_admission_rejections_total", "reason", "queue_full"), float64(counts[503]))
	is.Equal(m.value("dflash_admission_rejections_total", "reason", "never_fits"), float64(counts[400]))
	is.Equal(m.value("dflash_admission_rejections_total"), float64(counts[503]+counts[400]))
	is.Equal(m.value("dflash_prompt_tokens_total"), float64(prompt))
	is.Equal(m.value("dflash_generation_tokens_total"), float64(generated))
	is.Equal(m.value("dflash_requests_running"), 0.0)
	is.Equal(m.value("dflash_requests_waiting"), 0.0)
	t.Logf("load: %d requests, %d concurrent, wall %s: 200=%d (a=%d b=%d) 503=%d 400=%d; %d prompt, %d generated tokens",
		loadRequests, loadConcurrency, wall.Round(time.Millisecond), counts[200], byModel["a"], byModel["b"],
		counts[503], counts[400], prompt, generated)
}

// TestRequestMetrics checks dflash_requests_total, the per-API request
// counter gateways read.
func TestRequestMetrics(t *testing.T) {
	is := is.New(t)
	dir := t.TempDir()
	s := startServer(t, serverOpts{args: []string{"--model", scriptedModel(t, dir, "a"), "--model-name", "a"}})
	is.Equal(s.post(t, pathChat, quick("")).status, 200)
	is.Equal(s.post(t, pathChat, chatReq("", "hi", 100000, false)).status, 400)
	m := s.metrics(t)
	is.Equal(m.value("dflash_requests_total", "model", "a", "api", "chat", "code", "200"), 1.0)
	is.Equal(m.value("dflash_requests_total", "api", "chat", "code", "400"), 1.0)
}
