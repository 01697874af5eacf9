package pluginhost

import (
	"context"
	"fmt"
	"maps"
	"sync"

	"github.com/dflash/dflash_server/core/health"
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/transport"
)

// Policy is a supervised policy plugin. While its process is restarting (or
// after its restart budget is spent), Order fails with sdk.ErrUnavailable
// and the router uses the configured block order instead.
type Policy struct {
	sup *supervisor[*transport.PolicyClient]

	mu   sync.Mutex
	info sdk.PolicyInfo
	opts map[string]string // set by Configure; a restart configures again
}

var _ sdk.Policy = (*Policy)(nil)

// LaunchPolicy starts a policy plugin, checks its Info and supervises it.
func LaunchPolicy(ctx context.Context, f File, o Options) (*Policy, error) {
	p := &Policy{}
	p.sup = newSupervisor(f, "policy", o, PolicyRestart, p.prepare)
	if err := p.sup.start(ctx); err != nil {
		return nil, err
	}
	p.sup.serve()
	return p, nil
}

// prepare checks a fresh process and, on a restart, passes the options
// again. ctx carries the restart policy's deadline on restarts.
func (p *Policy) prepare(ctx context.Context, c *transport.PolicyClient, _ bool) error {
	f := p.sup.file
	info, err := c.Info(ctx)
	if err != nil {
		return fmt.Errorf("plugin %s: info: %w", f.Path, err)
	}
	if err := checkAPIVersion(f, info.APIVersion); err != nil {
		return err
	}
	p.mu.Lock()
	opts := p.opts
	p.mu.Unlock()
	if opts != nil {
		if err := c.Configure(ctx, opts); err != nil {
			return fmt.Errorf("plugin %s: configure: %w", f.Path, err)
		}
	}
	p.mu.Lock()
	p.info = info
	p.mu.Unlock()
	return nil
}

// Health reports the policy's state and how often its process was
// restarted.
func (p *Policy) Health() (health.State, int) { return p.sup.health() }

// Restarts counts restarts of the policy process.
func (p *Policy) Restarts() int {
	_, n := p.sup.health()
	return n
}

func (p *Policy) Info(context.Context) (sdk.PolicyInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.info, nil
}

// Configure passes options and remembers them for restarts.
func (p *Policy) Configure(ctx context.Context, opts map[string]string) error {
	c, err := p.sup.current(false)
	if err != nil {
		return err
	}
	if err := c.Configure(ctx, opts); err != nil {
		return fmt.Errorf("policy %s: %w", p.sup.file.Name, err)
	}
	p.mu.Lock()
	p.opts = maps.Clone(opts)
	p.mu.Unlock()
	return nil
}

func (p *Policy) Order(ctx context.Context, snap sdk.Snapshot) (sdk.Decision, error) {
	c, err := p.sup.current(false)
	if err != nil {
		return sdk.Decision{}, err
	}
	return c.Order(ctx, snap)
}

// Close kills the policy process; no restart follows, and a restart or
// back-off in progress is abandoned.
func (p *Policy) Close() { _ = p.sup.stop(context.Background(), nil) }

// Pid is the plugin process id (tests use it to kill the process).
func (p *Policy) Pid() int { return p.sup.pid() }
