// Command loadgen measures what a client of a running dflash_server sees: N concurrent streaming chat completions
// of M tokens each (ignore_eos), and reports the aggregate and per-stream decode rates (and their sum, the
// steady rate while every stream decodes, without the ramp of admissions and first tokens). It is the "through the
// server" column of docs/PERFORMANCE.md: the Go core, the plugin boundary and the engine together.
//
//	go run ./test/loadgen -url http://127.0.0.1:8080 -streams 1,32 -tokens 128
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

func main() {
	url := flag.String("url", "http://127.0.0.1:8080", "server base URL")
	streams := flag.String("streams", "1,32", "concurrent streams to measure, comma-separated")
	tokens := flag.Int("tokens", 128, "tokens generated per request")
	prompt := flag.String("prompt", "Write a long story about a lighthouse keeper.", "user message")
	completion := flag.Bool("completion", false, "send -prompt as raw text to /v1/completions instead of a chat message")
	sampling := flag.String("sampling", "", `request fields merged over the greedy default, as a JSON object (e.g. '{"temperature": 1, "top_k": 0}')`)
	flag.Parse()
	var extra map[string]any
	if *sampling != "" {
		if err := json.Unmarshal([]byte(*sampling), &extra); err != nil {
			fmt.Fprintf(os.Stderr, "loadgen: -sampling: %v\n", err)
			os.Exit(2)
		}
	}
	for _, f := range strings.Split(*streams, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "loadgen: bad -streams entry %q\n", f)
			os.Exit(2)
		}
		r, err := measure(context.Background(), *url, n, *tokens, *prompt, *completion, extra)
		if err != nil {
			fmt.Fprintln(os.Stderr, "loadgen:", err)
			os.Exit(1)
		}
		fmt.Printf("streams=%d tokens/stream=%d wall=%.2fs aggregate=%.1f tok/s decode sum=%.1f tok/s "+
			"per-stream decode median=%.1f tok/s ttft median=%.0f ms",
			n, *tokens, r.wall.Seconds(), r.aggregate, r.decodeSum, r.streamRate, r.ttft)
		if r.draftSteps > 0 {
			fmt.Printf(" acceptance length %.2f", float64(r.accepted+r.draftSteps)/float64(r.draftSteps))
		}
		fmt.Println()
	}
}

type result struct {
	wall       time.Duration
	aggregate  float64 // generated tokens of all streams / wall time
	streamRate float64 // median over streams of tokens after the first / time after the first
	decodeSum  float64 // the streams' decode rates added: the aggregate while all of them decode
	ttft       float64 // median time to first token, ms
	// speculative decoding: accepted proposals and verify steps over all streams
	accepted, draftSteps int
}

func measure(ctx context.Context, url string, n, tokens int, prompt string, completion bool, extra map[string]any) (result, error) {
	req := map[string]any{
		"model": "auto", "stream": true, "max_tokens": tokens, "ignore_eos": true, "temperature": 0,
		"stream_options": map[string]bool{"include_usage": true},
	}
	maps.Copy(req, extra)
	path := "/v1/chat/completions"
	if completion {
		req["prompt"], path = prompt, "/v1/completions"
	} else {
		req["messages"] = []map[string]string{{"role": "user", "content": prompt}}
	}
	body, _ := json.Marshal(req)
	type one struct {
		tokens      int
		first, last time.Time
		spec        spec
		err         error
	}
	res := make([]one, n)
	start := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			res[i].tokens, res[i].first, res[i].last, res[i].spec, res[i].err = stream(ctx, url+path, body)
		}(i)
	}
	wg.Wait()
	wall := time.Since(start)
	total := 0
	var rates, ttfts []float64
	var errs []error
	accepted, steps := 0, 0
	for _, r := range res {
		if r.err != nil {
			errs = append(errs, r.err)
			continue
		}
		total += r.tokens
		accepted += r.spec.Accepted
		steps += r.spec.Steps
		if d := r.last.Sub(r.first).Seconds(); r.tokens > 1 && d > 0 {
			rates = append(rates, float64(r.tokens-1)/d)
		}
		ttfts = append(ttfts, float64(r.first.Sub(start).Milliseconds()))
	}
	if len(errs) > 0 {
		return result{}, fmt.Errorf("%d of %d streams failed: %w", len(errs), n, errors.Join(errs...))
	}
	sum := 0.0
	for _, r := range rates {
		sum += r
	}
	return result{wall: wall, aggregate: float64(total) / wall.Seconds(), streamRate: median(rates), decodeSum: sum,
		ttft: median(ttfts), accepted: accepted, draftSteps: steps}, nil
}

// stream runs one streaming request and returns the completion tokens the server reported with the times of the
// first and last content chunks.
// spec is the speculative counts the server reports with a finished stream (dflash timings).
type spec struct {
	Accepted int `json:"draft_accepted"`
	Steps    int `json:"draft_steps"`
}

func stream(ctx context.Context, url string, body []byte) (int, time.Time, time.Time, spec, error) {
	var sp spec
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, time.Time{}, time.Time{}, sp, err
	}
	req.Header.Set("content-type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, time.Time{}, time.Time{}, sp, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return 0, time.Time{}, time.Time{}, sp, fmt.Errorf("status %d: %s", resp.StatusCode, b.String())
	}
	var first, last time.Time
	tokens := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") || line == "data: [DONE]" {
			continue
		}
		var ev struct {
			Choices []struct {
				Delta struct {
					Content          string `json:"content"`
					ReasoningContent string `json:"reasoning_content"`
				} `json:"delta"`
				Text string `json:"text"` // completions
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Dflash *spec `json:"dflash"`
		}
		if err := json.Unmarshal([]byte(line[6:]), &ev); err != nil {
			return 0, first, last, sp, fmt.Errorf("bad event %q: %w", line, err)
		}
		if ev.Usage != nil {
			tokens = ev.Usage.CompletionTokens
		}
		if ev.Dflash != nil {
			sp = *ev.Dflash
		}
		for _, c := range ev.Choices {
			if c.Delta.Content != "" || c.Delta.ReasoningContent != "" || c.Text != "" {
				now := time.Now()
				if first.IsZero() {
					first = now
				}
				last = now
			}
		}
	}
	if err := sc.Err(); err != nil {
		return 0, first, last, sp, err
	}
	if first.IsZero() {
		return 0, first, last, sp, errors.New("no content streamed")
	}
	return tokens, first, last, sp, nil
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	sort.Float64s(v)
	return v[len(v)/2]
}
