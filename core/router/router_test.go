package router_test

import (
	"context"
	"errors"
	"io"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/core/admission"
	"github.com/dflash/dflash_server/core/health"
	"github.com/dflash/dflash_server/core/router"
	"github.com/dflash/dflash_server/plugins/policy-by-name/byname"
	"github.com/dflash/dflash_server/plugins/policy-primary-first/primaryfirst"
	"github.com/dflash/dflash_server/sdk"
)

var bg = context.Background()

func balanced() router.Config {
	return router.Config{LoadBalancing: true, QueueLimit: 8, Policy: primaryfirst.Policy{}, PolicyName: primaryfirst.Name}
}

func TestPrimaryServesWhenFree(t *testing.T) {
	is := is.New(t)
	a, b := newScripted("a", 2, 1000), newScripted("b", 2, 1000)
	f := newFixture(t, balanced(), a, b)
	req := chat("r1", 10, 10)
	req.Model = "b" // never pins under primary-first
	s, err := f.r.Start(bg, req)
	is.NoErr(err)
	defer s.Close()
	is.Equal(s.Model(), "a")       // primary serves
	is.Equal(s.Route(), "primary") // and says so
	is.Equal(s.Admission().PromptTokens, 10)
	is.Equal(b.startCount(), 0) // the other model is not asked
	a.next(t).all()
	evs, err := drain(bg, s)
	is.True(errors.Is(err, io.EOF)) // stream ends with EOF after finish
	is.Equal(len(evs), 2)
	is.Equal(evs[0].Text, "hello")
	is.True(evs[1].Finish != nil)
	s.Close()
	is.NoErr(f.r.Wait(bg))
	for name, want := range map[string]float64{
		"dflash_time_to_first_token_seconds":   1, // one sample each
		"dflash_time_per_output_token_seconds": 1,
		"dflash_queue_wait_seconds":            1,
		"dflash_prompt_tokens_total":           10,
		"dflash_generation_tokens_total":       3,
		"dflash_draft_tokens_accepted_total":   3,
		"dflash_requests_running":              0,
	} {
		is.Equal(metricValue(t, f.met, name, map[string]string{"model": "a"}), want) // per-model series
	}
}

// A Whole request's events may all come with its finish (the backend holds them for the one body): its time to first
// token is the admission's time plus the engine's prefill from the finish's timings, not the arrival of the text, and
// its inter-token latencies are the engine's decode time over its tokens. A streamed request's TTFT is when its first
// text arrived (and its events carry no token ids here, so it has no inter-token latency).
func TestWholeRequestTTFTFromTimings(t *testing.T) {
	is := is.New(t)
	a := newScripted("a", 2, 1000)
	a.auto, a.prefillMS = true, 4000
	f := newFixture(t, balanced(), a)
	for _, whole := range []bool{true, false} {
		req := chat("r", 10, 10)
		req.Whole = whole
		s, err := f.r.Start(bg, req)
		is.NoErr(err)
		_, err = drain(bg, s)
		is.True(errors.Is(err, io.EOF))
		s.Close()
	}
	is.NoErr(f.r.Wait(bg))
	ttft := histogramSum(t, f.met, "dflash_time_to_first_token_seconds", map[string]string{"model": "a"})
	is.Equal(metricValue(t, f.met, "dflash_time_to_first_token_seconds", map[string]string{"model": "a"}), 2.0)
	is.True(ttft >= 4 && ttft < 5) // 4 s of prefill said by the Whole one's timings, ~0 for the streamed one
	itl := map[string]string{"model": "a"}
	is.Equal(metricValue(t, f.met, "dflash_inter_token_latency_seconds", itl), 2.0)                   // 3 tokens: 2 gaps
	is.True(math.Abs(histogramSum(t, f.met, "dflash_inter_token_latency_seconds", itl)-0.002) < 1e-9) // 2 ms of decode
}

func TestSlotFallback(t *testing.T) {
	is := is.New(t)
	a, b := newScripted("a", 1, 1000), newScripted("b", 1, 1000)
	f := newFixture(t, balanced(), a, b)
	s1, err := f.r.Start(bg, chat("r1", 10, 10))
	is.NoErr(err)
	defer s1.Close()
	s2, err := f.r.Start(bg, chat("r2", 10, 10))
	is.NoErr(err)
	defer s2.Close()
	is.Equal(s2.Model(), "b")               // primary's only slot is held
	is.Equal(s2.Route(), "fallback:a=busy") // route names the skipped model
	is.Equal(a.startCount(), 1)             // the ledger refused without asking the backend
	is.Equal(metricValue(t, f.met, "dflash_fallback_total", map[string]string{"from": "a", "to": "b"}), 1.0)
}

// A backend that answers nothing (a hung plugin) is passed over once the admission timeout expires: the request goes
// to the next model, or is refused as unavailable when there is none.
func TestHungBackendIsPassedOver(t *testing.T) {
	is := is.New(t)
	a, b := newScripted("a", 2, 1000), newScripted("b", 2, 1000)
	a.hang = make(chan struct{})
	defer close(a.hang)
	cfg := balanced()
	cfg.AdmissionTimeout = 20 * time.Millisecond
	f := newFixture(t, cfg, a, b)
	s, err := f.r.Start(bg, chat("r1", 10, 10))
	is.NoErr(err)
	defer s.Close()
	is.Equal(s.Model(), "b")                      // served by the next model
	is.Equal(s.Route(), "fallback:a=unavailable") // and the route says why

	only := newScripted("only", 2, 1000)
	only.hang = make(chan struct{})
	defer close(only.hang)
	cfg = router.Config{QueueLimit: 8, AdmissionTimeout: 20 * time.Millisecond}
	g := newFixture(t, cfg, only)
	_, err = g.r.Start(bg, chat("r2", 10, 10))
	var rj *router.Rejection
	is.True(errors.As(err, &rj))                                 // refused, not hung
	is.True(strings.Contains(rj.Error(), "no admission within")) // naming the cause
}

func TestKVPressureFallsBackWithFreeSlots(t *testing.T) {
	is := is.New(t)
	a, b := newScripted("a", 4, 100), newScripted("b", 4, 100)
	f := newFixture(t, balanced(), a, b)
	s1, err := f.r.Start(bg, chat("big", 40, 40))
	is.NoErr(err)
	defer s1.Close()
	s2, err := f.r.Start(bg, chat("r2", 20, 20))
	is.NoErr(err)
	defer s2.Close()
	is.Equal(s2.Model(), "b")    // KV, not slots, pushed it off the primary
	is.Equal(a.startCount(), 2)  // the primary's backend answered busy
	is.Equal(f.inFlight("a"), 1) // with three ledger slots still free
	is.Equal(s2.Route(), "fallback:a=busy")
}

func TestNeverFits(t *testing.T) {
	t.Run("no model fits: 400 with numbers", func(t *testing.T) {
		is := is.New(t)
		a, b := newScripted("a", 1, 100), newScripted("b", 1, 200)
		f := newFixture(t, balanced(), a, b)
		_, err := f.r.Start(bg, chat("huge", 250, 50))
		rj := rejectionOf(err)
		is.True(rj != nil)
		is.Equal(rj.Reason, router.ReasonNeverFits)
		is.True(strings.Contains(rj.Message, "a: needs 300 tokens, limit 100")) // each model's limit
		is.True(strings.Contains(rj.Message, "b: needs 300 tokens, limit 200"))
		is.Equal(f.waiting(), 0) // never queued
		is.Equal(metricValue(t, f.met, "dflash_admission_rejections_total", map[string]string{"reason": "never_fits"}), 1.0)
	})
	t.Run("decided before queueing behind waiters", func(t *testing.T) {
		is := is.New(t)
		a := newScripted("a", 1, 100)
		cfg := balanced()
		cfg.QueueLimit = 1
		f := newFixture(t, cfg, a)
		hold, err := f.r.Start(bg, chat("hold", 10, 10))
		is.NoErr(err)
		defer hold.Close()
		ctx, cancel := context.WithCancel(bg)
		defer cancel()
		_ = f.startAsync(ctx, chat("w", 10, 10))
		f.waitQueued(t, 1) // the queue is now full
		starts := a.startCount()
		_, err = f.r.Start(bg, chat("huge", 95, 10))
		rj := rejectionOf(err)
		is.Equal(rj.Reason, router.ReasonNeverFits) // 400, not queue_full
		is.True(strings.Contains(rj.Message, "a: needs 105 tokens, limit 100"))
		is.Equal(a.startCount(), starts) // decided by counting, not by admission
		is.Equal(f.waiting(), 1)
	})
	t.Run("skips the model it cannot fit", func(t *testing.T) {
		is := is.New(t)
		a, b := newScripted("a", 1, 100), newScripted("b", 1, 1000)
		f := newFixture(t, balanced(), a, b)
		s, err := f.r.Start(bg, chat("r", 150, 10))
		is.NoErr(err)
		defer s.Close()
		is.Equal(s.Model(), "b")
		is.Equal(s.Route(), "fallback:a=never_fits")
	})
	t.Run("waits for the only model that fits", func(t *testing.T) {
		is := is.New(t)
		a, b := newScripted("a", 1, 100), newScripted("b", 1, 1000)
		f := newFixture(t, balanced(), a, b)
		hold, err := f.r.Start(bg, chat("hold", 500, 10))
		is.NoErr(err)
		is.Equal(hold.Model(), "b")
		run := b.next(t)
		ch := f.startAsync(bg, chat("w", 150, 10))
		f.waitQueued(t, 1)
		run.all()
		_, _ = drain(bg, hold)
		hold.Close()
		o := <-ch
		is.NoErr(o.err)
		defer o.s.Close()
		is.Equal(o.s.Model(), "b") // served by b after the release, never by a
	})
}

func TestQueueLimits(t *testing.T) {
	t.Run("full queue: 503 with Retry-After", func(t *testing.T) {
		is := is.New(t)
		a := newScripted("a", 1, 1000)
		cfg := balanced()
		cfg.QueueLimit = 1
		f := newFixture(t, cfg, a)
		s, err := f.r.Start(bg, chat("hold", 1, 1))
		is.NoErr(err)
		defer s.Close()
		ctx, cancel := context.WithCancel(bg)
		defer cancel()
		_ = f.startAsync(ctx, chat("w1", 1, 1))
		f.waitQueued(t, 1)
		_, err = f.r.Start(bg, chat("w2", 1, 1))
		rj := rejectionOf(err)
		is.True(rj != nil)
		is.Equal(rj.Reason, router.ReasonQueueFull)
		is.True(errors.Is(err, admission.ErrQueueFull)) // cause is visible
	})
	t.Run("limit 0: 503 at once", func(t *testing.T) {
		is := is.New(t)
		a, b := newScripted("a", 1, 1000), newScripted("b", 1, 1000)
		cfg := balanced()
		cfg.QueueLimit = 0
		f := newFixture(t, cfg, a, b)
		s1, err := f.r.Start(bg, chat("1", 1, 1))
		is.NoErr(err)
		defer s1.Close()
		s2, err := f.r.Start(bg, chat("2", 1, 1))
		is.NoErr(err)
		defer s2.Close()
		_, err = f.r.Start(bg, chat("3", 1, 1))
		is.Equal(rejectionOf(err).Reason, router.ReasonQueueFull) // every model busy, no queue
	})
	t.Run("deadline: 503 queue_timeout", func(t *testing.T) {
		is := is.New(t)
		a := newScripted("a", 1, 1000)
		cfg := balanced()
		cfg.QueueTimeout = 1 // 1ns: expires as soon as it is queued
		f := newFixture(t, cfg, a)
		s, err := f.r.Start(bg, chat("hold", 1, 1))
		is.NoErr(err)
		defer s.Close()
		_, err = f.r.Start(bg, chat("late", 1, 1))
		rj := rejectionOf(err)
		is.Equal(rj.Reason, router.ReasonQueueTimeout)
		is.True(errors.Is(err, admission.ErrQueueTimeout))
		is.Equal(f.waiting(), 0)
	})
}

func TestWaiters(t *testing.T) {
	t.Run("release wakes a waiter", func(t *testing.T) {
		is := is.New(t)
		a := newScripted("a", 1, 1000)
		f := newFixture(t, balanced(), a)
		s, err := f.r.Start(bg, chat("hold", 1, 1))
		is.NoErr(err)
		run := a.next(t)
		ch := f.startAsync(bg, chat("w", 1, 1))
		f.waitQueued(t, 1)
		run.all()
		_, _ = drain(bg, s)
		s.Close()
		o := <-ch // woken by the release (the retry is an hour)
		is.NoErr(o.err)
		is.True(o.s.QueueWait() > 0)
		o.s.Close()
		a.next(t).all()
	})
	t.Run("disconnected waiter leaves at once", func(t *testing.T) {
		is := is.New(t)
		a := newScripted("a", 1, 1000)
		f := newFixture(t, balanced(), a)
		s, err := f.r.Start(bg, chat("hold", 1, 1))
		is.NoErr(err)
		run := a.next(t)
		ctx, cancel := context.WithCancel(bg)
		ch := f.startAsync(ctx, chat("gone", 1, 1))
		f.waitQueued(t, 1)
		cancel()
		o := <-ch
		is.True(errors.Is(o.err, context.Canceled)) // the waiter's own cancellation
		is.Equal(f.waiting(), 0)                    // removed from the queue
		run.all()
		_, _ = drain(bg, s)
		s.Close()
		is.NoErr(f.r.Wait(bg))
		is.Equal(a.startCount(), 1) // the gone waiter never reached the backend
	})
	t.Run("FIFO and no overtaking", func(t *testing.T) {
		is := is.New(t)
		a := newScripted("a", 4, 100)
		f := newFixture(t, balanced(), a)
		hold, err := f.r.Start(bg, chat("hold", 30, 30)) // 60 of 100 KV
		is.NoErr(err)
		holdRun := a.next(t)
		var chans []chan outcome
		ids := []string{"w1", "w2", "w3"}
		for i, id := range ids {
			chans = append(chans, f.startAsync(bg, chat(id, 25, 25))) // 50 each: busy
			f.waitQueued(t, i+1)
		}
		// Small enough to fit next to hold, but waiters came first.
		small := f.startAsync(bg, chat("small", 5, 5))
		f.waitQueued(t, 4)
		is.Equal(a.admittedIDs(), []string{"hold"}) // small did not overtake
		holdRun.all()
		_, _ = drain(bg, hold)
		hold.Close()
		for i, id := range ids {
			o := <-chans[i]
			is.NoErr(o.err)
			a.runOf(t, id).all()
			_, _ = drain(bg, o.s)
			o.s.Close()
		}
		o := <-small
		is.NoErr(o.err)
		o.s.Close()
		a.runOf(t, "small").all()
		is.Equal(a.admittedIDs(), []string{"hold", "w1", "w2", "w3", "small"}) // arrival order
	})
	t.Run("retry sees engine-side capacity", func(t *testing.T) {
		is := is.New(t)
		a := newScripted("a", 2, 100)
		cfg := balanced()
		cfg.Retry = 1 // retry as fast as possible
		f := newFixture(t, cfg, a)
		a.set(func(b *scriptedBackend) { b.kvExtra = 90 }) // engine busy with something the router cannot see
		ch := f.startAsync(bg, chat("w", 10, 10))
		f.waitQueued(t, 1)
		a.set(func(b *scriptedBackend) { b.kvExtra = 0 }) // no release happens
		o := <-ch
		is.NoErr(o.err)
		o.s.Close()
		a.next(t).all()
	})
}

// TestReservationOutlivesDisconnect: after a client goes away the slot
// stays reserved until the backend's Start has returned; after the backend
// finished, until the stream is closed.
func TestReservationOutlivesDisconnect(t *testing.T) {
	for _, phase := range []string{"prefill", "decode", "draining"} {
		t.Run(phase, func(t *testing.T) {
			is := is.New(t)
			a := newScripted("a", 1, 1000)
			cfg := balanced()
			cfg.QueueLimit = 0
			f := newFixture(t, cfg, a)
			ctx, cancel := context.WithCancel(bg)
			s, err := f.r.Start(ctx, chat("r", 1, 1))
			is.NoErr(err)
			run := a.next(t)
			switch phase {
			case "prefill":
				cancel()
				_, err = s.Recv(ctx)
				is.True(errors.Is(err, context.Canceled))
				s.Close()
				<-run.cancelled // the engine sees the cancellation
			case "decode":
				run.prefill.open()
				e, err := s.Recv(ctx)
				is.NoErr(err)
				is.Equal(e.Text, "hello")
				cancel()
				s.Close()
				<-run.cancelled
			case "draining":
				run.all()
				<-run.returned // engine retired; the client has not read a byte
			}
			is.Equal(f.inFlight("a"), 1) // still reserved
			_, err = f.r.Start(bg, chat("probe", 1, 1))
			is.Equal(rejectionOf(err).Reason, router.ReasonQueueFull) // capacity not exposed
			switch phase {
			case "draining":
				evs, err := drain(bg, s) // the slow reader still gets everything
				is.True(errors.Is(err, io.EOF))
				is.Equal(len(evs), 2)
				s.Close()
			default:
				run.retire.open()
				<-run.returned
			}
			is.NoErr(f.r.Wait(bg)) // released once both ends are done
			cancel()
			s2, err := f.r.Start(bg, chat("after", 1, 1))
			is.NoErr(err) // capacity reused
			s2.Close()
			a.next(t).all()
		})
	}
}

func TestCapacityReuseAfterCancellation(t *testing.T) {
	is := is.New(t)
	a := newScripted("a", 1, 1000)
	cfg := balanced()
	cfg.QueueLimit = 0
	f := newFixture(t, cfg, a)
	for i := 0; i < 20; i++ {
		ctx, cancel := context.WithCancel(bg)
		s, err := f.r.Start(ctx, chat("r", 1, 1))
		is.NoErr(err) // the previous cancelled request gave its slot back
		run := a.next(t)
		cancel()
		s.Close()
		run.retire.open()
		<-run.returned
		is.NoErr(f.r.Wait(bg))
	}
	is.Equal(f.inFlight("a"), 0)
	is.Equal(metricValue(t, f.met, "dflash_requests_running", map[string]string{"model": "a"}), 0.0)
}

func TestPriorityAndBalancing(t *testing.T) {
	t.Run("reversed priority", func(t *testing.T) {
		is := is.New(t)
		a, b := newScripted("a", 1, 1000), newScripted("b", 1, 1000)
		f := newFixture(t, balanced(), b, a) // b is now the primary
		s, err := f.r.Start(bg, chat("r", 1, 1))
		is.NoErr(err)
		defer s.Close()
		is.Equal(s.Model(), "b")
		s2, err := f.r.Start(bg, chat("r2", 1, 1))
		is.NoErr(err)
		defer s2.Close()
		is.Equal(s2.Route(), "fallback:b=busy")
	})
	t.Run("balancing disabled: only the primary serves", func(t *testing.T) {
		is := is.New(t)
		a, b := newScripted("a", 1, 1000), newScripted("b", 1, 1000)
		cfg := balanced()
		cfg.LoadBalancing = false
		cfg.QueueLimit = 0
		f := newFixture(t, cfg, a, b)
		s, err := f.r.Start(bg, chat("r", 1, 1))
		is.NoErr(err)
		defer s.Close()
		_, err = f.r.Start(bg, chat("r2", 1, 1))
		is.Equal(rejectionOf(err).Reason, router.ReasonQueueFull) // no fallback
		is.Equal(b.startCount(), 0)
		is.Equal(f.r.Status().Policy, "primary-only")
	})
}

func TestByNamePolicy(t *testing.T) {
	setup := func(t *testing.T, opts map[string]string) (*fixture, *scriptedBackend, *scriptedBackend) {
		a, b := newScripted("a", 1, 1000), newScripted("b", 1, 1000)
		p := byname.New()
		if err := p.Configure(bg, opts); err != nil {
			t.Fatal(err)
		}
		cfg := balanced()
		cfg.Policy, cfg.PolicyName = p, byname.Name
		cfg.QueueLimit = 0
		return newFixture(t, cfg, a, b), a, b
	}
	t.Run("pins a named model and never spills", func(t *testing.T) {
		is := is.New(t)
		f, _, _ := setup(t, nil)
		req := chat("r", 1, 1)
		req.Model = "b"
		s, err := f.r.Start(bg, req)
		is.NoErr(err)
		defer s.Close()
		is.Equal(s.Model(), "b") // named, although the primary is free
		is.Equal(s.Route(), "pinned")
		req2 := chat("r2", 1, 1)
		req2.Model = "b"
		_, err = f.r.Start(bg, req2)
		is.Equal(rejectionOf(err).Reason, router.ReasonQueueFull) // waits for b, never a
	})
	t.Run("auto is balanced", func(t *testing.T) {
		is := is.New(t)
		f, _, _ := setup(t, nil)
		for _, name := range []string{"", "auto"} {
			req := chat("r", 1, 1)
			req.Model = name
			s, err := f.r.Start(bg, req)
			is.NoErr(err)
			defer s.Close()
		}
		is.Equal(f.inFlight("a")+f.inFlight("b"), 2) // spilled to b
	})
	t.Run("unknown name: 404 listing models", func(t *testing.T) {
		is := is.New(t)
		f, _, _ := setup(t, nil)
		req := chat("r", 1, 1)
		req.Model = "gpt-4"
		_, err := f.r.Start(bg, req)
		rj := rejectionOf(err)
		is.Equal(rj.Reason, router.ReasonUnknownModel)
		is.True(strings.Contains(rj.Message, "a, b")) // names the loaded models
		is.True(errors.Is(err, router.ErrUnknownModel))
	})
	t.Run("unknown name served by the primary", func(t *testing.T) {
		is := is.New(t)
		f, _, _ := setup(t, map[string]string{byname.OptUnknownModel: byname.UnknownPrimary})
		req := chat("r", 1, 1)
		req.Model = "gpt-4"
		s, err := f.r.Start(bg, req)
		is.NoErr(err)
		defer s.Close()
		is.Equal(s.Model(), "a")
	})
}

func TestPolicySwap(t *testing.T) {
	is := is.New(t)
	a, b := newScripted("a", 2, 1000), newScripted("b", 2, 1000)
	f := newFixture(t, balanced(), a, b)
	req := chat("r", 1, 1)
	req.Model = "b"
	s, err := f.r.Start(bg, req)
	is.NoErr(err)
	s.Close()
	is.Equal(s.Model(), "a") // primary-first ignores the name
	f.r.SetPolicy(byname.Name, byname.New())
	s, err = f.r.Start(bg, req)
	is.NoErr(err)
	s.Close()
	is.Equal(s.Model(), "b") // by-name honours it
	is.Equal(f.r.Status().Policy, byname.Name)
}

type failingPolicy struct {
	primaryfirst.Policy
	mode string
}

func (p failingPolicy) Order(context.Context, sdk.Snapshot) (sdk.Decision, error) {
	switch p.mode {
	case "error":
		return sdk.Decision{}, errors.New("policy process exited")
	case "panic":
		panic("policy bug")
	}
	return sdk.Decision{Order: []string{"nope"}}, nil
}

func TestPolicyFailureUsesBlockOrder(t *testing.T) {
	for _, mode := range []string{"error", "panic", "nonsense"} {
		t.Run(mode, func(t *testing.T) {
			is := is.New(t)
			a, b := newScripted("a", 1, 1000), newScripted("b", 1, 1000)
			cfg := balanced()
			cfg.Policy, cfg.PolicyName = failingPolicy{mode: mode}, "broken"
			f := newFixture(t, cfg, a, b)
			s1, err := f.r.Start(bg, chat("1", 1, 1))
			is.NoErr(err) // a broken policy never fails the request
			defer s1.Close()
			s2, err := f.r.Start(bg, chat("2", 1, 1))
			is.NoErr(err)
			defer s2.Close()
			is.Equal([]string{s1.Model(), s2.Model()}, []string{"a", "b"}) // block order
			is.Equal(metricValue(t, f.met, "dflash_policy_errors_total", map[string]string{"policy": "broken"}), 2.0)
		})
	}
}

func TestBackendRefusals(t *testing.T) {
	t.Run("invalid: 400 without fallback", func(t *testing.T) {
		is := is.New(t)
		a, b := newScripted("a", 1, 1000), newScripted("b", 1, 1000)
		a.invalid = "tool_choice names no tool"
		f := newFixture(t, balanced(), a, b)
		_, err := f.r.Start(bg, chat("r", 1, 1))
		rj := rejectionOf(err)
		is.Equal(rj.Reason, router.ReasonInvalidRequest)
		is.True(strings.Contains(rj.Message, "tool_choice names no tool"))
		is.Equal(b.startCount(), 0) // no fallback
	})
	t.Run("start error on a ready backend: 503 without fallback", func(t *testing.T) {
		is := is.New(t)
		a, b := newScripted("a", 1, 1000), newScripted("b", 1, 1000)
		a.startErr = errors.New("template exploded")
		f := newFixture(t, balanced(), a, b)
		_, err := f.r.Start(bg, chat("r", 1, 1))
		rj := rejectionOf(err)
		is.Equal(rj.Reason, router.ReasonBackendUnavailable)
		is.Equal(b.startCount(), 0)
		is.NoErr(f.r.Wait(bg)) // the attempt's reservation was returned
	})
	t.Run("invalid error from start: 400", func(t *testing.T) {
		is := is.New(t)
		a := newScripted("a", 1, 1000)
		a.startErr = sdk.Invalidf("bad json schema")
		f := newFixture(t, balanced(), a)
		_, err := f.r.Start(bg, chat("r", 1, 1))
		is.Equal(rejectionOf(err).Reason, router.ReasonInvalidRequest)
	})
	t.Run("plugin died: next model", func(t *testing.T) {
		is := is.New(t)
		a, b := newScripted("a", 1, 1000), newScripted("b", 1, 1000)
		a.startErr = sdk.ErrUnavailable
		f := newFixture(t, balanced(), a, b)
		s, err := f.r.Start(bg, chat("r", 1, 1))
		is.NoErr(err)
		defer s.Close()
		is.Equal(s.Model(), "b")
		is.Equal(s.Route(), "fallback:a=unavailable")
	})
	for _, state := range []health.State{health.Restarting, health.Loading, health.Failed} {
		t.Run("primary "+string(state), func(t *testing.T) {
			is := is.New(t)
			a, b := newScripted("a", 1, 1000), newScripted("b", 1, 1000)
			f := newFixture(t, balanced(), a, b)
			models := f.r.Models()
			_ = models
			ms := []*router.Model{
				{Name: "a", Backend: a, Desc: a.desc(), Health: func() (health.State, int) { return state, 3 }},
				{Name: "b", Backend: b, Desc: b.desc()},
			}
			r := router.New(balanced(), ms)
			s, err := r.Start(bg, chat("r", 1, 1))
			is.NoErr(err)
			defer s.Close()
			is.Equal(s.Model(), "b")
			is.Equal(a.startCount(), 0) // not asked while not ready
			is.Equal(r.Models()[0].State, state)
			is.Equal(r.Models()[0].Restarts, 3)
		})
	}
	t.Run("waits for a restarting model and wakes when it is ready", func(t *testing.T) {
		is := is.New(t)
		a := newScripted("a", 1, 1000)
		var state atomic.Value
		state.Store(health.Restarting)
		cfg := balanced()
		cfg.Retry = time.Hour
		r := router.New(cfg, []*router.Model{{Name: "a", Backend: a, Desc: a.desc(),
			Health: func() (health.State, int) { return state.Load().(health.State), 1 }}})
		ch := make(chan outcome, 1)
		go func() { s, err := r.Start(bg, chat("r", 1, 1)); ch <- outcome{s, err} }()
		waitUntil(t, "request queued", func() bool { return r.Status().Waiting == 1 })
		state.Store(health.Ready)
		r.Wake()
		o := <-ch
		is.NoErr(o.err) // served once the backend is back
		o.s.Close()
		a.next(t).all()
	})
	t.Run("only failed models: 503", func(t *testing.T) {
		is := is.New(t)
		a := newScripted("a", 1, 1000)
		r := router.New(balanced(), []*router.Model{{Name: "a", Backend: a, Desc: a.desc(), Health: func() (health.State, int) { return health.Failed, 5 }}})
		_, err := r.Start(bg, chat("r", 1, 1))
		is.Equal(rejectionOf(err).Reason, router.ReasonBackendUnavailable)
	})
}

func TestBackendErrorAfterAdmission(t *testing.T) {
	is := is.New(t)
	a := newScripted("a", 1, 1000)
	f := newFixture(t, balanced(), a)
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	s, err := f.r.Start(ctx, chat("r", 1, 1))
	is.NoErr(err)
	run := a.next(t)
	run.prefill.open()
	_, err = s.Recv(bg)
	is.NoErr(err)
	cancel() // the backend fails mid-stream (its context ends)
	run.retire.open()
	_, err = s.Recv(bg)
	is.True(err != nil && !errors.Is(err, io.EOF)) // failure, not a clean end
	s.Close()
	is.NoErr(f.r.Wait(bg))
}

func TestQuiesce(t *testing.T) {
	is := is.New(t)
	a := newScripted("a", 1, 1000)
	f := newFixture(t, balanced(), a)
	s, err := f.r.Start(bg, chat("active", 1, 1))
	is.NoErr(err)
	run := a.next(t)
	w1 := f.startAsync(bg, chat("w1", 1, 1))
	f.waitQueued(t, 1)
	w2 := f.startAsync(bg, chat("w2", 1, 1))
	f.waitQueued(t, 2)
	f.r.Quiesce()
	for _, ch := range []chan outcome{w1, w2} {
		o := <-ch
		is.Equal(rejectionOf(o.err).Reason, router.ReasonShuttingDown) // waiters refused at once
	}
	_, err = f.r.Start(bg, chat("new", 1, 1))
	is.Equal(rejectionOf(err).Reason, router.ReasonShuttingDown)
	is.True(f.r.Status().ShuttingDown)
	waited := make(chan error, 1)
	go func() { waited <- f.r.Wait(bg) }()
	run.all() // the active stream finishes normally
	evs, err := drain(bg, s)
	is.True(errors.Is(err, io.EOF))
	is.Equal(len(evs), 2)
	s.Close()
	is.NoErr(<-waited)
}

func TestTokenUtilities(t *testing.T) {
	t.Run("one model: any name", func(t *testing.T) {
		is := is.New(t)
		a := newScripted("a", 1, 1000)
		f := newFixture(t, balanced(), a)
		for _, name := range []string{"", "whatever"} {
			m, ids, err := f.r.Tokenize(bg, name, "xyz", false)
			is.NoErr(err)
			is.Equal(m, "a")
			is.Equal(ids, []int32{3, 1})
		}
	})
	t.Run("several models: name required", func(t *testing.T) {
		is := is.New(t)
		a, b := newScripted("a", 1, 1000), newScripted("bb", 1, 1000)
		f := newFixture(t, balanced(), a, b)
		_, _, err := f.r.Tokenize(bg, "", "xyz", false)
		is.Equal(rejectionOf(err).Reason, router.ReasonModelRequired)
		_, _, err = f.r.Detokenize(bg, "zz", nil)
		is.Equal(rejectionOf(err).Reason, router.ReasonUnknownModel)
		m, ids, err := f.r.Tokenize(bg, "bb", "xyz", false)
		is.NoErr(err)
		is.Equal(m, "bb")
		is.Equal(ids, []int32{3, 2}) // bb's tokenizer, no fallback
		req := chat("c", 5, 0)
		req.Model = "bb"
		m, n, err := f.r.CountTokens(bg, req)
		is.NoErr(err)
		is.Equal(m, "bb")
		is.Equal(n, 5)
		is.Equal(b.counts, 1) // counted by bb's backend
		_, text, err := f.r.Detokenize(bg, "a", []int32{1})
		is.NoErr(err)
		is.Equal(text, "a")
		is.Equal(f.waiting(), 0)
	})
}

func TestStatus(t *testing.T) {
	is := is.New(t)
	a, b := newScripted("a", 2, 1000), newScripted("b", 1, 500)
	f := newFixture(t, balanced(), a, b)
	s, err := f.r.Start(bg, chat("r", 10, 10))
	is.NoErr(err)
	defer s.Close()
	st := f.r.Status()
	is.Equal(st.Priority, []string{"a", "b"})
	is.Equal(st.Policy, primaryfirst.Name)
	is.Equal(st.QueueLimit, 8)
	is.Equal(len(st.Models), 2)
	is.Equal(st.Models[0].InFlight, 1)
	is.Equal(st.Models[0].Capacity, router.Capacity{Slots: 2, KVPoolTokens: 1000, MaxCtx: 1000})
	is.Equal(st.Models[0].KVTokensUsed, 20) // engine stats fetched for status
	is.Equal(st.Models[0].ActiveSequences, 1)
	is.Equal(st.Models[0].DraftAcceptance, 0.75)
	is.True(st.Models[0].Primary)
	is.Equal(st.Models[1].State, health.Ready)
}
