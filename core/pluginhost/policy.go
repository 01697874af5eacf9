package pluginhost

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/transport"
)

// Policy is a supervised policy plugin. While its process is restarting,
// Order fails with sdk.ErrUnavailable and the router uses the configured
// block order instead.
type Policy struct {
	file   File
	logger hclog.Logger

	mu       sync.Mutex
	proc     *process
	client   *transport.PolicyClient
	info     sdk.PolicyInfo
	opts     map[string]string
	restarts int
	closing  bool
}

var _ sdk.Policy = (*Policy)(nil)

func (p *Policy) start(ctx context.Context) error {
	proc, err := launch(p.file, p.logger, nil)
	if err != nil {
		return err
	}
	client, ok := proc.impl.(*transport.PolicyClient)
	if !ok {
		proc.kill()
		return fmt.Errorf("plugin %s: not a policy plugin", p.file.Path)
	}
	info, err := client.Info(ctx)
	if err != nil {
		proc.kill()
		return fmt.Errorf("plugin %s: info: %w", p.file.Path, err)
	}
	if err := checkAPIVersion(p.file, info.APIVersion); err != nil {
		proc.kill()
		return err
	}
	p.mu.Lock()
	opts := p.opts
	p.mu.Unlock()
	if opts != nil {
		if err := client.Configure(ctx, opts); err != nil {
			proc.kill()
			return fmt.Errorf("plugin %s: configure: %w", p.file.Path, err)
		}
	}
	p.mu.Lock()
	p.proc, p.client, p.info = proc, client, info
	p.mu.Unlock()
	go p.watch(proc, client)
	return nil
}

func (p *Policy) watch(proc *process, client *transport.PolicyClient) {
	<-client.Exited()
	p.mu.Lock()
	if p.closing || p.proc != proc {
		p.mu.Unlock()
		return
	}
	p.client = nil
	p.mu.Unlock()
	proc.kill()
	p.logger.Warn("policy plugin exited; restarting", "plugin", p.file.Path)
	backoff := backoffInitial
	for {
		p.mu.Lock()
		closing := p.closing
		p.mu.Unlock()
		if closing {
			return
		}
		err := p.start(context.Background())
		if err == nil {
			p.mu.Lock()
			p.restarts++
			p.mu.Unlock()
			return
		}
		p.logger.Warn("policy restart failed", "plugin", p.file.Path, "error", err)
		time.Sleep(backoff)
		backoff = min(2*backoff, backoffMax)
	}
}

// Restarts counts restarts of the policy process.
func (p *Policy) Restarts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restarts
}

func (p *Policy) current() (*transport.PolicyClient, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.client == nil {
		return nil, fmt.Errorf("%w: policy %s is restarting", sdk.ErrUnavailable, p.file.Name)
	}
	return p.client, nil
}

func (p *Policy) Info(context.Context) (sdk.PolicyInfo, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.info, nil
}

// Configure passes options and remembers them for restarts.
func (p *Policy) Configure(ctx context.Context, opts map[string]string) error {
	c, err := p.current()
	if err != nil {
		return err
	}
	if err := c.Configure(ctx, opts); err != nil {
		return fmt.Errorf("policy %s: %w", p.file.Name, err)
	}
	p.mu.Lock()
	p.opts = opts
	p.mu.Unlock()
	return nil
}

func (p *Policy) Order(ctx context.Context, snap sdk.Snapshot) (sdk.Decision, error) {
	c, err := p.current()
	if err != nil {
		return sdk.Decision{}, err
	}
	return c.Order(ctx, snap)
}

// Close kills the policy process; no restart follows.
func (p *Policy) Close() {
	p.mu.Lock()
	p.closing = true
	proc := p.proc
	p.client = nil
	p.mu.Unlock()
	if proc != nil {
		proc.kill()
	}
}

// Pid is the plugin process id (tests use it to kill the process).
func (p *Policy) Pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.proc == nil {
		return 0
	}
	if rc := p.proc.client.ReattachConfig(); rc != nil {
		return rc.Pid
	}
	return 0
}
