package pluginhost

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/core/health"
)

// fakeClient stands in for a host adapter: closing exited is the process
// dying.
type fakeClient struct{ exited chan struct{} }

func (f *fakeClient) Exited() <-chan struct{} { return f.exited }

func newFake() *fakeClient { return &fakeClient{exited: make(chan struct{})} }

// fakeSupervisor runs a supervisor over processes made by next (called for
// every launch, counting from 1) and prepared by prepare.
func fakeSupervisor(t *testing.T, p RestartPolicy, next func(n int) (*fakeClient, error), prepare func(ctx context.Context, restart bool) error) (*supervisor[*fakeClient], *atomic.Int32) {
	t.Helper()
	var launches atomic.Int32
	s := newSupervisor(File{Kind: KindPolicy, Name: "fake", Path: "/plugins/dflash-policy-fake"}, "policy", Options{Restart: p},
		PolicyRestart, func(ctx context.Context, _ *fakeClient, restart bool) error { return prepare(ctx, restart) })
	s.launch = func() (*process, error) {
		c, err := next(int(launches.Add(1)))
		if err != nil {
			return nil, err
		}
		return &process{impl: c}, nil
	}
	t.Cleanup(func() { _ = s.stop(context.Background(), nil) })
	return s, &launches
}

func noPrepare(context.Context, bool) error { return nil }

// TestStopInterruptsBackoff: a plugin that keeps failing to restart waits
// between attempts; stopping the server must not wait out that back-off
// (issue 14 item 6: back-offs used time.Sleep).
func TestStopInterruptsBackoff(t *testing.T) {
	is := is.New(t)
	first := newFake()
	s, launches := fakeSupervisor(t,
		RestartPolicy{Budget: 100, Window: time.Hour, BackoffInitial: time.Hour, BackoffMax: time.Hour, AttemptTimeout: time.Hour},
		func(n int) (*fakeClient, error) {
			if n == 1 {
				return first, nil
			}
			return nil, errors.New("binary vanished")
		}, noPrepare)
	is.NoErr(s.start(context.Background()))
	s.serve()
	close(first.exited)
	waitCond(t, "a failed restart attempt", func() bool { return launches.Load() == 2 })

	stopped := make(chan struct{})
	go func() {
		_ = s.stop(context.Background(), nil) // waits for the restart loop
		close(stopped)
	}()
	waitCond(t, "stop to end the back-off", func() bool {
		select {
		case <-stopped:
			return true
		default:
			return false
		}
	})
	st, _ := s.health()
	is.Equal(st, health.Stopped)
	is.Equal(launches.Load(), int32(2)) // no attempt after stop
}

// TestRestartAttemptHasDeadline: a restarted process whose Info hangs must
// fail the attempt at the policy's deadline and count against the budget
// (issue 14 item 6: the policy's Info after a restart had no deadline).
func TestRestartAttemptHasDeadline(t *testing.T) {
	is := is.New(t)
	first := newFake()
	var mu sync.Mutex
	var attemptErrs []error
	s, _ := fakeSupervisor(t,
		RestartPolicy{Budget: 2, Window: time.Hour, BackoffInitial: time.Nanosecond, BackoffMax: time.Nanosecond, AttemptTimeout: time.Millisecond},
		func(n int) (*fakeClient, error) {
			if n == 1 {
				return first, nil
			}
			return newFake(), nil
		},
		func(ctx context.Context, restart bool) error {
			if !restart {
				return nil
			}
			<-ctx.Done() // a hung Info
			mu.Lock()
			attemptErrs = append(attemptErrs, ctx.Err())
			mu.Unlock()
			return ctx.Err()
		})
	is.NoErr(s.start(context.Background()))
	s.serve()
	close(first.exited)
	waitCond(t, "the budget to be spent on hung attempts", func() bool { st, _ := s.health(); return st == health.Failed })
	mu.Lock()
	defer mu.Unlock()
	is.Equal(len(attemptErrs), 2) // both budgeted attempts ran and ended
	for _, err := range attemptErrs {
		is.True(errors.Is(err, context.DeadlineExceeded)) // ended by the attempt deadline
	}
	_, err := s.current(false)
	is.True(err != nil) // a failed plugin serves nothing
}

// TestStateTransitions: states only move along the allowed edges; in
// particular nothing brings a stopped plugin back.
func TestStateTransitions(t *testing.T) {
	tests := []struct {
		from, to health.State
		ok       bool
	}{
		{health.Starting, health.Loading, true},
		{health.Starting, health.Ready, true},
		{health.Loading, health.Failed, true},
		{health.Ready, health.Restarting, true},
		{health.Restarting, health.Ready, true},
		{health.Restarting, health.Failed, true},
		{health.Failed, health.Stopped, true},
		{health.Stopped, health.Ready, false},
		{health.Stopped, health.Restarting, false},
		{health.Failed, health.Ready, false},
		{health.Ready, health.Loading, false},
	}
	for _, tt := range tests {
		t.Run(string(tt.from)+"→"+string(tt.to), func(t *testing.T) {
			is := is.New(t)
			s, _ := fakeSupervisor(t, PolicyRestart, func(int) (*fakeClient, error) { return newFake(), nil }, noPrepare)
			s.state = tt.from
			is.Equal(s.setState(tt.to, nil), tt.ok)
			st, _ := s.health()
			if tt.ok {
				is.Equal(st, tt.to)
			} else {
				is.Equal(st, tt.from) // refused: unchanged
			}
		})
	}
}

// waitCond polls cond; the bound only stops a broken run from hanging.
func waitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 3000 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: not reached within 30s", what)
}
