package e2e

import (
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

	// Each stream ends with its API's normal terminal event and the whole
	// reply, not cut short by the drain.
	tests := []struct {
		name   string
		c      *call
		path   string
		finish string
		tokens int // 0: not reported in the stream
	}{
		{"chat ends with finish_reason and [DONE]", chat, pathChat, "stop", 0},
		{"messages ends with message_stop", msgs, pathMessages, "end_turn", 40},
		{"responses ends with response.completed", resp, pathResponses, "completed", 40},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			end, err := streamEnd(tt.path, tt.c.events())
			is.NoErr(err)
			is.Equal(end.finish, tt.finish)
			is.Equal(end.tokens, tt.tokens)
			if tt.path == pathChat {
				is.Equal(end.text, words)
			}
		})
	}

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
