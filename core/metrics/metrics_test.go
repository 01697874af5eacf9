package metrics_test

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/core/metrics"
)

func scrape(t *testing.T, r *metrics.Registry) string {
	t.Helper()
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, err := io.ReadAll(rec.Result().Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestNilRegistryRecordsNothing(t *testing.T) {
	var r *metrics.Registry
	r.AddWaiting("a", 1)
	r.AddRunning("a", 1)
	r.SetKV("a", 1, 2)
	r.Fallback("a", "b")
	r.Rejection("a", "queue_full")
	r.ObserveTTFT("a", "chat", time.Second)
	r.ObserveITL("a", "chat", time.Second, 2)
	r.SetBackendRestarts("a", 1)
	r.OnScrape(func() {})
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	is.New(t).Equal(rec.Code, 404) // no registry, no metrics
}

func TestExposition(t *testing.T) {
	tests := []struct {
		name   string
		opts   metrics.Options
		want   []string
		absent []string
	}{
		{"native names", metrics.Options{}, []string{
			`dflash_requests_waiting{model="any"} 1`,
			`dflash_requests_running{model="qwen"} 2`,
			`dflash_kv_cache_usage_ratio{model="qwen"} 0.25`,
			`dflash_fallback_total{from="qwen",to="ds4"} 1`,
			`dflash_admission_rejections_total{model="any",reason="queue_full"} 1`,
			`dflash_backend_restarts_total{model="ds4"} 3`,
			`dflash_time_to_first_token_seconds_count{api="chat",model="qwen"} 1`,
			`dflash_time_per_output_token_seconds_count{api="messages",model="qwen"} 1`,
			`dflash_inter_token_latency_seconds_count{api="responses",model="qwen"} 4`,
			`dflash_inter_token_latency_seconds_bucket{api="responses",model="qwen",le="0.01"} 4`,
			`dflash_generation_tokens_total{model="qwen"} 7`,
			`dflash_queue_limit 32`,
			`dflash_requests_total{api="chat",code="200",model="qwen"} 1`,
		}, []string{"vllm:"}},
		{"vLLM aliases", metrics.Options{VLLMCompat: true}, []string{
			`vllm:num_requests_waiting{model_name="any"} 1`,
			`vllm:num_requests_running{model_name="qwen"} 2`,
			`vllm:kv_cache_usage_perc{model_name="qwen"} 0.25`,
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			r := metrics.New(tt.opts)
			hooked := 0
			r.OnScrape(func() { hooked++ })
			r.AddWaiting(metrics.AnyModel, 2)
			r.AddWaiting(metrics.AnyModel, -1)
			r.AddRunning("qwen", 2)
			r.SetKV("qwen", 256, 1024)
			r.Fallback("qwen", "ds4")
			r.Rejection(metrics.AnyModel, "queue_full")
			r.SetBackendRestarts("ds4", 3)
			r.SetBackendRestarts("ds4", 1) // a counter never goes down
			r.ObserveTTFT("qwen", "chat", 30*time.Millisecond)
			r.ObserveTPOT("qwen", "messages", 10*time.Millisecond)
			r.ObserveITL("qwen", "responses", 40*time.Millisecond, 4) // a burst of 4 tokens: 4 gaps of 10ms
			r.AddTokens("qwen", 5, 7)
			r.SetQueueLimit(32)
			r.ObserveRequest("qwen", "chat", 200, time.Second)
			out := scrape(t, r)
			for _, w := range tt.want {
				is.True(strings.Contains(out, w)) // series present with its value
			}
			for _, a := range tt.absent {
				is.True(!strings.Contains(out, a)) // aliases only when asked
			}
			is.Equal(hooked, 1) // scrape hook ran
		})
	}
}
