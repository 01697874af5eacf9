package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-multierror"
	"github.com/hashicorp/go-plugin"

	"github.com/dflash/dflash_server/core/api"
	"github.com/dflash/dflash_server/core/launch"
	"github.com/dflash/dflash_server/core/metrics"
	"github.com/dflash/dflash_server/core/pluginhost"
	"github.com/dflash/dflash_server/core/router"
	"github.com/dflash/dflash_server/sdk"
)

// Exit codes.
const (
	ExitOK    = 0
	ExitError = 1
	ExitUsage = 2
)

// Env names the server reads.
const (
	EnvPluginDir = "DFLASH_PLUGIN_DIR"
	EnvLibDir    = "DFLASH_LIB_DIR"
)

// Run is the whole server process: parse args, start, serve until a signal,
// drain. It returns the exit code.
func Run(args []string, stdout, stderr io.Writer) int {
	exe, _ := os.Executable()
	exeDir := filepath.Dir(exe)
	pluginDir, ok := launch.PluginDirArg(args)
	if !ok || pluginDir == "" {
		pluginDir = os.Getenv(EnvPluginDir)
	}
	if pluginDir == "" {
		pluginDir = filepath.Join(exeDir, "plugins")
	}
	// One logger for the whole process: every component and every plugin's
	// relayed log go through it, to stderr, at --log-level.
	logger := hclog.New(&hclog.LoggerOptions{Name: "dflash_server", Output: stderr, Level: hclog.Info, IndependentLevels: true})
	// Probing plugins for the CLI starts and stops each backend once; only
	// problems are worth a line. With independent levels this copy keeps
	// its own level when --log-level is applied below.
	probeLog := logger.With()
	probeLog.SetLevel(hclog.Warn)
	cat := newCatalog(pluginDir, probeLog)

	cfg, err := launch.Parse(args, cat)
	var ue *launch.UsageError
	switch {
	case errors.Is(err, launch.ErrHelp):
		fmt.Fprint(stdout, launch.Help(cat))
		return ExitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "dflash_server: error: %s\nRun 'dflash_server --help' for usage.\n", ue.Error())
		return ExitUsage
	case err != nil:
		fmt.Fprintf(stderr, "dflash_server: error: %s\n", oneLine(err.Error()))
		return ExitError
	}
	if cfg.LogLevel != "" {
		logger.SetLevel(hclog.LevelFromString(cfg.LogLevel))
	}
	libDir := os.Getenv(EnvLibDir)
	if libDir == "" {
		libDir = filepath.Join(exeDir, "lib")
	}
	defer plugin.CleanupClients()

	s := &Server{cfg: cfg, cat: cat, logger: logger, libDir: libDir, stdout: stdout,
		progress: newProgressBoard(logger, stderr)}
	if err := s.serve(); err != nil {
		fmt.Fprintf(stderr, "dflash_server: error: %s\n", oneLine(flatten(err).Error()))
		var oe *optionsError
		if errors.As(err, &oe) {
			fmt.Fprintln(stderr, "Run 'dflash_server --help' for usage.")
			return ExitUsage
		}
		return ExitError
	}
	return ExitOK
}

// optionsError is a backend's refusal of a block's options: a usage error
// found once the backend could be asked.
type optionsError struct{ err error }

func (e *optionsError) Error() string { return e.err.Error() }
func (e *optionsError) Unwrap() error { return e.err }

// Server is one running launch.
type Server struct {
	cfg    *launch.Config
	cat    *catalog
	logger hclog.Logger
	libDir string
	stdout io.Writer

	progress *progressBoard
	state    atomic.Value // string: loading, ready, draining
	handler  atomic.Pointer[http.Handler]
	backends []*pluginhost.Backend
	policy   *pluginhost.Policy
}

func (s *Server) serve() error {
	s.state.Store("loading")
	ln, err := net.Listen("tcp", net.JoinHostPort(s.cfg.Host, strconv.Itoa(s.cfg.Port)))
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	// Until the models are loaded only liveness and readiness answer.
	loading := loadingHandler(s)
	s.handler.Store(&loading)

	reqCtx, cancelRequests := context.WithCancel(context.Background())
	defer cancelRequests()
	hs := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*s.handler.Load()).ServeHTTP(w, r) }),
		reqCtx, defaultConnLimits)
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	addr := ln.Addr().String()
	s.logger.Info("listening", "addr", "http://"+addr)

	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	loadCtx, cancelLoad := context.WithCancel(context.Background())
	defer cancelLoad()
	loaded := make(chan error, 1)
	var rt *router.Router
	var reg *metrics.Registry
	go func() {
		var err error
		rt, reg, err = s.start(loadCtx)
		loaded <- err
	}()

	select {
	case err := <-loaded:
		if err != nil {
			s.shutdownPlugins(context.Background())
			_ = hs.Close()
			return err
		}
	case sig := <-sigs:
		s.logger.Info("signal during load; stopping", "signal", sig.String())
		cancelLoad()
		<-loaded
		s.shutdownPlugins(context.Background())
		_ = hs.Close()
		return nil
	case err := <-serveErr:
		return fmt.Errorf("serve: %w", err)
	}

	h := http.Handler(api.New(api.FromRouter(rt), api.Options{
		Ready:          s.ready,
		Metrics:        reg.Handler(),
		APIKeys:        s.cfg.APIKeys,
		CORSOrigins:    s.cfg.CORSOrigins,
		Logger:         s.logger.Named("api"),
		ObserveRequest: reg.ObserveRequest,
	}))
	s.handler.Store(&h)
	s.state.Store("ready")
	s.printBanner(addr)

	var sig os.Signal
	select {
	case sig = <-sigs:
	case err := <-serveErr:
		s.shutdownPlugins(context.Background())
		return fmt.Errorf("serve: %w", err)
	}
	s.logger.Info("draining", "signal", sig.String(), "deadline", s.cfg.DrainTimeout)
	relayDone := make(chan struct{})
	defer close(relayDone)
	s.drain(hs, rt, secondSignal(sig, sigs, s.logger, relayDone), cancelRequests)
	return nil
}

// duplicateWindow is how long a repeat of the signal that started the drain
// counts as the same delivery: timeout(1) and some supervisors signal the
// server and then its process group, so one stop request arrives twice.
const duplicateWindow = time.Second

// secondSignal relays the signals after first that ask to cut the drain
// short, dropping a repeat of first within duplicateWindow, until done.
func secondSignal(first os.Signal, sigs <-chan os.Signal, log hclog.Logger, done <-chan struct{}) <-chan os.Signal {
	at := time.Now()
	out := make(chan os.Signal, 1)
	go func() {
		for {
			select {
			case <-done:
				return
			case sig := <-sigs:
				if sig == first && time.Since(at) < duplicateWindow {
					log.Debug("repeated signal ignored", "signal", sig.String())
					continue
				}
				out <- sig
				return
			}
		}
	}()
	return out
}

// drain follows the one drain path: readiness 503, refuse new work and
// release waiters with 503, let active streams finish (until the deadline or
// a second signal), then shut the plugins down and kill them.
func (s *Server) drain(hs *http.Server, rt *router.Router, sigs <-chan os.Signal, cancelRequests context.CancelFunc) {
	s.state.Store("draining")
	rt.Quiesce()
	deadline := s.cfg.DrainTimeout
	if deadline <= 0 {
		deadline = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	go func() {
		select {
		case <-sigs:
			s.logger.Warn("second signal: cancelling active requests")
			cancel()
		case <-ctx.Done():
		}
	}()
	done := make(chan struct{})
	go func() {
		_ = hs.Shutdown(ctx) // waits for active handlers, i.e. streams
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
	if ctx.Err() != nil {
		cancelRequests()
		_ = hs.Close()
		s.logger.Warn("drain deadline reached or second signal: active requests cancelled")
	}
	// Reservations end only when backends confirmed retirement.
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	_ = rt.Wait(wctx)
	wcancel()
	s.shutdownPlugins(context.Background())
	s.logger.Info("stopped")
}

func (s *Server) ready() (bool, string) {
	st, _ := s.state.Load().(string)
	return st == "ready", st
}

// start launches the policy and the backends of the blocks to load, loads
// the models in parallel and builds the router.
func (s *Server) start(ctx context.Context) (*router.Router, *metrics.Registry, error) {
	reg := metrics.New(metrics.Options{ProcessCollectors: true})
	pol, err := s.startPolicy(ctx)
	if err != nil {
		return nil, nil, err
	}
	s.policy = pol

	blocks := make([]*launch.Block, len(s.cfg.Load))
	for i, idx := range s.cfg.Load {
		blocks[i] = &s.cfg.Blocks[idx]
	}
	models := make([]*router.Model, len(blocks))
	// routerRef lets restart hooks reach the router built after loading.
	var routerRef atomic.Pointer[router.Router]
	var g multierror.Group
	var mu sync.Mutex
	for i, b := range blocks {
		g.Go(func() error {
			be, desc, err := s.loadBlock(ctx, b)
			if be != nil {
				mu.Lock()
				s.backends = append(s.backends, be)
				mu.Unlock()
			}
			if err != nil {
				return fmt.Errorf("--model #%d (%s): %w", b.Index, b.Path, err)
			}
			be.SetOnRestart(func(restarts int) {
				reg.SetBackendRestarts(b.Name, restarts)
				if rt := routerRef.Load(); rt != nil {
					rt.Wake() // waiters may use the model again at once
				}
			})
			models[i] = &router.Model{
				Name:    b.Name,
				Backend: be,
				Desc:    desc,
				Info: router.ModelInfo{
					Arch: b.Arch, Path: b.Path, Device: b.Device,
					DraftDevice: desc.DraftDevice, BackendName: b.Backend,
				},
				Health: be.Health,
			}
			return nil
		})
	}
	err = g.Wait().ErrorOrNil()
	s.progress.done()
	if err != nil {
		var oe *optionsError
		if !s.cfg.ContinueOnLoadFailure || errors.As(err, &oe) {
			return nil, nil, err
		}
		s.logger.Error("continuing without models that failed to load", "error", flatten(err))
	}
	var loaded []*router.Model
	for _, m := range models {
		if m != nil {
			loaded = append(loaded, m)
		}
	}
	if len(loaded) == 0 {
		return nil, nil, errors.New("no model loaded")
	}
	rt := router.New(router.Config{
		QueueLimit:   s.cfg.QueueLimit,
		QueueTimeout:     s.cfg.QueueTimeout,
		AdmissionTimeout: s.cfg.AdmissionTimeout,
		Policy:       pol,
		PolicyName:   s.cfg.Policy,
		// By-name routing loads every block without --load-balancing; the
		// policy must then be asked too.
		LoadBalancing: s.cfg.LoadBalancing || len(loaded) > 1,
		Metrics:       reg,
		Logger:        s.logger.Named("router"),
	}, loaded)
	routerRef.Store(rt)
	return rt, reg, nil
}

func (s *Server) startPolicy(ctx context.Context) (*pluginhost.Policy, error) {
	f, err := s.cat.file(pluginhost.KindPolicy, s.cfg.Policy)
	if err != nil {
		return nil, fmt.Errorf("--routing-policy %s: %w", s.cfg.Policy, err)
	}
	p, err := pluginhost.LaunchPolicy(ctx, f, s.pluginOptions())
	if err != nil {
		return nil, err
	}
	opts := map[string]string{}
	if s.cfg.Policy == launch.PolicyByName {
		opts["unknown-model"] = s.cfg.UnknownModel
	}
	if err := p.Configure(ctx, opts); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// pluginOptions hand the server's logger and --log-level to a plugin.
func (s *Server) pluginOptions() pluginhost.Options {
	return pluginhost.Options{Logger: s.logger, LogLevel: s.cfg.LogLevel}
}

// loadBlock starts the block's backend process and loads its model.
func (s *Server) loadBlock(ctx context.Context, b *launch.Block) (*pluginhost.Backend, sdk.ModelDescription, error) {
	f, err := s.cat.file(pluginhost.KindBackend, b.Backend)
	if err != nil {
		return nil, sdk.ModelDescription{}, err
	}
	be, err := pluginhost.LaunchBackend(ctx, f, s.pluginOptions())
	if err != nil {
		return nil, sdk.ModelDescription{}, err
	}
	mc := b.ModelConfig()
	mc.LibDir = s.libDir
	mc.MultiModel = len(s.cfg.Load) > 1
	if err := be.ValidateOptions(ctx, mc); err != nil {
		return be, sdk.ModelDescription{}, &optionsError{err}
	}
	s.logger.Info("loading model", "model", b.Name, "file", b.Path, "device", b.Device, "backend", b.Backend)
	desc, err := be.Load(ctx, mc, s.progress.reporter(b.Name))
	if err != nil {
		return be, sdk.ModelDescription{}, fmt.Errorf("load: %w", err)
	}
	s.logger.Info("model ready", "model", b.Name, "slots", desc.MaxConcurrency, "kv_pool_tokens", desc.KVPoolTokens, "max_ctx", desc.MaxCtx)
	return be, desc, nil
}

// shutdownPlugins asks every backend to free its memory, then kills the
// plugin processes.
func (s *Server) shutdownPlugins(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, b := range s.backends {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.Shutdown(ctx); err != nil {
				s.logger.Warn("backend shutdown", "plugin", b.File().Path, "error", err)
			}
		}()
	}
	wg.Wait()
	if s.policy != nil {
		s.policy.Close()
	}
}

func (s *Server) printBanner(addr string) {
	var names []string
	for _, idx := range s.cfg.Load {
		b := s.cfg.Blocks[idx]
		names = append(names, fmt.Sprintf("%s (%s on %s)", b.Name, b.Arch, b.Device))
	}
	fmt.Fprintf(s.stdout, "dflash_server ready on http://%s serving %v\n", addr, names)
	fmt.Fprintf(s.stdout, "  curl -s http://%s/v1/models\n", addr)
	fmt.Fprintf(s.stdout, "  curl -s http://%s/v1/chat/completions -H 'content-type: application/json' -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":16}'\n", addr)
}

func loadingHandler(s *Server) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/health", "/livez":
			_, _ = io.WriteString(w, `{"status":"ok"}`)
		default:
			st, _ := s.state.Load().(string)
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, `{"error":{"message":"server is %s","type":"unavailable_error","param":null,"code":"%s"}}`, st, st)
		}
	})
}

func oneLine(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			return s[:i]
		}
	}
	return s
}
