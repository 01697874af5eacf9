package pluginhost

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dflash/dflash_server/core/health"
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/transport"
)

// RestartPolicy says how a plugin process that died is replaced.
type RestartPolicy struct {
	// Budget is how many restart attempts Window allows; when it is spent
	// the plugin stays failed.
	Budget int
	Window time.Duration
	// BackoffInitial is the pause after the first failed attempt; it
	// doubles after each further failure up to BackoffMax.
	BackoffInitial time.Duration
	BackoffMax     time.Duration
	// AttemptTimeout bounds one attempt: launch, Info and restoring the
	// plugin's state (a backend's model load, a policy's options).
	AttemptTimeout time.Duration
}

// BackendRestart is the default for backends: an attempt includes
// reloading the model, which may take minutes.
var BackendRestart = RestartPolicy{
	Budget: 5, Window: 10 * time.Minute,
	BackoffInitial: 100 * time.Millisecond, BackoffMax: 5 * time.Second,
	AttemptTimeout: 10 * time.Minute,
}

// PolicyRestart is the default for the policy plugin, which has nothing
// heavy to restore: a hung Info fails the attempt quickly.
var PolicyRestart = RestartPolicy{
	Budget: 5, Window: 10 * time.Minute,
	BackoffInitial: 100 * time.Millisecond, BackoffMax: 5 * time.Second,
	AttemptTimeout: 30 * time.Second,
}

// Options configure a supervised plugin.
type Options struct {
	// Logger receives the host's lines about the plugin and the plugin's
	// own relayed log; nil discards them.
	Logger hclog.Logger
	// LogLevel is passed to the plugin process (DFLASH_LOG_LEVEL) so it
	// logs at the server's level; empty leaves the plugin's default.
	LogLevel string
	// Restart replaces the kind's default restart policy when Budget > 0.
	Restart RestartPolicy
}

func (o Options) logger() hclog.Logger {
	if o.Logger == nil {
		return hclog.NewNullLogger()
	}
	return o.Logger
}

func (o Options) env() []string {
	if o.LogLevel == "" {
		return nil
	}
	return []string{transport.EnvLogLevel + "=" + o.LogLevel}
}

func (o Options) restart(def RestartPolicy) RestartPolicy {
	if o.Restart.Budget > 0 {
		return o.Restart
	}
	return def
}

// transitions lists the states each state may move to. Anything else is a
// bug in the supervisor and is refused (and logged), so a late watcher or
// restart can never resurrect a stopped plugin.
var transitions = map[health.State][]health.State{
	health.Starting:   {health.Loading, health.Ready, health.Stopped},
	health.Loading:    {health.Ready, health.Failed, health.Stopped},
	health.Ready:      {health.Restarting, health.Stopped},
	health.Restarting: {health.Ready, health.Failed, health.Stopped},
	health.Failed:     {health.Stopped},
	health.Stopped:    nil,
}

// pluginClient is what the supervisor needs of a host adapter.
type pluginClient interface {
	// Exited is closed when the plugin process has gone.
	Exited() <-chan struct{}
}

// instance is one running process and its host adapter.
type instance[C pluginClient] struct {
	proc   *process
	client C
}

// supervisor owns the life of one plugin: the current process, its state,
// and the restart of a process that died. It is shared by Backend and
// Policy, which add their kind's calls on top.
type supervisor[C pluginClient] struct {
	file    File
	kind    string
	log     hclog.Logger
	policy  RestartPolicy
	launch  func() (*process, error)
	prepare func(ctx context.Context, c C, restart bool) error

	// ctx ends with stop: it interrupts back-offs and restart attempts.
	ctx    context.Context
	cancel context.CancelFunc
	loops  sync.WaitGroup

	mu        sync.Mutex
	state     health.State
	cur       instance[C]
	running   bool // cur holds a process
	restarts  int
	attempts  []time.Time
	lastErr   error
	onRestart func(restarts int)
}

func newSupervisor[C pluginClient](f File, kind string, o Options, def RestartPolicy, prepare func(context.Context, C, bool) error) *supervisor[C] {
	ctx, cancel := context.WithCancel(context.Background())
	log := o.logger()
	env := o.env()
	return &supervisor[C]{
		file: f, kind: kind, log: log, policy: o.restart(def), prepare: prepare,
		launch: func() (*process, error) { return launch(f, log, env) },
		ctx:    ctx, cancel: cancel, state: health.Starting,
	}
}

// spawn is the one way a process comes to life: launch it, check it is the
// right kind, and let the kind prepare it (Info, version, restored state).
func (s *supervisor[C]) spawn(ctx context.Context, restart bool) (instance[C], error) {
	proc, err := s.launch()
	if err != nil {
		return instance[C]{}, err
	}
	c, ok := proc.impl.(C)
	if !ok {
		proc.kill()
		return instance[C]{}, fmt.Errorf("plugin %s: not a %s plugin", s.file.Path, s.kind)
	}
	if err := s.prepare(ctx, c, restart); err != nil {
		proc.kill()
		return instance[C]{}, err
	}
	return instance[C]{proc: proc, client: c}, nil
}

// start spawns the first process; the state stays Starting until serve.
func (s *supervisor[C]) start(ctx context.Context) error {
	inst, err := s.spawn(ctx, false)
	if err != nil {
		s.cancel() // nothing to supervise
		return err
	}
	s.mu.Lock()
	s.cur, s.running = inst, true
	s.mu.Unlock()
	return nil
}

// to moves to state next if that transition is allowed. Callers hold mu.
func (s *supervisor[C]) to(next health.State) bool {
	if !slices.Contains(transitions[s.state], next) {
		if s.state != health.Stopped {
			s.log.Error("refused plugin state change", "plugin", s.file.Path, "from", s.state, "to", next)
		}
		return false
	}
	s.state = next
	return true
}

// setState moves to next (see to) and records err as the reason.
func (s *supervisor[C]) setState(next health.State, err error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.to(next) {
		return false
	}
	if err != nil {
		s.lastErr = err
	}
	return true
}

// serve marks the current process ready and starts watching it.
func (s *supervisor[C]) serve() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.to(health.Ready) {
		return
	}
	s.watch(s.cur)
}

// watch restarts inst when its process dies, unless the plugin was stopped
// or already moved on. Callers hold mu.
func (s *supervisor[C]) watch(inst instance[C]) {
	s.loops.Add(1)
	go func() {
		defer s.loops.Done()
		select {
		case <-inst.client.Exited():
		case <-s.ctx.Done():
			return
		}
		s.mu.Lock()
		if !s.running || s.cur.proc != inst.proc || !s.to(health.Restarting) {
			s.mu.Unlock()
			return
		}
		s.cur, s.running = instance[C]{}, false
		s.mu.Unlock()
		inst.proc.kill()
		s.log.Warn(s.kind+" plugin exited; restarting", "plugin", s.file.Path)
		s.restart()
	}()
}

// restart starts fresh processes until one is ready, the budget is spent
// or the plugin is stopped.
func (s *supervisor[C]) restart() {
	backoff := s.policy.BackoffInitial
	for {
		if !s.takeAttempt() {
			return
		}
		err := s.attempt()
		if err == nil || s.ctx.Err() != nil {
			return
		}
		s.log.Warn(s.kind+" restart failed", "plugin", s.file.Path, "error", err, "retry_in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, s.policy.BackoffMax)
	}
}

// takeAttempt charges one attempt to the budget, or marks the plugin failed
// when the budget of the window is spent.
func (s *supervisor[C]) takeAttempt() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != health.Restarting {
		return false
	}
	now := time.Now()
	s.attempts = slices.DeleteFunc(s.attempts, func(t time.Time) bool { return now.Sub(t) >= s.policy.Window })
	if len(s.attempts) >= s.policy.Budget {
		s.to(health.Failed)
		s.lastErr = fmt.Errorf("restart budget exhausted: %d restarts in %s", s.policy.Budget, s.policy.Window)
		s.log.Error(s.kind+" plugin failed for good", "plugin", s.file.Path, "error", s.lastErr)
		return false
	}
	s.attempts = append(s.attempts, now)
	return true
}

// attempt runs one restart under the policy's deadline and installs the new
// process, unless the plugin was stopped meanwhile.
func (s *supervisor[C]) attempt() error {
	ctx, cancel := context.WithTimeout(s.ctx, s.policy.AttemptTimeout)
	defer cancel()
	inst, err := s.spawn(ctx, true)
	if err != nil {
		s.mu.Lock()
		s.lastErr = err
		s.mu.Unlock()
		return err
	}
	s.mu.Lock()
	if !s.to(health.Ready) {
		s.mu.Unlock()
		inst.proc.kill()
		return nil
	}
	s.cur, s.running = inst, true
	s.restarts++
	hook, n := s.onRestart, s.restarts
	s.watch(inst)
	s.mu.Unlock()
	if hook != nil {
		hook(n)
	}
	s.log.Info(s.kind+" plugin restarted", "plugin", s.file.Path)
	return nil
}

// current returns the adapter to call, or sdk.ErrUnavailable while there is
// no process (or, with needReady, while the plugin is not ready).
func (s *supervisor[C]) current(needReady bool) (C, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running || (needReady && s.state != health.Ready) {
		var zero C
		return zero, fmt.Errorf("%w: %s is %s", sdk.ErrUnavailable, s.subject(), s.state)
	}
	return s.cur.client, nil
}

// subject names what callers see as unavailable: for a backend its model.
func (s *supervisor[C]) subject() string {
	if s.kind == "backend" {
		return "model"
	}
	return s.kind + " " + s.file.Name
}

// health reports the state and the number of successful restarts.
func (s *supervisor[C]) health() (health.State, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state, s.restarts
}

// stop ends supervision: no restart follows, a back-off or restart attempt
// in progress is interrupted, and the process is shut down (when shutdown
// is given) and killed. It waits, within ctx, for the watcher and restart
// loop to end. It is idempotent.
func (s *supervisor[C]) stop(ctx context.Context, shutdown func(context.Context, C) error) error {
	s.mu.Lock()
	s.to(health.Stopped)
	inst, running := s.cur, s.running
	s.cur, s.running = instance[C]{}, false
	s.mu.Unlock()
	s.cancel()
	var err error
	if running {
		if shutdown != nil {
			err = shutdown(ctx, inst.client)
		}
		inst.proc.kill()
	}
	done := make(chan struct{})
	go func() {
		s.loops.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return err
}

// pid is the current process id, 0 when there is none.
func (s *supervisor[C]) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running {
		return 0
	}
	return s.cur.proc.pid()
}
