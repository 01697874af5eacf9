package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/matryer/is"
)

// TestPrimaryFirst drives one balancing server (a on cpu:0 primary, b on
// cpu:1) through placement, preference, fallback, waiting and cancellation.
// Subtests share the server and each leaves it idle.
func TestPrimaryFirst(t *testing.T) {
	args := append([]string{"--load-balancing", "--load-balancing-primary-gpu", "cpu:0", "--routing-queue-limit", "2"},
		twoModels(t)...)
	s := startServer(t, serverOpts{args: args})

	t.Run("placement, priority and capacity", func(t *testing.T) {
		is := is.New(t)
		var st status
		is.Equal(s.getJSON(t, "/props", &st), 200)
		is.True(st.LoadBalancing)
		is.Equal(st.Policy, "primary-first")
		is.Equal(st.Priority, []string{"a", "b"})
		is.Equal(st.QueueLimit, 2)
		a, b := st.model("a"), st.model("b")
		is.Equal(a.Device, "cpu:0")
		is.Equal(b.Device, "cpu:1")
		is.True(a.Primary && !b.Primary)
		is.Equal(a.Priority, 0)
		is.Equal(b.Priority, 1)
		is.Equal(a.Arch, "scripted")
		is.Equal(a.Backend, "scripted")
		is.Equal(a.State, "ready")
		is.Equal([3]int{a.Capacity.Slots, a.Capacity.KVPoolTokens, a.Capacity.MaxCtx}, [3]int{aSlots, aKV, aKV})
		is.Equal([3]int{b.Capacity.Slots, b.Capacity.KVPoolTokens, b.Capacity.MaxCtx}, [3]int{bSlots, bKV, bKV})
		var models struct {
			Data []struct{ ID string } `json:"data"`
		}
		is.Equal(s.getJSON(t, "/v1/models", &models), 200)
		is.Equal(len(models.Data), 2)
		is.Equal(models.Data[0].ID, "a")
		is.Equal(models.Data[1].ID, "b")
		is.Equal(len(s.pluginProcs("backend-")), 2) // one backend process per block
		is.Equal(len(s.pluginProcs("policy-")), 1)
	})

	t.Run("primary preference on every API", func(t *testing.T) {
		// The request's model field does not select a model: b, auto, an
		// alias and no name all go to the primary.
		for _, name := range []string{"", "auto", "b", "gpt-4o"} {
			is := is.New(t)
			c := s.post(t, pathChat, quick(name))
			is.Equal(c.status, 200)
			is.Equal(c.model(), "a")
			is.Equal(c.header.Get("X-Dflash-Route"), "primary")
			is.Equal(decode[chatResult](t, c.bodyBytes()).Model, "a")
		}
		is := is.New(t)
		m := s.post(t, pathMessages, map[string]any{"model": "b", "max_tokens": 1,
			"messages": []any{map[string]any{"role": "user", "content": "hi"}}})
		is.Equal(m.status, 200)
		is.Equal(m.model(), "a")
		is.Equal(decode[struct{ Model string }](t, m.bodyBytes()).Model, "a")
		r := s.post(t, pathResponses, map[string]any{"model": "b", "max_output_tokens": 1, "input": "hi"})
		is.Equal(r.status, 200)
		is.Equal(r.model(), "a")
		is.Equal(decode[struct{ Model string }](t, r.bodyBytes()).Model, "a")
	})

	t.Run("slot fallback", func(t *testing.T) {
		is := is.New(t)
		h1, h2 := s.hold(t, "", "a"), s.hold(t, "", "a")
		defer release(h1, h2)
		st := s.status(t)
		is.Equal(st.model("a").InFlight, aSlots)
		// KV is not the limit: a small request fits a's free KV.
		is.True(aKV-aSlots*holdNeed > 100)
		c := s.post(t, pathChat, quick(""))
		is.Equal(c.status, 200)
		is.Equal(c.model(), "b")
		is.Equal(c.header.Get("X-Dflash-Route"), "fallback:a=busy")
		is.Equal(decode[chatResult](t, c.bodyBytes()).Model, "b")
		release(h1, h2)
		s.waitIdle(t)
	})

	t.Run("KV fallback with a free slot", func(t *testing.T) {
		is := is.New(t)
		h := s.hold(t, "", "a")
		defer release(h)
		// The engine's own view: the holder's KV is reserved.
		s.waitStatus(t, "a's KV reserved", func(st status) bool { return st.model("a").KVTokensUsed == holdNeed })
		st := s.status(t)
		is.Equal(st.model("a").InFlight, 1) // a slot of a is free
		// Needs more than a's free KV, less than its pool.
		maxTokens := aKV - holdNeed
		need := len("user: hi\n") + maxTokens
		is.True(need > aKV-holdNeed && need <= aKV)
		c := s.post(t, pathChat, chatReq("", "hi", maxTokens, false))
		is.Equal(c.status, 200)
		is.Equal(c.model(), "b")
		is.Equal(c.header.Get("X-Dflash-Route"), "fallback:a=busy")
		release(h)
		s.waitIdle(t)
	})

	t.Run("never fits", func(t *testing.T) {
		is := is.New(t)
		maxTokens := bKV + 100 // beyond both contexts
		c := s.post(t, pathChat, chatReq("", "hi", maxTokens, false))
		is.Equal(c.status, 400)
		is.Equal(c.header.Get("X-Dflash-Reject-Reason"), "never-fits")
		res := decode[chatResult](t, c.bodyBytes())
		is.True(res.Error != nil)
		is.Equal(res.Error.Code, "context_length_exceeded")
		need := itoa(len("user: hi\n") + maxTokens)
		if !contains(res.Error.Message, "a: needs "+need+" tokens, limit "+itoa(aKV), "b: needs "+need+" tokens, limit "+itoa(bKV)) {
			t.Errorf("never-fits message does not list each model's limit: %q", res.Error.Message)
		}
		// The Anthropic route answers in its own error shape.
		m := s.post(t, pathMessages, map[string]any{"max_tokens": maxTokens,
			"messages": []any{map[string]any{"role": "user", "content": "hi"}}})
		is.Equal(m.status, 400)
		e := decode[struct {
			Type  string
			Error struct{ Type, Message string }
		}](t, m.bodyBytes())
		is.Equal(e.Type, "error")
		is.Equal(e.Error.Type, "invalid_request_error")
		s.waitIdle(t)
	})

	t.Run("queue overflow, metrics, waiter disconnect", func(t *testing.T) {
		is := is.New(t)
		before := s.metrics(t).value("dflash_admission_rejections_total", "reason", "queue_full")
		h1, h2, h3 := s.hold(t, "", "a"), s.hold(t, "", "a"), s.hold(t, "", "b")
		defer release(h1, h2, h3)
		w1 := s.start(t, pathChat, quick(""))
		s.waitWaiting(t, 1)
		w2 := s.start(t, pathChat, quick(""))
		s.waitWaiting(t, 2)
		over := s.post(t, pathChat, quick(""))
		is.Equal(over.status, 503)
		is.Equal(over.header.Get("Retry-After"), "1")
		is.Equal(over.header.Get("X-Dflash-Reject-Reason"), "queue-full")
		is.Equal(decode[chatResult](t, over.bodyBytes()).Error.Code, "queue_full")
		is.True(!w1.admitted() && !w2.admitted())

		m := s.metrics(t)
		is.Equal(m.value("dflash_admission_rejections_total", "reason", "queue_full"), before+1)
		is.Equal(m.value("dflash_requests_waiting", "model", "any"), 2.0)
		is.True(m.series("dflash_requests_waiting", "model", "a"))
		is.True(m.series("dflash_requests_waiting", "model", "b"))
		is.Equal(m.value("dflash_requests_running", "model", "a"), float64(aSlots))
		is.Equal(m.value("dflash_requests_running", "model", "b"), float64(bSlots))
		is.Equal(m.value("dflash_slots_in_use", "model", "a"), float64(aSlots))
		is.Equal(m.value("dflash_slots_total", "model", "b"), float64(bSlots))
		is.Equal(m.value("dflash_queue_limit"), 2.0)
		// KV usage comes from the engines' statistics, refreshed at most
		// once a second: poll until the scrape shows the holders.
		deadline := time.Now().Add(pollBound)
		for {
			m = s.metrics(t)
			if m.value("dflash_kv_tokens_reserved", "model", "a") == float64(2*holdNeed) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("dflash_kv_tokens_reserved{model=a} = %v, want %d", m.value("dflash_kv_tokens_reserved", "model", "a"), 2*holdNeed)
			}
			time.Sleep(pollEvery)
		}
		is.Equal(m.value("dflash_kv_tokens_capacity", "model", "a"), float64(aKV))
		is.Equal(m.value("dflash_kv_cache_usage_ratio", "model", "a"), float64(2*holdNeed)/float64(aKV))
		is.True(m.series("dflash_kv_cache_usage_ratio", "model", "b"))

		// Waiters that go away leave the queue.
		release(w1, w2)
		st := s.waitWaiting(t, 0)
		is.Equal(st.model("a").Waiting, 0)
		is.Equal(st.model("b").Waiting, 0)
		is.Equal(s.metrics(t).value("dflash_requests_waiting", "model", "any"), 0.0)
		release(h1, h2, h3)
		s.waitIdle(t)
	})

	t.Run("waiter wakes on release", func(t *testing.T) {
		is := is.New(t)
		h1, h2, h3 := s.hold(t, "", "a"), s.hold(t, "", "a"), s.hold(t, "", "b")
		defer release(h1, h2, h3)
		w := s.start(t, pathChat, quick(""))
		s.waitWaiting(t, 1)
		release(h3) // frees b's only slot
		w.wait(t)
		is.Equal(w.status, 200)
		is.Equal(w.model(), "b")
		is.True(w.header.Get("X-Dflash-Queue-Ms") != "")
		release(h1, h2)
		s.waitIdle(t)
	})

	t.Run("waiters are served first come first served", func(t *testing.T) {
		is := is.New(t)
		h1, h2, h3 := s.hold(t, "", "a"), s.hold(t, "", "a"), s.hold(t, "", "b")
		defer release(h1, h2, h3)
		w1 := s.start(t, pathChat, holdReq(""))
		s.waitWaiting(t, 1)
		w2 := s.start(t, pathChat, holdReq(""))
		s.waitWaiting(t, 2)
		defer release(w1, w2)
		release(h3) // one slot frees
		select {
		case <-w1.head:
		case <-w2.head:
		case <-time.After(pollBound):
			t.Fatal("no waiter was admitted after a release")
		}
		is.True(w1.admitted())  // the first waiter got the slot
		is.True(!w2.admitted()) // the second still waits
		is.Equal(w1.status, 200)
		is.Equal(s.status(t).Waiting, 1)
		release(h1)
		w2.waitHead(t)
		is.Equal(w2.status, 200)
		is.Equal(w2.model(), "a")
		release(h2, w1, w2)
		s.waitIdle(t)
	})

	t.Run("disconnect during decode frees capacity", func(t *testing.T) {
		is := is.New(t)
		h1, h2, h3 := s.hold(t, "", "a"), s.hold(t, "", "a"), s.hold(t, "", "b")
		defer release(h1, h2, h3)
		// Wait until h1 is decoding: a content chunk after the role chunk.
		deadline := time.Now().Add(pollBound)
		for len(h1.events()) < 2 {
			if time.Now().After(deadline) {
				t.Fatal("holder produced no token")
			}
			time.Sleep(pollEvery)
		}
		release(h1)
		s.waitStatus(t, "a's slot released", func(st status) bool { return st.model("a").InFlight == aSlots-1 })
		s.waitStatus(t, "a's KV released", func(st status) bool { return st.model("a").KVTokensUsed == holdNeed })
		c := s.post(t, pathChat, quick(""))
		is.Equal(c.status, 200)
		is.Equal(c.model(), "a") // the primary took it: its capacity is back
		release(h2, h3)
		s.waitIdle(t)
	})

	t.Run("capacity reuse after cancellation", func(t *testing.T) {
		is := is.New(t)
		for round := 0; round < 3; round++ {
			h := []*call{s.hold(t, "", "a"), s.hold(t, "", "a"), s.hold(t, "", "b")}
			release(h...)
			s.waitIdle(t)
		}
		st := s.waitStatus(t, "engines idle", func(st status) bool {
			return st.model("a").KVTokensUsed == 0 && st.model("b").KVTokensUsed == 0 &&
				st.model("a").ActiveSequences == 0 && st.model("b").ActiveSequences == 0
		})
		is.Equal(st.model("a").InFlight, 0)
		// Every slot can still be filled, in priority order.
		h := []*call{s.hold(t, "", "a"), s.hold(t, "", "a"), s.hold(t, "", "b")}
		release(h...)
		s.waitIdle(t)
	})

	t.Run("policy crash", func(t *testing.T) {
		is := is.New(t)
		pols := s.pluginProcs("policy-")
		is.Equal(len(pols), 1)
		old := pols[0].pid
		is.NoErr(syscall.Kill(old, syscall.SIGKILL))
		// Requests are still served in block order while the policy is
		// gone or restarting, and after.
		c := s.post(t, pathChat, quick("b"))
		is.Equal(c.status, 200)
		is.Equal(c.model(), "a")
		h1, h2 := s.hold(t, "", "a"), s.hold(t, "", "a")
		c = s.post(t, pathChat, quick(""))
		is.Equal(c.model(), "b")
		release(h1, h2)
		s.waitIdle(t) // a cancelled stream holds its slot until its sequence retired
		restarted := waitFor(t, "a new policy process", func() bool {
			p := s.pluginProcs("policy-")
			return len(p) == 1 && p[0].pid != old
		})
		is.True(restarted)
		c = s.post(t, pathChat, quick(""))
		is.Equal(c.status, 200)
		is.Equal(c.model(), "a")
		s.waitIdle(t)
	})
}

// TestReversedPriority changes only --load-balancing-primary-gpu: the
// priority order reverses, placement stays.
func TestReversedPriority(t *testing.T) {
	is := is.New(t)
	args := append([]string{"--load-balancing", "--load-balancing-primary-gpu", "cpu:1", "--routing-queue-limit", "2"},
		twoModels(t)...)
	s := startServer(t, serverOpts{args: args})
	st := s.status(t)
	is.Equal(st.Priority, []string{"b", "a"})
	is.True(st.model("b").Primary)
	is.Equal(st.model("a").Device, "cpu:0") // placement unchanged
	is.Equal(st.model("b").Device, "cpu:1")

	c := s.post(t, pathChat, quick("a"))
	is.Equal(c.model(), "b")
	is.Equal(c.header.Get("X-Dflash-Route"), "primary")
	s.waitIdle(t) // b's one slot is held until its sequence retired, which may follow the response
	h := s.hold(t, "", "b")
	defer release(h)
	c = s.post(t, pathChat, quick(""))
	is.Equal(c.status, 200)
	is.Equal(c.model(), "a")
	is.Equal(c.header.Get("X-Dflash-Route"), "fallback:b=busy")
	release(h)
	s.waitIdle(t)
}

// TestBalancingDisabled removes --load-balancing: only the primary loads
// and serves, and with --routing-queue-limit 0 a busy primary answers 503
// at once instead of falling back.
func TestBalancingDisabled(t *testing.T) {
	is := is.New(t)
	args := append([]string{"--load-balancing-primary-gpu", "cpu:0", "--routing-queue-limit", "0"}, twoModels(t)...)
	s := startServer(t, serverOpts{args: args})
	var models struct {
		Data []struct{ ID string } `json:"data"`
	}
	is.Equal(s.getJSON(t, "/v1/models", &models), 200)
	is.Equal(len(models.Data), 1)
	is.Equal(models.Data[0].ID, "a")
	st := s.status(t)
	is.True(!st.LoadBalancing)
	is.Equal(st.Priority, []string{"a"})
	is.Equal(len(s.pluginProcs("backend-")), 1) // no process for the unused block

	h1, h2 := s.hold(t, "", "a"), s.hold(t, "", "a")
	defer release(h1, h2)
	c := s.post(t, pathChat, quick(""))
	is.Equal(c.status, 503)
	is.Equal(c.header.Get("X-Dflash-Reject-Reason"), "queue-full")
	is.True(c.header.Get("Retry-After") != "")
	msg := decode[chatResult](t, c.bodyBytes()).Error.Message
	is.True(strings.Contains(msg, "queueing is disabled"))
	is.Equal(s.status(t).Waiting, 0)
	release(h1, h2)
	s.waitIdle(t)
}

// waitFor polls cond; it fails the test when cond stays false.
func waitFor(t *testing.T, what string, cond func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(pollBound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: gave up", what)
			return false
		}
		time.Sleep(pollEvery)
	}
	return true
}
