package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/transport"
)

// Model states reported by Health.
const (
	StateStarting   = "starting"
	StateLoading    = "loading"
	StateReady      = "ready"
	StateRestarting = "restarting"
	StateFailed     = "failed"
	StateStopped    = "stopped"
)

// Restart policy: exponential backoff between attempts, and at most
// restartBudget restarts per restartWindow before the model stays failed.
const (
	restartBudget  = 5
	restartWindow  = 10 * time.Minute
	backoffInitial = 100 * time.Millisecond
	backoffMax     = 5 * time.Second
)

// Backend is a supervised backend plugin process serving one model block.
// It implements sdk.Backend: calls go to the current process; while the
// process is being restarted they fail with sdk.ErrUnavailable.
type Backend struct {
	file   File
	logger hclog.Logger

	mu       sync.Mutex
	proc     *process
	client   *transport.BackendClient
	info     sdk.BackendInfo
	cfg      *sdk.ModelConfig
	desc     sdk.ModelDescription
	state    string
	lastErr  error
	restarts int
	history  []time.Time
	closing  bool
	// onRestart is called after each successful restart (metrics).
	onRestart func(restarts int)
}

// SetOnRestart sets a hook called with the restart count after each
// successful restart.
func (b *Backend) SetOnRestart(f func(restarts int)) {
	b.mu.Lock()
	b.onRestart = f
	b.mu.Unlock()
}

var _ sdk.Backend = (*Backend)(nil)

// LaunchBackend starts a backend plugin and checks its Info.
func LaunchBackend(ctx context.Context, f File, logger hclog.Logger) (*Backend, error) {
	b := &Backend{file: f, logger: logger, state: StateStarting}
	proc, client, info, err := b.spawn(ctx)
	if err != nil {
		return nil, err
	}
	b.proc, b.client, b.info = proc, client, info
	return b, nil
}

func (b *Backend) spawn(ctx context.Context) (*process, *transport.BackendClient, sdk.BackendInfo, error) {
	proc, err := launch(b.file, b.logger, nil)
	if err != nil {
		return nil, nil, sdk.BackendInfo{}, err
	}
	client, ok := proc.impl.(*transport.BackendClient)
	if !ok {
		proc.kill()
		return nil, nil, sdk.BackendInfo{}, fmt.Errorf("plugin %s: not a backend plugin", b.file.Path)
	}
	info, err := client.Info(ctx)
	if err != nil {
		proc.kill()
		return nil, nil, sdk.BackendInfo{}, fmt.Errorf("plugin %s: info: %w", b.file.Path, err)
	}
	if err := checkAPIVersion(b.file, info.APIVersion); err != nil {
		proc.kill()
		return nil, nil, sdk.BackendInfo{}, err
	}
	return proc, client, info, nil
}

// File is the plugin binary this backend runs.
func (b *Backend) File() File { return b.file }

// Health reports the model's state and how often its process was restarted.
func (b *Backend) Health() (string, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state, b.restarts
}

// Description is the loaded model's description.
func (b *Backend) Description() sdk.ModelDescription {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.desc
}

// current returns the client to call, or ErrUnavailable.
func (b *Backend) current(needReady bool) (*transport.BackendClient, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.client == nil || (needReady && b.state != StateReady) {
		return nil, fmt.Errorf("%w: model is %s", sdk.ErrUnavailable, b.state)
	}
	return b.client, nil
}

func (b *Backend) Info(context.Context) (sdk.BackendInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.info, nil
}

func (b *Backend) ValidateOptions(ctx context.Context, cfg sdk.ModelConfig) error {
	c, err := b.current(false)
	if err != nil {
		return err
	}
	return c.ValidateOptions(ctx, cfg)
}

// Load loads the model and starts supervising the process.
func (b *Backend) Load(ctx context.Context, cfg sdk.ModelConfig, progress func(sdk.LoadProgress)) (sdk.ModelDescription, error) {
	b.mu.Lock()
	if b.cfg != nil {
		b.mu.Unlock()
		return sdk.ModelDescription{}, errors.New("model already loaded")
	}
	client, proc := b.client, b.proc
	b.state = StateLoading
	b.mu.Unlock()

	desc, err := client.Load(ctx, cfg, progress)
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		b.state, b.lastErr = StateFailed, err
		return sdk.ModelDescription{}, err
	}
	c := cfg
	b.cfg, b.desc, b.state = &c, desc, StateReady
	go b.watch(proc, client)
	return desc, nil
}

// watch waits for the process to exit and restarts it unless the exit was
// ours.
func (b *Backend) watch(proc *process, client *transport.BackendClient) {
	<-client.Exited()
	b.mu.Lock()
	if b.closing || b.proc != proc {
		b.mu.Unlock()
		return
	}
	b.state = StateRestarting
	b.client = nil
	b.mu.Unlock()
	proc.kill()
	b.logger.Warn("backend plugin exited; restarting", "plugin", b.file.Path)
	b.restart()
}

func (b *Backend) restart() {
	backoff := backoffInitial
	for {
		b.mu.Lock()
		if b.closing {
			b.mu.Unlock()
			return
		}
		now := time.Now()
		recent := b.history[:0]
		for _, t := range b.history {
			if now.Sub(t) < restartWindow {
				recent = append(recent, t)
			}
		}
		b.history = recent
		if len(b.history) >= restartBudget {
			b.state = StateFailed
			b.lastErr = fmt.Errorf("restart budget exhausted: %d restarts in %s", restartBudget, restartWindow)
			b.mu.Unlock()
			b.logger.Error("backend plugin failed for good", "plugin", b.file.Path, "error", b.lastErr)
			return
		}
		b.history = append(b.history, now)
		cfg := *b.cfg
		b.mu.Unlock()

		err := b.relaunch(cfg)
		if err == nil {
			return
		}
		b.logger.Warn("backend restart failed", "plugin", b.file.Path, "error", err, "retry_in", backoff)
		time.Sleep(backoff)
		backoff = min(2*backoff, backoffMax)
	}
}

func (b *Backend) relaunch(cfg sdk.ModelConfig) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	proc, client, info, err := b.spawn(ctx)
	if err != nil {
		return err
	}
	desc, err := client.Load(ctx, cfg, nil)
	if err != nil {
		proc.kill()
		return fmt.Errorf("reload %s: %w", cfg.Path, err)
	}
	b.mu.Lock()
	if b.closing {
		b.mu.Unlock()
		proc.kill()
		return nil
	}
	b.proc, b.client, b.info, b.desc = proc, client, info, desc
	b.state = StateReady
	b.restarts++
	hook, n := b.onRestart, b.restarts
	b.mu.Unlock()
	go b.watch(proc, client)
	if hook != nil {
		hook(n)
	}
	b.logger.Info("backend plugin restarted", "plugin", b.file.Path)
	return nil
}

func (b *Backend) Start(ctx context.Context, req *sdk.ChatRequest, emit sdk.Emitter) error {
	c, err := b.current(true)
	if err != nil {
		return err
	}
	return c.Start(ctx, req, emit)
}

func (b *Backend) Tokenize(ctx context.Context, text string, addSpecial bool) ([]int32, error) {
	c, err := b.current(true)
	if err != nil {
		return nil, err
	}
	return c.Tokenize(ctx, text, addSpecial)
}

func (b *Backend) Detokenize(ctx context.Context, ids []int32) (string, error) {
	c, err := b.current(true)
	if err != nil {
		return "", err
	}
	return c.Detokenize(ctx, ids)
}

func (b *Backend) CountTokens(ctx context.Context, req *sdk.ChatRequest) (int, error) {
	c, err := b.current(true)
	if err != nil {
		return 0, err
	}
	return c.CountTokens(ctx, req)
}

func (b *Backend) Stats(ctx context.Context) (sdk.ModelStats, error) {
	c, err := b.current(true)
	if err != nil {
		return sdk.ModelStats{}, err
	}
	return c.Stats(ctx)
}

// Shutdown asks the plugin to free its device memory, then kills the
// process. It is also Close: no restart follows.
func (b *Backend) Shutdown(ctx context.Context) error {
	b.mu.Lock()
	b.closing = true
	proc, client := b.proc, b.client
	b.state = StateStopped
	b.client = nil
	b.mu.Unlock()
	var err error
	if client != nil {
		err = client.Shutdown(ctx)
	}
	if proc != nil {
		proc.kill()
	}
	if errors.Is(err, sdk.ErrUnavailable) {
		err = nil // already gone: nothing left to free
	}
	return err
}

// Kill ends the process at once, without the Shutdown RPC (tests, second
// SIGTERM).
func (b *Backend) Kill() {
	b.mu.Lock()
	b.closing = true
	proc := b.proc
	b.state = StateStopped
	b.client = nil
	b.mu.Unlock()
	if proc != nil {
		proc.kill()
	}
}

// Pid is the plugin process id (tests use it to kill the process).
func (b *Backend) Pid() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.proc == nil {
		return 0
	}
	if rc := b.proc.client.ReattachConfig(); rc != nil {
		return rc.Pid
	}
	return 0
}
