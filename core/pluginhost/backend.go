package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/dflash/dflash_server/core/health"
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/transport"
)

// Backend is a supervised backend plugin process serving one model block.
// It implements sdk.Backend: calls go to the current process; while the
// process is being restarted they fail with sdk.ErrUnavailable.
type Backend struct {
	sup *supervisor[*transport.BackendClient]

	mu   sync.Mutex
	info sdk.BackendInfo
	cfg  *sdk.ModelConfig // set by Load; a restart reloads it
	desc sdk.ModelDescription
}

var _ sdk.Backend = (*Backend)(nil)

// LaunchBackend starts a backend plugin and checks its Info.
func LaunchBackend(ctx context.Context, f File, o Options) (*Backend, error) {
	b := &Backend{}
	b.sup = newSupervisor(f, "backend", o, BackendRestart, b.prepare)
	if err := b.sup.start(ctx); err != nil {
		return nil, err
	}
	return b, nil
}

// prepare checks a fresh process and, on a restart, reloads the model.
func (b *Backend) prepare(ctx context.Context, c *transport.BackendClient, restart bool) error {
	f := b.sup.file
	info, err := c.Info(ctx)
	if err != nil {
		return fmt.Errorf("plugin %s: info: %w", f.Path, err)
	}
	if err := checkAPIVersion(f, info.APIVersion); err != nil {
		return err
	}
	var desc sdk.ModelDescription
	if restart {
		b.mu.Lock()
		cfg := *b.cfg
		b.mu.Unlock()
		if desc, err = c.Load(ctx, cfg, nil); err != nil {
			return fmt.Errorf("reload %s: %w", cfg.Path, err)
		}
	}
	b.mu.Lock()
	b.info = info
	if restart {
		b.desc = desc
	}
	b.mu.Unlock()
	return nil
}

// SetOnRestart sets a hook called with the restart count after each
// successful restart.
func (b *Backend) SetOnRestart(f func(restarts int)) {
	b.sup.mu.Lock()
	b.sup.onRestart = f
	b.sup.mu.Unlock()
}

// File is the plugin binary this backend runs.
func (b *Backend) File() File { return b.sup.file }

// Health reports the model's state and how often its process was restarted.
func (b *Backend) Health() (health.State, int) { return b.sup.health() }

// Description is the loaded model's description.
func (b *Backend) Description() sdk.ModelDescription {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.desc
}

func (b *Backend) Info(context.Context) (sdk.BackendInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.info, nil
}

func (b *Backend) ValidateOptions(ctx context.Context, cfg sdk.ModelConfig) error {
	c, err := b.sup.current(false)
	if err != nil {
		return err
	}
	return c.ValidateOptions(ctx, cfg)
}

// Load loads the model and starts supervising the process.
func (b *Backend) Load(ctx context.Context, cfg sdk.ModelConfig, progress func(sdk.LoadProgress)) (sdk.ModelDescription, error) {
	b.mu.Lock()
	loaded := b.cfg != nil
	b.mu.Unlock()
	if loaded {
		return sdk.ModelDescription{}, errors.New("model already loaded")
	}
	c, err := b.sup.current(false)
	if err != nil {
		return sdk.ModelDescription{}, err
	}
	if !b.sup.setState(health.Loading, nil) {
		return sdk.ModelDescription{}, fmt.Errorf("%w: backend %s is stopped", sdk.ErrUnavailable, b.sup.file.Name)
	}
	desc, err := c.Load(ctx, cfg, progress)
	if err != nil {
		b.sup.setState(health.Failed, err)
		return sdk.ModelDescription{}, err
	}
	b.mu.Lock()
	b.cfg, b.desc = &cfg, desc
	b.mu.Unlock()
	b.sup.serve()
	return desc, nil
}

func (b *Backend) Start(ctx context.Context, req *sdk.ChatRequest, emit sdk.Emitter) error {
	c, err := b.sup.current(true)
	if err != nil {
		return err
	}
	return c.Start(ctx, req, emit)
}

func (b *Backend) Tokenize(ctx context.Context, text string, addSpecial bool) ([]int32, error) {
	c, err := b.sup.current(true)
	if err != nil {
		return nil, err
	}
	return c.Tokenize(ctx, text, addSpecial)
}

func (b *Backend) Detokenize(ctx context.Context, ids []int32) (string, error) {
	c, err := b.sup.current(true)
	if err != nil {
		return "", err
	}
	return c.Detokenize(ctx, ids)
}

func (b *Backend) CountTokens(ctx context.Context, req *sdk.ChatRequest) (int, error) {
	c, err := b.sup.current(true)
	if err != nil {
		return 0, err
	}
	return c.CountTokens(ctx, req)
}

func (b *Backend) Stats(ctx context.Context) (sdk.ModelStats, error) {
	c, err := b.sup.current(true)
	if err != nil {
		return sdk.ModelStats{}, err
	}
	return c.Stats(ctx)
}

// Shutdown asks the plugin to free its device memory, then kills the
// process. It is also Close: no restart follows, and a restart in progress
// is abandoned.
func (b *Backend) Shutdown(ctx context.Context) error {
	err := b.sup.stop(ctx, func(ctx context.Context, c *transport.BackendClient) error { return c.Shutdown(ctx) })
	if errors.Is(err, sdk.ErrUnavailable) {
		err = nil // already gone: nothing left to free
	}
	return err
}

// Kill ends the process at once, without the Shutdown RPC (tests, second
// SIGTERM).
func (b *Backend) Kill() { _ = b.sup.stop(context.Background(), nil) }

// Pid is the plugin process id (tests use it to kill the process).
func (b *Backend) Pid() int { return b.sup.pid() }
