package router_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/core/router"
)

// TestLoadEveryRequestEndsOnce runs 1,000 requests, 64 at a time, against
// two small models: every request ends with exactly one outcome (served,
// 503 or 400), none is lost, and the metric counters balance.
func TestLoadEveryRequestEndsOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("load test")
	}
	is := is.New(t)
	a, b := newScripted("a", 2, 100), newScripted("b", 1, 60)
	a.auto, b.auto = true, true
	cfg := balanced()
	cfg.QueueLimit = 24
	cfg.QueueTimeout = 2 * time.Millisecond
	cfg.Retry = time.Millisecond
	f := newFixture(t, cfg, a, b)

	const total, workers = 1000, 64
	var served, busy, never, other atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 1))
			for {
				i := next.Add(1)
				if i > total {
					return
				}
				// Mostly fitting requests; some fit only a; some fit nothing.
				prompt := []int{5, 10, 20, 45, 80, 95}[rng.IntN(6)]
				s, err := f.r.Start(context.Background(), chat(fmt.Sprint(i), prompt, 10))
				if err != nil {
					switch rj := rejectionOf(err); {
					case rj != nil && rj.Reason == router.ReasonQueueFull, rj != nil && rj.Reason == router.ReasonQueueTimeout:
						busy.Add(1)
						// Clients back off before their next request.
						time.Sleep(time.Duration(500+rng.IntN(1500)) * time.Microsecond)
					case rj != nil && rj.Reason == router.ReasonNeverFits:
						never.Add(1)
					default:
						other.Add(1)
					}
					continue
				}
				if rng.IntN(4) == 0 {
					time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond) // a slow reader
				}
				_, err = drain(context.Background(), s)
				s.Close()
				if errors.Is(err, io.EOF) {
					served.Add(1)
				} else {
					other.Add(1)
				}
			}
		}(uint64(w))
	}
	wg.Wait()
	is.NoErr(f.r.Wait(context.Background())) // every reservation returned

	is.Equal(other.Load(), int64(0))                               // no unexpected outcome
	is.Equal(served.Load()+busy.Load()+never.Load(), int64(total)) // none lost
	is.True(served.Load() > 0)
	is.True(never.Load() > 0) // the 105-token requests fit no model

	val := func(name string, labels map[string]string) int64 {
		return int64(metricValue(t, f.met, name, labels))
	}
	rejected503 := val("dflash_admission_rejections_total", map[string]string{"reason": string(router.ReasonQueueFull)}) +
		val("dflash_admission_rejections_total", map[string]string{"reason": string(router.ReasonQueueTimeout)})
	is.Equal(rejected503, busy.Load())                                                                                            // every 503 counted once
	is.Equal(val("dflash_admission_rejections_total", map[string]string{"reason": string(router.ReasonNeverFits)}), never.Load()) // every 400 counted once
	is.Equal(val("dflash_generation_tokens_total", nil), 3*served.Load())                                                         // every success counted once
	is.Equal(val("dflash_queue_wait_seconds", nil), served.Load())                                                                // one queue-wait sample per admission
	is.Equal(val("dflash_requests_running", nil), int64(0))
	is.Equal(val("dflash_requests_waiting", nil), int64(0))
	is.Equal(f.waiting(), 0)
	is.Equal(f.inFlight("a")+f.inFlight("b"), 0)
	t.Logf("served %d, 503 %d (full %d), 400 %d; fallbacks %d", served.Load(), busy.Load(), val("dflash_admission_rejections_total", map[string]string{"reason": string(router.ReasonQueueFull)}), never.Load(), val("dflash_fallback_total", nil))
}
