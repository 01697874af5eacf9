package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Bounds of the polling loops. They only stop a broken run from hanging;
// nothing asserts on durations.
const (
	startBound = 2 * time.Minute
	pollBound  = time.Minute
	stopBound  = time.Minute
	pollEvery  = 10 * time.Millisecond
)

// defaultPlugins serve scripted models with either policy.
var defaultPlugins = []string{"backend-scripted", "policy-primary-first", "policy-by-name"}

// pluginDir makes a plugin directory of symlinks. Each spec is a plugin
// ("backend-scripted") or an alias ("policy-custom=policy-by-name": the
// by-name binary installed under another name).
func pluginDir(t *testing.T, specs ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "plugins")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, s := range specs {
		name, target, ok := strings.Cut(s, "=")
		if !ok {
			target = name
		}
		bin := env.plugins[target]
		if bin == "" {
			t.Fatalf("plugin dflash-%s is not available", target)
		}
		if err := os.Symlink(bin, filepath.Join(dir, "dflash-"+name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// lockedBuffer collects a process's output.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// server is one running dflash_server process.
type server struct {
	t         *testing.T
	cmd       *exec.Cmd
	url       string
	pluginDir string
	stdout    *lockedBuffer
	stderr    *lockedBuffer
	exited    chan struct{}
	exitCode  int
}

// serverOpts start a server.
type serverOpts struct {
	// plugins for pluginDir; nil means defaultPlugins.
	plugins []string
	// args follow --plugin-dir; "{port}" is replaced by the chosen port,
	// and --port is added in front when args name none.
	args []string
	// watch is called with the base URL as soon as the process runs,
	// before it is ready (for probes of the loading state).
	watch func(url string)
	// skip, when set, turns a launch that never became ready into a
	// skipped test when it returns a message for the server's stderr (a
	// prerequisite this build lacks, said plainly), instead of a failure.
	skip func(stderr string) string
}

// startServer starts dflash_server and waits for /ready. The server is
// stopped with SIGTERM when the test ends, and the test fails if any plugin
// process it started is still alive then.
func startServer(t *testing.T, o serverOpts) *server {
	t.Helper()
	if o.plugins == nil {
		o.plugins = defaultPlugins
	}
	dir := pluginDir(t, o.plugins...)
	var s *server
	for attempt := 0; ; attempt++ {
		port := freePort(t)
		s = launchServer(t, dir, port, o.args)
		if o.watch != nil {
			o.watch(s.url)
		}
		err := s.waitReady()
		if err == nil {
			break
		}
		// Another process may have taken the port between our probe and
		// the server's listen.
		if attempt < 3 && strings.Contains(s.stderr.String(), "address already in use") {
			continue
		}
		if o.skip != nil {
			if msg := o.skip(s.stderr.String()); msg != "" {
				t.Skip(msg)
			}
		}
		t.Fatalf("server did not become ready: %v\nstderr:\n%s", err, tail(s.stderr.String(), 40))
	}
	return s
}

func launchServer(t *testing.T, dir string, port int, args []string) *server {
	t.Helper()
	argv := []string{"--plugin-dir", dir}
	hasPort := false
	for _, a := range args {
		if a == "--port" || strings.HasPrefix(a, "--port=") {
			hasPort = true
		}
	}
	if !hasPort {
		argv = append(argv, "--port", strconv.Itoa(port))
	}
	for _, a := range args {
		argv = append(argv, strings.ReplaceAll(a, "{port}", strconv.Itoa(port)))
	}
	s := &server{
		t: t, url: fmt.Sprintf("http://127.0.0.1:%d", port), pluginDir: dir,
		stdout: &lockedBuffer{}, stderr: &lockedBuffer{}, exited: make(chan struct{}),
	}
	s.cmd = exec.Command(env.server, argv...)
	s.cmd.Env = serverEnv()
	s.cmd.Stdout, s.cmd.Stderr = s.stdout, s.stderr
	// Its own process group, so a test can signal the server with its
	// plugins as a supervisor would, without signalling the test.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start dflash_server: %v", err)
	}
	go func() {
		_ = s.cmd.Wait()
		s.exitCode = s.cmd.ProcessState.ExitCode()
		close(s.exited)
	}()
	t.Cleanup(s.stop)
	return s
}

// serverEnv is the environment of a server: ours without plugin-dir
// overrides, with the engine library directory.
func serverEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "DFLASH_PLUGIN_DIR=") || strings.HasPrefix(kv, "DFLASH_LIB_DIR=") {
			continue
		}
		out = append(out, kv)
	}
	if env.libDir != "" {
		out = append(out, "DFLASH_LIB_DIR="+env.libDir)
	}
	return out
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func (s *server) waitReady() error {
	deadline := time.Now().Add(startBound)
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return fmt.Errorf("exited with status %d", s.exitCode)
		default:
		}
		resp, err := http.Get(s.url + "/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(pollEvery)
	}
	return errors.New("not ready within the start bound")
}

// signal sends sig to the server process.
func (s *server) signal(sig syscall.Signal) {
	s.t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("signal %v: %v", sig, err)
	}
}

// signalGroup sends sig to the server's process group: the server and
// every plugin process it started.
func (s *server) signalGroup(sig syscall.Signal) {
	s.t.Helper()
	if err := syscall.Kill(-s.cmd.Process.Pid, sig); err != nil {
		s.t.Fatalf("signal group %v: %v", sig, err)
	}
}

// wait waits for the server to exit and returns its status.
func (s *server) wait() int {
	s.t.Helper()
	select {
	case <-s.exited:
		return s.exitCode
	case <-time.After(stopBound):
		s.t.Fatalf("server did not exit\nstderr:\n%s", tail(s.stderr.String(), 40))
		return -1
	}
}

// stop ends the server the way an operator does (SIGTERM, which drains),
// then checks that no plugin process of it is left.
func (s *server) stop() {
	t := s.t
	select {
	case <-s.exited:
	default:
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(stopBound):
			t.Errorf("server ignored SIGTERM; killing it")
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	if left := s.pluginProcs(""); len(left) > 0 {
		t.Errorf("plugin processes left after the server exited: %v", left)
		for _, p := range left {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
	if t.Failed() {
		t.Logf("server %s stderr (tail):\n%s", s.url, tail(s.stderr.String(), 60))
	}
}

// proc is a plugin process of a server.
type proc struct {
	pid  int
	name string // binary base name, e.g. dflash-backend-scripted
}

func (p proc) String() string { return fmt.Sprintf("%s[%d]", p.name, p.pid) }

// pluginProcs lists the live processes started from the server's plugin
// directory whose binary name starts with prefix. The plugin host starts
// them by their path in that directory, so argv[0] tells them apart from
// other servers' plugins.
func (s *server) pluginProcs(prefix string) []proc {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		s.t.Fatalf("read /proc: %v", err)
	}
	var out []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(cmdline) == 0 { // gone, or a zombie
			continue
		}
		argv0, _, _ := bytes.Cut(cmdline, []byte{0})
		dir, name := filepath.Split(string(argv0))
		if filepath.Clean(dir) != s.pluginDir || !strings.HasPrefix(name, "dflash-"+prefix) {
			continue
		}
		if isZombie(pid) {
			continue
		}
		out = append(out, proc{pid: pid, name: name})
	}
	return out
}

func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the parenthesised command name.
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z' || b[i+2] == 'X'
}

// runCLI runs dflash_server to completion (for launches that must fail or
// print help) and returns its exit code, stdout and stderr.
func runCLI(t *testing.T, plugins []string, args ...string) (int, string, string) {
	t.Helper()
	dir := pluginDir(t, plugins...)
	ctx, cancel := context.WithTimeout(context.Background(), startBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, env.server, append([]string{"--plugin-dir", dir}, args...)...)
	cmd.Env = serverEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("run dflash_server: %v", err)
	}
	s := &server{t: t, pluginDir: dir}
	if left := s.pluginProcs(""); len(left) > 0 {
		t.Errorf("plugin processes left after dflash_server %v exited: %v", args, left)
		for _, p := range left {
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
	return code, stdout.String(), stderr.String()
}

// errorLines are the lines of a failed launch's stderr that report the
// error (the rest is plugin log relay and the usage hint).
func errorLines(stderr string) []string {
	var out []string
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "dflash_server: error:") {
			out = append(out, l)
		}
	}
	return out
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
