package e2e

import (
	"io"
	"testing"

	"github.com/matryer/is"
	dto "github.com/prometheus/client_model/go"

	"github.com/dflash/dflash_server/deploy"
)

// TestPickerMetrics is the contract with the Gateway API Inference
// Extension's endpoint picker: the gauges deploy/k8s/epp.yaml names exist
// on /metrics as gauges, rise while requests run, queue and hold KV, and
// return to zero once the load is gone, so the picker stops seeing a
// drained replica as busy. Ordering comes from the server's own state
// (/status/json, SSE headers after admission), never from fixed sleeps.
func TestPickerMetrics(t *testing.T) {
	names, err := deploy.PickerMetrics()
	if err != nil {
		t.Fatalf("picker configuration: %v", err)
	}
	waiting := names["total-queued-requests-metric"]
	running := names["total-running-requests-metric"]
	kv := names["kv-cache-usage-percentage-metric"]

	dir := t.TempDir()
	// One model, two slots: two holders fill it and the next requests wait.
	s := startServer(t, serverOpts{args: []string{
		"--routing-queue-limit", "8",
		"--model", scriptedModel(t, dir, "a"), "--model-name", "a", "--target-device", "cpu:0",
		"--max-concurrency", itoa(aSlots), "--kv-pool-tokens", itoa(aKV), "--max-ctx", itoa(aKV),
		"--scripted-token-delay", tokenDelay,
	}})

	gauges := func() (w, r, k float64) {
		m := s.metrics(t)
		return m.value(waiting), m.value(running), m.value(kv)
	}

	t.Run("exported as gauges", func(t *testing.T) {
		m := s.metrics(t)
		for _, n := range []string{waiting, running, kv} {
			t.Run(n, func(t *testing.T) {
				is := is.New(t)
				fam := m[n]
				is.True(fam != nil) // the picker's metric name is exported
				is.Equal(fam.GetType(), dto.MetricType_GAUGE)
			})
		}
	})

	t.Run("idle reads zero", func(t *testing.T) {
		is := is.New(t)
		w, r, k := gauges()
		is.Equal(w, 0.0)
		is.Equal(r, 0.0)
		is.Equal(k, 0.0)
	})

	t.Run("latency histograms per model and API", func(t *testing.T) {
		is := is.New(t)
		chat := s.post(t, pathChat, chatReq("a", "hi", 4, false))
		is.Equal(chat.status, 200)
		msg := s.post(t, pathMessages, map[string]any{"model": "a", "max_tokens": 4,
			"messages": []map[string]any{{"role": "user", "content": "hi"}}})
		is.Equal(msg.status, 200)
		m := s.metrics(t)
		for _, api := range []string{"chat", "messages"} {
			is.True(m.value("dflash_time_to_first_token_seconds", "model", "a", "api", api) >= 1) // TTFT by API
			is.True(m.value("dflash_inter_token_latency_seconds", "model", "a", "api", api) >= 1) // gaps between tokens
		}
		is.Equal(m.value("dflash_time_to_first_token_seconds", "api", "responses"), 0.0) // no request came that way
	})

	t.Run("load moves them and they return to zero", func(t *testing.T) {
		is := is.New(t)
		var holders []*call
		for range aSlots {
			holders = append(holders, s.hold(t, "a", "a"))
		}
		defer release(holders...)
		waitFor(t, "running = slots and KV in use", func() bool {
			_, r, k := gauges()
			return r == aSlots && k > 0
		})
		_, _, k := gauges()
		is.True(k <= 1) // a 0-1 fraction, as the picker's KV flag expects
		is.True(k >= float64(aSlots*holdNeed)/aKV)

		const queued = 3
		var waiters []*call
		for range queued {
			waiters = append(waiters, s.start(t, pathChat, quick("a")))
		}
		s.waitWaiting(t, queued)
		waitFor(t, "waiting gauge = queued requests", func() bool {
			w, _, _ := gauges()
			return w == queued
		})

		release(holders...)
		for _, c := range waiters {
			c.wait(t)
			is.Equal(c.status, 200) // queued requests are served once the slots free
		}
		s.waitIdle(t)
		// The scrape size drives the picker's cost at scale (docs/SCALE-OUT.md).
		if resp, err := httpClient.Get(s.url + "/metrics"); err == nil {
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			t.Logf("/metrics after load, one model: %d bytes", n)
		}
		waitFor(t, "all picker gauges back at zero", func() bool {
			w, r, k := gauges()
			return w == 0 && r == 0 && k == 0
		})
	})
}
