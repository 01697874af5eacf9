package e2e

import (
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/matryer/is"
)

// The seed line's capacity (seedQwenBlock, seedDS4Block): what its
// admission scenarios fill.
const (
	seedQwenSlots = 4  // qwen's --max-concurrency
	seedQueue     = 32 // --routing-queue-limit
	// seedQwenHold is a qwen holder's length: within qwen's 4096-token
	// context, tens of seconds of decoding on the tiny model.
	seedQwenHold = 3500
)

// seedAPIs are the three generation APIs the issue names.
var seedAPIs = []string{pathChat, pathMessages, pathResponses}

// lengthFinish is how each API says a reply stopped at its token limit.
var lengthFinish = map[string]string{
	pathChat:        "length",
	pathCompletions: "length",
	pathMessages:    "max_tokens",
	pathResponses:   "incomplete",
}

// holdDS4 holds ds4's only slot on the seed line. Its 6000 tokens do not
// fit qwen's context, so it goes to ds4 whatever qwen's load: the route
// names qwen as passed over (never_fits, or busy when qwen is full: the
// router looks at free slots first).
func (s *server) holdDS4(t *testing.T) *call {
	t.Helper()
	c := s.holdWith(t, longStream(""), "ds4")
	if r := c.header.Get("X-Dflash-Route"); r != "fallback:qwen=never_fits" && r != "fallback:qwen=busy" {
		t.Fatalf("ds4 holder route %q, want qwen passed over", r)
	}
	return c
}

// fillSeed fills every slot of the seed line: qwen's four, then ds4's one.
func (s *server) fillSeed(t *testing.T) (qwen []*call, ds4 *call) {
	t.Helper()
	for range seedQwenSlots {
		qwen = append(qwen, s.holdWith(t, storyStream("", seedQwenHold), "qwen"))
	}
	return qwen, s.holdDS4(t)
}

// decoding waits until a stream has sent generated text (the first event
// is the role or message start).
func decoding(t *testing.T, c *call) {
	t.Helper()
	waitFor(t, "a generated token", func() bool { return len(c.events()) >= 2 })
}

// testSeedAdmission runs the admission scenarios of issue 14 on the seed
// line's server (qwen primary with 4 slots, ds4 with 1, 32 queue places):
// queue overflow on the three APIs, waiter abandonment, a waiter woken by
// a ds4 slot, disconnect cleanup and capacity reuse. Each subtest leaves
// the server idle with every KV block returned.
func testSeedAdmission(t *testing.T, s *server) {
	t.Run("queue overflow is 503 on every API; abandoned waiters leave; a waiter takes ds4's freed slot", func(t *testing.T) {
		is := is.New(t)
		qh, dh := s.fillSeed(t)
		defer release(append(qh, dh)...)
		before := s.metrics(t).value("dflash_admission_rejections_total", "reason", "queue_full")
		var waiters []*call
		for i := range seedQueue {
			api := seedAPIs[i%len(seedAPIs)]
			waiters = append(waiters, s.start(t, api, apiBody(api, "", "hi", 1, false)))
		}
		defer release(waiters...)
		st := s.waitWaiting(t, seedQueue)
		is.Equal(st.QueueLimit, seedQueue)

		for _, api := range seedAPIs {
			c := s.post(t, api, apiBody(api, "", "hi", 1, false))
			is.Equal(c.status, 503)
			is.Equal(c.header.Get("X-Dflash-Reject-Reason"), "queue-full")
			is.Equal(c.header.Get("Retry-After"), "1")
			is.True(errorMessage(c.bodyBytes()) != "") // in the API's error shape, with a message
		}
		is.Equal(s.metrics(t).value("dflash_admission_rejections_total", "reason", "queue_full"), before+3)
		for _, w := range waiters {
			is.True(!w.admitted()) // no waiter was served past a full server
		}

		// Waiters that go away leave the queue and take no slot.
		release(waiters[1:]...)
		st = s.waitWaiting(t, 1)
		is.Equal(st.model("qwen").InFlight, seedQwenSlots)
		is.Equal(st.model("ds4").InFlight, 1)
		is.Equal(s.metrics(t).value("dflash_requests_waiting", "model", "any"), 1.0)

		// The one left is woken when ds4's slot frees.
		release(dh)
		w := waiters[0]
		w.wait(t)
		is.Equal(w.status, 200)
		is.Equal(w.model(), "ds4")
		is.Equal(w.header.Get("X-Dflash-Route"), "fallback:qwen=busy")
		release(qh...)
		s.waitIdle(t)
		s.waitKVReturned(t)
	})

	t.Run("a ds4 client that disconnects mid-stream frees its slot and KV", func(t *testing.T) {
		is := is.New(t)
		h := s.holdDS4(t)
		defer release(h)
		decoding(t, h)
		st := s.waitStatus(t, "ds4's sequence holding KV", func(st status) bool {
			return st.model("ds4").ActiveSequences == 1 && st.model("ds4").KVTokensUsed > 0
		})
		is.Equal(st.model("ds4").InFlight, 1)
		release(h)
		s.waitIdle(t)
		s.waitKVReturned(t) // ds4: 0 active sequences, 0 KV tokens
		is.Equal(s.metrics(t).value("dflash_requests_running", "model", "ds4"), 0.0)
	})

	t.Run("capacity is reused after cancellations, in priority order", func(t *testing.T) {
		is := is.New(t)
		for range 2 {
			qh, dh := s.fillSeed(t)
			decoding(t, dh)
			decoding(t, qh[0])
			release(append(qh, dh)...)
			s.waitIdle(t)
			s.waitKVReturned(t)
		}
		// Five requests that fit both models fill qwen first, then ds4:
		// every slot came back.
		var hs []*call
		for i := range seedQwenSlots + 1 {
			want := "qwen"
			if i == seedQwenSlots {
				want = "ds4"
			}
			hs = append(hs, s.holdWith(t, storyStream("", seedQwenHold), want))
		}
		defer release(hs...)
		is.Equal(hs[seedQwenSlots].header.Get("X-Dflash-Route"), "fallback:qwen=busy")
		release(hs...)
		s.waitIdle(t)
		s.waitKVReturned(t)
	})
}

// testSeedDrain sends SIGTERM to the seed line's server while four qwen
// streams (the three APIs) and a ds4 stream run and a request waits: the
// streams run to their token limit and end with their API's terminal
// event, the waiter gets 503, the server exits 0 and no plugin process
// (qwen's, ds4's, the policy's) is left.
func testSeedDrain(t *testing.T, qwen, draft, ds4 string) {
	is := is.New(t)
	gpuBefore := gpuMemoryUsed(t)
	// A generous drain deadline: on a shared 2-core machine the streams
	// may take longer than the default 30 s, and a cut stream is not what
	// this test looks for.
	head := append(slices.Clone(seedHead), "--drain-timeout", "5m")
	s := startServer(t, serverOpts{plugins: realPlugins, args: seedLine(head, qwen, draft, ds4, seedFused)})
	// Long enough to outlast the few requests sent before the signal; a
	// GPU decodes the tiny models far faster than the CPU.
	qwenTokens, ds4Tokens := 300, 100
	if strings.HasPrefix(seedDevices.qwen, "cuda") {
		qwenTokens = 3000
	}
	if strings.HasPrefix(seedDevices.ds4, "cuda") {
		ds4Tokens = 3000
	}
	type stream struct {
		path, model string
		tokens      int
		c           *call
	}
	// Qwen's streams fill its slots, so the last goes to ds4; their
	// lengths keep them running well past the signal.
	streams := []*stream{
		{path: pathChat, model: "qwen", tokens: qwenTokens},
		{path: pathMessages, model: "qwen", tokens: qwenTokens},
		{path: pathResponses, model: "qwen", tokens: qwenTokens},
		{path: pathCompletions, model: "qwen", tokens: qwenTokens},
		{path: pathMessages, model: "ds4", tokens: ds4Tokens},
	}
	for _, st := range streams {
		b := apiBody(st.path, "", "Tell me a long story.", st.tokens, true)
		b["ignore_eos"] = true
		st.c = s.start(t, st.path, b)
		st.c.waitHead(t)
		is.Equal(st.c.status, 200)
		is.Equal(st.c.model(), st.model)
	}
	w := s.start(t, pathChat, quick(""))
	s.waitWaiting(t, 1)
	for _, st := range streams {
		is.True(!isDone(st.c)) // still streaming when the signal comes
	}

	s.signal(syscall.SIGTERM)
	w.wait(t)
	is.Equal(w.status, 503)
	is.Equal(w.header.Get("X-Dflash-Reject-Reason"), "shutting-down")
	for _, st := range streams {
		api := strings.ReplaceAll(strings.TrimPrefix(st.path, "/v1/"), "/", " ")
		t.Run(st.model+" "+api+" stream ends normally", func(t *testing.T) {
			is := is.New(t)
			st.c.wait(t)
			is.NoErr(st.c.err)
			end, err := streamEnd(st.path, st.c.events())
			is.NoErr(err)                               // one terminal event, its last, no error
			is.Equal(end.finish, lengthFinish[st.path]) // ran to its limit
			is.Equal(end.tokens, st.tokens)             // not cut by the drain
		})
	}
	is.Equal(s.wait(), 0)
	is.Equal(len(s.pluginProcs("")), 0) // every plugin process exited
	for dev, before := range gpuBefore {
		// No GPU memory left: the device is back to what it used before
		// the server started (a little slack for the driver).
		if after := gpuMemoryUsed(t)[dev]; after > before+64 {
			t.Errorf("%s: %d MiB used after the server exited, %d MiB before it started", dev, after, before)
		}
	}
}

// gpuMemoryUsed is the memory in use (MiB, nvidia-smi) on each cuda device
// of the seed line; empty when the line uses none.
func gpuMemoryUsed(t *testing.T) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, dev := range []string{seedDevices.qwen, seedDevices.ds4} {
		idx, ok := strings.CutPrefix(dev, "cuda:")
		if !ok {
			continue
		}
		b, err := exec.Command("nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", idx).Output()
		if err != nil {
			t.Fatalf("nvidia-smi for %s: %v", dev, err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("nvidia-smi for %s: %q: %v", dev, b, err)
		}
		out[dev] = n
	}
	return out
}

// testSeedBalancingDisabled drops --load-balancing from the seed line:
// only the block on the primary device loads and serves. A busy primary
// makes a request wait, never fall back; on qwen, a request too long for
// its context is refused rather than sent to ds4.
func testSeedBalancingDisabled(t *testing.T, qwen, draft, ds4 string) {
	tests := []struct {
		primary       string
		serves, other string
		backend       string // the one backend process
		slots         int
		hold          func() map[string]any // a request that keeps one of its slots
	}{
		{seedDevices.qwen, "qwen", "ds4", "dflash-backend-qwen-dflash", seedQwenSlots, func() map[string]any { return storyStream("", seedQwenHold) }},
		{seedDevices.ds4, "ds4", "qwen", "dflash-backend-ds4", 1, func() map[string]any { return longStream("") }},
	}
	for _, tt := range tests {
		t.Run("primary "+tt.primary, func(t *testing.T) {
			is := is.New(t)
			head := []string{"--load-balancing-primary-gpu", tt.primary} // the seed's head without --load-balancing
			s := startServer(t, serverOpts{plugins: realPlugins, args: seedLine(head, qwen, draft, ds4, seedFused)})
			st := s.status(t)
			is.True(!st.LoadBalancing)
			is.Equal(st.Priority, []string{tt.serves})
			is.Equal(st.model(tt.other).State, "absent") // not loaded
			var models struct {
				Data []struct{ ID string } `json:"data"`
			}
			is.Equal(s.getJSON(t, "/v1/models", &models), 200)
			is.Equal(len(models.Data), 1)
			is.Equal(models.Data[0].ID, tt.serves)
			backends := s.pluginProcs("backend-")
			is.Equal(len(backends), 1)
			is.Equal(backends[0].name, tt.backend) // no process for the other block

			for _, api := range seedAPIs {
				text, _ := generate(t, s, api, tt.serves)
				is.True(text != "")
			}
			c := s.post(t, pathChat, chatReq(tt.other, "hi", 1, false)) // naming the other model
			is.Equal(c.status, 200)
			is.Equal(c.model(), tt.serves)

			// A busy primary: the next request waits for it.
			var hs []*call
			for range tt.slots {
				hs = append(hs, s.holdWith(t, tt.hold(), tt.serves))
			}
			defer release(hs...)
			w := s.start(t, pathChat, quick(""))
			defer release(w)
			s.waitWaiting(t, 1)
			is.True(!w.admitted())
			release(hs[0])
			w.wait(t)
			is.Equal(w.status, 200)
			is.Equal(w.model(), tt.serves)
			if tt.serves == "qwen" {
				// Too long for qwen's 4096-token context, which ds4's 8192
				// would hold: refused, not sent to the unloaded model.
				c := s.post(t, pathChat, longStream(""))
				is.Equal(c.status, 400)
				is.Equal(c.header.Get("X-Dflash-Reject-Reason"), "never-fits")
			}
			release(hs...)
			s.waitIdle(t)
			s.waitKVReturned(t)
		})
	}
}

// testSeedDS4Killed kills ds4's backend process (SIGKILL) while a ds4 and a
// qwen stream run on the seed line: the ds4 client gets an in-stream error
// and a closed stream, ds4 restarts and serves again, and qwen's stream
// never notices.
func testSeedDS4Killed(t *testing.T, s *server, ds4 string) {
	t.Run("SIGKILL of ds4's backend mid-stream: only its client notices", func(t *testing.T) {
		is := is.New(t)
		hq := s.holdWith(t, storyStream("", seedQwenHold), "qwen")
		hd := s.holdDS4(t)
		defer release(hq, hd)
		decoding(t, hq)
		decoding(t, hd)
		is.NoErr(syscall.Kill(s.backendOf(t, ds4).pid, syscall.SIGKILL))

		hd.wait(t)
		evs := hd.events()
		is.True(streamErrored(evs))              // the failure is reported in the stream
		is.Equal(evs[len(evs)-1].data, "[DONE]") // which is then closed properly
		st := s.waitStatus(t, "ds4 restarted", func(st status) bool {
			return st.model("ds4").State == "ready" && st.model("ds4").Restarts == 1
		})
		is.Equal(st.model("qwen").Restarts, 0)
		again := s.holdDS4(t) // the restarted ds4 admits and generates
		defer release(again)
		decoding(t, again)
		is.Equal(streamError(again.events()), "")
		release(again)
		is.True(!isDone(hq)) // qwen's stream goes on
		is.Equal(streamError(hq.events()), "")
		release(hq)
		s.waitIdle(t)
		s.waitKVReturned(t)
	})
}
