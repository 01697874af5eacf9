package e2e

import (
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/matryer/is"
)

// TestByName serves with --routing-policy by-name: a named model is pinned
// (it waits, never spills), unknown names get 404, and a backend crash is
// contained to its model.
func TestByName(t *testing.T) {
	dir := t.TempDir()
	args := append([]string{"--routing-policy", "by-name", "--routing-queue-limit", "4"}, twoModelsIn(t, dir)...)
	s := startServer(t, serverOpts{args: args})

	t.Run("every block loads", func(t *testing.T) {
		is := is.New(t)
		st := s.status(t)
		is.Equal(st.Policy, "by-name")
		is.Equal(st.Priority, []string{"a", "b"})
		is.Equal(len(s.pluginProcs("backend-")), 2)
	})

	t.Run("names pin, other names follow the priority", func(t *testing.T) {
		tests := []struct{ name, want, route string }{
			{"b", "b", "pinned"},
			{"a", "a", "primary"},
			{"auto", "a", "primary"},
			{"", "a", "primary"},
		}
		for _, tt := range tests {
			is := is.New(t)
			c := s.post(t, pathChat, quick(tt.name))
			is.Equal(c.status, 200)
			is.Equal(c.model(), tt.want)
			is.Equal(c.header.Get("X-Dflash-Route"), tt.route)
		}
		s.waitIdle(t)
	})

	t.Run("a named model waits and never spills", func(t *testing.T) {
		is := is.New(t)
		h := s.hold(t, "b", "b")
		defer release(h)
		w := s.start(t, pathChat, quick("b"))
		st := s.waitWaiting(t, 1)
		is.Equal(st.model("a").InFlight, 0) // a is free, yet not used
		is.Equal(st.model("b").Waiting, 1)
		release(h)
		w.wait(t)
		is.Equal(w.status, 200)
		is.Equal(w.model(), "b")
		s.waitIdle(t)
	})

	t.Run("unknown name is 404 listing the loaded models", func(t *testing.T) {
		is := is.New(t)
		c := s.post(t, pathChat, quick("nope"))
		is.Equal(c.status, 404)
		is.Equal(c.header.Get("X-Dflash-Reject-Reason"), "unknown-model")
		e := decode[chatResult](t, c.bodyBytes()).Error
		is.Equal(e.Code, "model_not_found")
		is.True(contains(e.Message, `"nope"`, "a, b"))
		m := s.post(t, pathMessages, map[string]any{"model": "nope", "max_tokens": 1,
			"messages": []any{map[string]any{"role": "user", "content": "hi"}}})
		is.Equal(m.status, 404)
		is.True(strings.Contains(string(m.bodyBytes()), "not_found_error"))
	})

	t.Run("backend crash mid-stream", func(t *testing.T) {
		is := is.New(t)
		ha, hb := s.hold(t, "a", "a"), s.hold(t, "b", "b")
		defer release(ha, hb)
		holders := map[string]*call{"a": ha, "b": hb}
		// With its model file gone the crashed backend cannot reload, so it
		// stays restarting until the file is back: the test sees the state
		// without racing the restart.
		files := []string{dir + "/a.gguf", dir + "/b.gguf"}
		for _, f := range files {
			is.NoErr(os.Rename(f, f+".away"))
		}
		backs := s.pluginProcs("backend-")
		is.Equal(len(backs), 2)
		is.NoErr(syscall.Kill(backs[0].pid, syscall.SIGKILL))
		var victim string
		st := s.waitStatus(t, "a model restarting", func(st status) bool {
			for _, m := range st.Models {
				if m.State == "restarting" {
					victim = m.Name
					return true
				}
			}
			return false
		})
		for _, f := range files {
			is.NoErr(os.Rename(f+".away", f))
		}
		other := "a"
		if victim == "a" {
			other = "b"
		}
		is.Equal(st.model(other).State, "ready")

		// The victim's client gets an in-stream error and its stream ends.
		hv := holders[victim]
		hv.wait(t)
		evs := hv.events()
		is.True(len(evs) >= 2)
		is.Equal(evs[len(evs)-1].data, "[DONE]")
		is.True(strings.Contains(evs[len(evs)-2].data, `"error"`))
		// The other model's stream goes on.
		is.True(!isDone(holders[other]))

		st = s.waitStatus(t, victim+" ready again", func(st status) bool { return st.model(victim).State == "ready" })
		is.Equal(st.model(victim).Restarts, 1)
		is.Equal(st.model(other).Restarts, 0)
		is.Equal(len(s.pluginProcs("backend-")), 2)
		c := s.post(t, pathChat, quick(victim))
		is.Equal(c.status, 200)
		is.Equal(c.model(), victim)
		is.Equal(s.metrics(t).value("dflash_backend_restarts_total", "model", victim), 1.0)
		release(ha, hb)
		s.waitIdle(t)
	})
}

// TestByNameUnknownToPrimary serves unknown names with the primary, bounds
// waiting with --routing-queue-timeout, and survives a policy crash with
// its configuration.
func TestByNameUnknownToPrimary(t *testing.T) {
	args := append([]string{"--routing-policy", "by-name", "--unknown-model", "primary", "--routing-queue-timeout", "1s"},
		twoModels(t)...)
	s := startServer(t, serverOpts{args: args})

	t.Run("unknown name goes to the primary", func(t *testing.T) {
		is := is.New(t)
		c := s.post(t, pathChat, quick("nope"))
		is.Equal(c.status, 200)
		is.Equal(c.model(), "a")
	})

	t.Run("queue timeout", func(t *testing.T) {
		is := is.New(t)
		h := s.hold(t, "b", "b")
		defer release(h)
		before := s.metrics(t).value("dflash_admission_rejections_total", "reason", "queue_timeout")
		c := s.post(t, pathChat, quick("b"))
		is.Equal(c.status, 503)
		is.Equal(c.header.Get("X-Dflash-Reject-Reason"), "queue-timeout")
		is.True(c.header.Get("Retry-After") != "")
		is.Equal(decode[chatResult](t, c.bodyBytes()).Error.Code, "queue_timeout")
		is.Equal(s.status(t).Waiting, 0)
		is.Equal(s.metrics(t).value("dflash_admission_rejections_total", "reason", "queue_timeout"), before+1)
		release(h)
		s.waitIdle(t)
	})

	t.Run("policy crash keeps serving and the restart keeps the options", func(t *testing.T) {
		is := is.New(t)
		pols := s.pluginProcs("policy-")
		is.Equal(len(pols), 1)
		is.True(strings.HasSuffix(pols[0].name, "by-name"))
		old := pols[0].pid
		is.NoErr(syscall.Kill(old, syscall.SIGKILL))
		// Without a policy the block order serves: a named b lands on a
		// or, once the policy is back, on b; never an error.
		c := s.post(t, pathChat, quick("b"))
		is.Equal(c.status, 200)
		is.True(slices.Contains([]string{"a", "b"}, c.model()))
		waitFor(t, "a new policy process", func() bool {
			p := s.pluginProcs("policy-")
			return len(p) == 1 && p[0].pid != old
		})
		waitFor(t, "pinning by the restarted policy", func() bool {
			c := s.post(t, pathChat, quick("b"))
			return c.status == 200 && c.model() == "b"
		})
		// --unknown-model primary survived the restart (a fresh by-name
		// policy would answer 404).
		c = s.post(t, pathChat, quick("nope"))
		is.Equal(c.status, 200)
		is.Equal(c.model(), "a")
		s.waitIdle(t)
	})
}

// TestPolicySwap installs the by-name binary under another policy name:
// routing follows the binary, not the core. The same request goes to the
// primary under primary-first (TestPrimaryFirst).
func TestPolicySwap(t *testing.T) {
	is := is.New(t)
	args := append([]string{"--load-balancing", "--routing-policy", "custom"}, twoModels(t)...)
	s := startServer(t, serverOpts{plugins: []string{"backend-scripted", "policy-custom=policy-by-name"}, args: args})
	is.Equal(s.status(t).Policy, "custom")
	c := s.post(t, pathChat, quick("b"))
	is.Equal(c.status, 200)
	is.Equal(c.model(), "b")
	c = s.post(t, pathChat, quick("nope"))
	is.Equal(c.status, 404)
	c = s.post(t, pathChat, quick(""))
	is.Equal(c.model(), "a")
	s.waitIdle(t)
}

func isDone(c *call) bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}
