package pluginhost_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/matryer/is"

	"github.com/dflash/dflash_server/core/health"
	"github.com/dflash/dflash_server/core/pluginhost"
	"github.com/dflash/dflash_server/sdk"
)

// pluginDir holds real plugin binaries built once for the whole package.
var pluginDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dflash-plugins-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	pluginDir = dir
	builds := map[string]string{
		"dflash-backend-scripted":     "../../plugins/backend-scripted",
		"dflash-policy-primary-first": "../../plugins/policy-primary-first",
	}
	for bin, pkg := range builds {
		if _, err := os.Stat(pkg); err != nil {
			continue
		}
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, bin), pkg)
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n", pkg, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func logger() hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: os.Stderr})
}

func findFile(t *testing.T, dir, base string) pluginhost.File {
	t.Helper()
	files, err := pluginhost.Discover(dir)
	if err != nil {
		t.Fatalf("discover: %v", err)
	}
	for _, f := range files {
		if filepath.Base(f.Path) == base {
			return f
		}
	}
	t.Fatalf("%s not found in %s", base, dir)
	return pluginhost.File{}
}

// recorder collects a Start stream.
type recorder struct {
	mu       sync.Mutex
	adm      sdk.Admission
	events   []sdk.Event
	onEvent  func(n int)
	admitted chan struct{}
}

func newRecorder() *recorder { return &recorder{admitted: make(chan struct{})} }

func (r *recorder) Admit(a sdk.Admission) error {
	r.adm = a
	close(r.admitted)
	return nil
}

func (r *recorder) Emit(e sdk.Event) error {
	r.mu.Lock()
	r.events = append(r.events, e)
	n := len(r.events)
	r.mu.Unlock()
	if r.onEvent != nil {
		r.onEvent(n)
	}
	return nil
}

func (r *recorder) text() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var sb strings.Builder
	for _, e := range r.events {
		sb.WriteString(e.Text)
	}
	return sb.String()
}

func loadScripted(t *testing.T, opts map[string]string) *pluginhost.Backend {
	t.Helper()
	is := is.New(t)
	b, err := pluginhost.LaunchBackend(context.Background(), findFile(t, pluginDir, "dflash-backend-scripted"), pluginhost.Options{Logger: logger()})
	is.NoErr(err) // launch the real scripted backend binary
	t.Cleanup(func() { _ = b.Shutdown(context.Background()) })
	model := filepath.Join(t.TempDir(), "m.gguf")
	is.NoErr(writeFile(model))
	_, err = b.Load(context.Background(), sdk.ModelConfig{Path: model, Name: "m", Device: "cpu:0", Options: opts}, nil)
	is.NoErr(err) // load
	return b
}

func chat(text string, maxTokens int) *sdk.ChatRequest {
	return &sdk.ChatRequest{Messages: []sdk.Message{{Role: "user", Content: text}}, MaxTokens: maxTokens}
}

func TestStreamThroughRealPlugin(t *testing.T) {
	is := is.New(t)
	b := loadScripted(t, nil)
	rec := newRecorder()
	is.NoErr(b.Start(context.Background(), chat("hello there", 16), rec))
	is.Equal(rec.adm.Outcome, sdk.OutcomeAdmitted) // admitted first
	is.Equal(rec.text(), "echo: hello there")      // scripted echo through the gRPC boundary
	last := rec.events[len(rec.events)-1]
	is.True(last.Finish != nil) // stream ends with finish
	is.Equal(last.Finish.Reason, sdk.FinishStop)
}

func TestCancelMidStream(t *testing.T) {
	is := is.New(t)
	b := loadScripted(t, map[string]string{"scripted-token-delay": "5ms", "scripted-reply": strings.Repeat("word ", 200)})
	ctx, cancel := context.WithCancel(context.Background())
	rec := newRecorder()
	rec.onEvent = func(n int) {
		if n == 3 {
			cancel()
		}
	}
	err := b.Start(ctx, chat("x", 200), rec)
	is.True(errors.Is(err, context.Canceled)) // cancellation reaches the caller as context.Canceled
	// Start returns only once the plugin has retired the sequence, so the
	// caller's reservation covers all engine work: no polling here.
	st, err := b.Stats(context.Background())
	is.NoErr(err)
	is.Equal(st.ActiveSequences, 0) // sequence retired before Start returned
	is.Equal(st.KVTokensUsed, 0)    // and its KV freed
	state, restarts := b.Health()
	is.Equal(state, health.Ready)
	is.Equal(restarts, 0)
	rec2 := newRecorder()
	is.NoErr(b.Start(context.Background(), chat("again", 8), rec2))
	is.Equal(rec2.text(), strings.Repeat("word ", 8)) // a new request is served after the cancelled one
}

func TestKillMidStreamRestarts(t *testing.T) {
	is := is.New(t)
	b := loadScripted(t, map[string]string{"scripted-token-delay": "5ms", "scripted-reply": strings.Repeat("word ", 200)})
	pid := b.Pid()
	is.True(pid > 0) // plugin pid known
	rec := newRecorder()
	rec.onEvent = func(n int) {
		if n == 3 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	err := b.Start(context.Background(), chat("x", 200), rec)
	is.True(errors.Is(err, sdk.ErrUnavailable)) // a clean, typed error, not a hang or panic
	// (not "ready with another pid": the dead process's pid reads 0 before the supervisor notices its exit)
	waitFor(t, func() bool { s, n := b.Health(); return s == health.Ready && n >= 1 })
	_, restarts := b.Health()
	is.Equal(restarts, 1)                  // restarted once with a fresh client
	is.True(b.Pid() > 0 && b.Pid() != pid) // a new process
	rec2 := newRecorder()
	is.NoErr(b.Start(context.Background(), chat("after restart", 8), rec2))
	is.Equal(rec2.text(), strings.Repeat("word ", 8)) // the reloaded model serves again, with its options
}

func TestPolicyPlugin(t *testing.T) {
	if _, err := os.Stat(filepath.Join(pluginDir, "dflash-policy-primary-first")); err != nil {
		t.Fatalf("policy plugin not built: %v", err)
	}
	is := is.New(t)
	p, err := pluginhost.LaunchPolicy(context.Background(), findFile(t, pluginDir, "dflash-policy-primary-first"), pluginhost.Options{Logger: logger()})
	is.NoErr(err)
	defer p.Close()
	snap := sdk.Snapshot{Models: []sdk.ModelState{
		{Name: "a", Primary: true, Available: true, Slots: 1, Fits: true},
		{Name: "b", Available: true, Slots: 1, Fits: true},
	}}
	d, err := p.Order(context.Background(), snap)
	is.NoErr(err)
	is.Equal(d.Order, []string{"a", "b"}) // primary first
	pid := p.Pid()
	is.NoErr(syscall.Kill(pid, syscall.SIGKILL))
	waitFor(t, func() bool { return p.Restarts() == 1 })
	d, err = p.Order(context.Background(), snap)
	is.NoErr(err) // restarted policy answers again
	is.Equal(d.Order, []string{"a", "b"})
}

func TestBadPlugins(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// A plugin that answers with another protocol version.
	write("dflash-backend-wronghandshake", "#!/bin/sh\necho '1|9|unix|/nonexistent.sock|grpc'\nsleep 2\n", 0o755)
	// An ordinary program.
	write("dflash-backend-notaplugin", "#!/bin/sh\necho hello\n", 0o755)
	// A real plugin whose pinned checksum does not match.
	real, err := os.ReadFile(filepath.Join(pluginDir, "dflash-backend-scripted"))
	if err != nil {
		t.Fatal(err)
	}
	write("dflash-backend-pinned", string(real), 0o755)
	wrong := sha256.Sum256([]byte("something else"))
	write("dflash-backend-pinned.sha256", hex.EncodeToString(wrong[:])+"  dflash-backend-pinned\n", 0o644)
	// Not executable: skipped, not an error.
	write("dflash-backend-data", "data", 0o644)

	tests := []struct {
		name, file, want string
	}{
		{"wrong handshake", "dflash-backend-wronghandshake", "wrong handshake"},
		{"not a plugin", "dflash-backend-notaplugin", "not a dflash plugin"},
		{"checksum mismatch", "dflash-backend-pinned", "checksum mismatch"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			_, err := pluginhost.LaunchBackend(context.Background(), findFile(t, dir, tt.file), pluginhost.Options{Logger: logger()})
			is.True(err != nil)
			msg := err.Error()
			is.True(strings.Contains(msg, filepath.Join(dir, tt.file))) // names the file
			is.True(strings.Contains(msg, tt.want))                     // says what is wrong
			is.True(!strings.Contains(msg, "\n"))                       // one line
		})
	}

	t.Run("non-executables skipped", func(t *testing.T) {
		is := is.New(t)
		files, err := pluginhost.Discover(dir)
		is.NoErr(err)
		for _, f := range files {
			is.True(f.Name != "data") // data file is not a plugin
		}
	})
	t.Run("unreadable directory", func(t *testing.T) {
		is := is.New(t)
		notDir := write("plain-file", "x", 0o644)
		_, err := pluginhost.Discover(notDir)
		is.True(err != nil)
		is.True(strings.Contains(err.Error(), notDir)) // names the directory
		is.True(!strings.Contains(err.Error(), "\n"))
		_, err = pluginhost.Discover(filepath.Join(dir, "missing"))
		is.True(err != nil)
		is.True(strings.Contains(err.Error(), "missing"))
	})
	t.Run("bad checksum file", func(t *testing.T) {
		is := is.New(t)
		d := t.TempDir()
		is.NoErr(os.WriteFile(filepath.Join(d, "dflash-backend-x"), []byte("#!/bin/sh\n"), 0o755))
		is.NoErr(os.WriteFile(filepath.Join(d, "dflash-backend-x.sha256"), []byte("zz"), 0o644))
		_, err := pluginhost.Discover(d)
		is.True(err != nil)
		is.True(strings.Contains(err.Error(), "dflash-backend-x.sha256"))
	})
}

// waitFor polls cond until it holds; it fails the test after a generous
// bound so a broken restart cannot hang CI. It asserts no duration.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for i := 0; i < 600; i++ {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("condition not reached within 30s")
}

// writeFile creates a stand-in model file; the scripted backend only checks
// that it exists.
func writeFile(path string) error { return os.WriteFile(path, []byte("GGUF"), 0o644) }

// TestPolicyRestartBudget: the policy plugin restarts within its budget and
// then stays failed, answering ErrUnavailable so the router falls back to
// block order (issue 14 item 6: it restarted without a budget).
func TestPolicyRestartBudget(t *testing.T) {
	is := is.New(t)
	p, err := pluginhost.LaunchPolicy(context.Background(), findFile(t, pluginDir, "dflash-policy-primary-first"), pluginhost.Options{
		Logger:  logger(),
		Restart: pluginhost.RestartPolicy{Budget: 1, Window: time.Hour, BackoffInitial: time.Millisecond, BackoffMax: time.Millisecond, AttemptTimeout: time.Minute},
	})
	is.NoErr(err)
	defer p.Close()
	pid := p.Pid()
	is.NoErr(syscall.Kill(pid, syscall.SIGKILL))
	waitFor(t, func() bool { st, n := p.Health(); return st == health.Ready && n == 1 })
	is.True(p.Pid() != pid) // a fresh process
	is.NoErr(syscall.Kill(p.Pid(), syscall.SIGKILL))
	waitFor(t, func() bool { st, _ := p.Health(); return st == health.Failed })
	_, err = p.Order(context.Background(), sdk.Snapshot{})
	is.True(errors.Is(err, sdk.ErrUnavailable)) // the router falls back to block order
}
