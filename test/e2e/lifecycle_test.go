package e2e

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"

	"github.com/matryer/is"
)

// TestShutdownDrain sends SIGTERM while a stream of each API is active and
// a request waits: every stream ends with its API's normal terminal event,
// the waiter gets 503, the server exits 0 and leaves no plugin process. The
// drain must hold whether the signal reaches the server alone or its whole
// process group (systemd's KillMode=control-group, timeout(1), Ctrl-C),
// where the plugins receive it too (issue 14 item 3).
func TestShutdownDrain(t *testing.T) {
	tests := []struct {
		name string
		send func(s *server, sig syscall.Signal)
	}{
		{"server pid", (*server).signal},
		{"process group", (*server).signalGroup},
	}
	for _, tt := range tests {
		t.Run(tt.name+" SIGTERM", func(t *testing.T) { testDrain(t, func(s *server) { tt.send(s, syscall.SIGTERM) }) })
	}
	t.Run("process group SIGINT", func(t *testing.T) { testDrain(t, func(s *server) { s.signalGroup(syscall.SIGINT) }) })
	// timeout(1) signals its child and then the child's group: the server
	// gets the same signal twice, which is not an operator's second signal.
	t.Run("server pid then group SIGTERM", func(t *testing.T) {
		testDrain(t, func(s *server) { s.signal(syscall.SIGTERM); s.signalGroup(syscall.SIGTERM) })
	})
}

func testDrain(t *testing.T, stop func(s *server)) {
	is := is.New(t)
	words := strings.Repeat("word ", 39) + "end"
	dir := t.TempDir()
	args := []string{"--routing-queue-limit", "4",
		"--model", scriptedModel(t, dir, "a"), "--model-name", "a", "--max-concurrency", "3",
		"--scripted-token-delay", tokenDelay, "--scripted-reply", words}
	s := startServer(t, serverOpts{args: args})
	user := []any{map[string]any{"role": "user", "content": "hi"}}
	chat := s.start(t, pathChat, map[string]any{"messages": user, "max_tokens": 100, "stream": true})
	msgs := s.start(t, pathMessages, map[string]any{"messages": user, "max_tokens": 100, "stream": true})
	resp := s.start(t, pathResponses, map[string]any{"input": "hi", "max_output_tokens": 100, "stream": true})
	for _, c := range []*call{chat, msgs, resp} {
		c.waitHead(t)
		is.Equal(c.status, 200)
	}
	w := s.start(t, pathChat, quick(""))
	s.waitWaiting(t, 1)
	for _, c := range []*call{chat, msgs, resp} {
		is.True(!isDone(c)) // still streaming when the signal comes
	}

	stop(s)
	w.wait(t)
	is.Equal(w.status, 503)
	is.Equal(w.header.Get("X-Dflash-Reject-Reason"), "shutting-down")
	for _, c := range []*call{chat, msgs, resp} {
		c.wait(t)
		is.NoErr(c.err)
	}
	is.Equal(s.wait(), 0) // exit status

	t.Run("chat ends with finish_reason and [DONE]", func(t *testing.T) {
		is := is.New(t)
		evs := chat.events()
		is.True(len(evs) >= 3)
		is.Equal(evs[len(evs)-1].data, "[DONE]")
		var text strings.Builder
		var finish string
		for _, e := range evs[:len(evs)-1] {
			is.True(!strings.Contains(e.data, `"error"`))
			var ch struct {
				Choices []struct {
					Delta struct {
						Content string `json:"content"`
					} `json:"delta"`
					FinishReason *string `json:"finish_reason"`
				} `json:"choices"`
			}
			is.NoErr(json.Unmarshal([]byte(e.data), &ch))
			for _, c := range ch.Choices {
				text.WriteString(c.Delta.Content)
				if c.FinishReason != nil {
					finish = *c.FinishReason
				}
			}
		}
		is.Equal(finish, "stop")
		is.Equal(text.String(), words) // the whole reply, not cut short
	})

	t.Run("messages ends with message_stop", func(t *testing.T) {
		is := is.New(t)
		evs := msgs.events()
		is.True(len(evs) >= 2)
		is.Equal(evs[len(evs)-1].name, "message_stop")
		var delta struct {
			Delta struct {
				StopReason string `json:"stop_reason"`
			} `json:"delta"`
			Usage struct {
				OutputTokens int `json:"output_tokens"`
			} `json:"usage"`
		}
		is.Equal(evs[len(evs)-2].name, "message_delta")
		is.NoErr(json.Unmarshal([]byte(evs[len(evs)-2].data), &delta))
		is.Equal(delta.Delta.StopReason, "end_turn")
		is.Equal(delta.Usage.OutputTokens, 40)
		for _, e := range evs {
			is.True(e.name != "error")
		}
	})

	t.Run("responses ends with response.completed", func(t *testing.T) {
		is := is.New(t)
		evs := resp.events()
		is.True(len(evs) >= 2)
		last := evs[len(evs)-1]
		is.Equal(last.name, "response.completed")
		var done struct {
			Response struct {
				Status string `json:"status"`
				Usage  struct {
					OutputTokens int `json:"output_tokens"`
				} `json:"usage"`
			} `json:"response"`
		}
		is.NoErr(json.Unmarshal([]byte(last.data), &done))
		is.Equal(done.Response.Status, "completed")
		is.Equal(done.Response.Usage.OutputTokens, 40)
	})

	is.Equal(len(s.pluginProcs("")), 0) // no plugin process left
}

// TestPluginsExitWhenServerKilled kills the server with SIGKILL, which
// gives it no chance to stop its plugins: they must notice and exit by
// themselves, or every crash of the server leaks model processes (and, on
// a GPU host, their device memory).
func TestPluginsExitWhenServerKilled(t *testing.T) {
	is := is.New(t)
	s := startServer(t, serverOpts{args: append([]string{"--load-balancing"}, twoModels(t)...)})
	is.Equal(len(s.pluginProcs("")), 3)
	s.signal(syscall.SIGKILL)
	s.wait()
	gone := func() bool { return len(s.pluginProcs("")) == 0 }
	waitFor(t, "the plugins of the killed server to exit", gone)
}

// TestLogLevelReachesEveryComponent: --log-level and the server's log
// stream reach the router and the plugin processes (issue 14 item 5: the
// router logged nowhere and plugins always logged at info).
func TestLogLevelReachesEveryComponent(t *testing.T) {
	is := is.New(t)
	dir := t.TempDir()
	s := startServer(t, serverOpts{args: []string{"--log-level", "debug", "--model", scriptedModel(t, dir, "a"), "--model-name", "a"}})
	c := s.start(t, pathChat, quick(""))
	c.wait(t)
	is.Equal(c.status, 200)
	// The server's stderr reaches the buffer through a pipe: poll for it.
	for _, line := range []string{
		"request admitted", // the router's debug line, in the server's log
		"plugin address",   // a plugin's own debug line, relayed
	} {
		waitFor(t, "log line "+line, func() bool { return strings.Contains(s.stderr.String(), line) })
	}
}
