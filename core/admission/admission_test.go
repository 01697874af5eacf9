package admission_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/core/admission"
)

func newController(t *testing.T, cfg admission.Config) *admission.Controller {
	t.Helper()
	c, err := admission.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitQueued polls until the queue holds n tickets; a goroutine's Acquire
// has no other observable point at which it is queued.
func waitQueued(t *testing.T, c *admission.Controller, n int) {
	t.Helper()
	for i := 0; c.Waiting() != n; i++ {
		if i > 5000 {
			t.Fatalf("queue length %d, want %d", c.Waiting(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

type result struct {
	allowed []int
	err     error
}

// queue starts a request for cands that failed its first attempt and
// waits in the queue; its turns arrive on the returned channel.
func queue(t *testing.T, c *admission.Controller, cands ...int) (*admission.Ticket, chan result) {
	t.Helper()
	tk := c.NewTicket(cands, "test")
	ch := make(chan result, 1)
	go func() {
		allowed, err := c.Acquire(context.Background(), tk)
		if err == nil && tk.QueuedAt().IsZero() {
			// first attempt outside the queue: pretend all busy
			c.Report(tk, allowed, nil)
			allowed, err = c.Acquire(context.Background(), tk)
		}
		ch <- result{append([]int(nil), allowed...), err}
	}()
	return tk, ch
}

func TestNewValidates(t *testing.T) {
	tests := []struct {
		name string
		cfg  admission.Config
	}{
		{"zero slots", admission.Config{Slots: []int{0}}},
		{"negative limit", admission.Config{Slots: []int{1}, QueueLimit: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			_, err := admission.New(tt.cfg)
			is.True(err != nil) // bad config is refused
		})
	}
}

func TestReserveRelease(t *testing.T) {
	is := is.New(t)
	c := newController(t, admission.Config{Slots: []int{2, 1}, QueueLimit: 4})
	is.NoErr(c.Reserve(0))
	is.NoErr(c.Reserve(0))
	is.True(errors.Is(c.Reserve(0), admission.ErrBusy)) // third slot of a 2-slot model
	is.NoErr(c.Reserve(1))
	c.Release(0, true)
	is.Equal(c.InUse(0), 1)
	is.NoErr(c.Reserve(0)) // released slot is reusable
}

func TestQueueLimitZeroRefusesAtOnce(t *testing.T) {
	is := is.New(t)
	c := newController(t, admission.Config{Slots: []int{1}, QueueLimit: 0})
	tk := c.NewTicket([]int{0}, "m")
	allowed, err := c.Acquire(context.Background(), tk)
	is.NoErr(err)
	is.Equal(allowed, []int{0}) // empty queue: try at once
	c.Report(tk, []int{0}, nil)
	_, err = c.Acquire(context.Background(), tk)
	is.True(errors.Is(err, admission.ErrQueueFull)) // limit 0: no waiting
}

func TestQueueFull(t *testing.T) {
	is := is.New(t)
	c := newController(t, admission.Config{Slots: []int{1}, QueueLimit: 1})
	_, _ = queue(t, c, 0)
	waitQueued(t, c, 1)
	tk := c.NewTicket([]int{0}, "m")
	_, err := c.Acquire(context.Background(), tk)
	is.True(errors.Is(err, admission.ErrQueueFull)) // second waiter over a limit of 1
}

func TestFIFOAndNoOvertaking(t *testing.T) {
	is := is.New(t)
	c := newController(t, admission.Config{Slots: []int{1}, QueueLimit: 8, Retry: time.Hour})
	is.NoErr(c.Reserve(0)) // the running request
	var tickets []*admission.Ticket
	var turns []chan result
	for i := 0; i < 3; i++ {
		tk, ch := queue(t, c, 0)
		waitQueued(t, c, i+1)
		tickets = append(tickets, tk)
		turns = append(turns, ch)
	}
	// A newcomer while waiters want model 0 must queue, not try.
	late := c.NewTicket([]int{0}, "m")
	lateCh := make(chan result, 1)
	go func() {
		a, err := c.Acquire(context.Background(), late)
		lateCh <- result{a, err}
	}()
	waitQueued(t, c, 4)

	c.Release(0, true) // capacity back: the first waiter gets the turn
	for i := range tickets {
		r := <-turns[i]
		is.NoErr(r.err)
		is.Equal(r.allowed, []int{0}) // waiter i gets its turn in order
		select {
		case <-lateCh:
			t.Fatal("newcomer overtook a waiter")
		default:
		}
		is.NoErr(c.Reserve(0))
		c.Leave(tickets[i]) // admitted
		c.Release(0, true)
	}
	r := <-lateCh
	is.NoErr(r.err)
	is.Equal(r.allowed, []int{0}) // newcomer served last
	c.Leave(late)
	is.Equal(c.Waiting(), 0)
}

// next runs one Acquire for a queued ticket in the background.
func next(c *admission.Controller, tk *admission.Ticket) chan result {
	ch := make(chan result, 1)
	go func() {
		a, err := c.Acquire(context.Background(), tk)
		ch <- result{append([]int(nil), a...), err}
	}()
	return ch
}

func TestRoundSkipsModelsFoundBusy(t *testing.T) {
	is := is.New(t)
	c := newController(t, admission.Config{Slots: []int{1, 1}, QueueLimit: 8, Retry: time.Hour})
	t1, ch1 := queue(t, c, 0, 1)
	waitQueued(t, c, 1)
	t2, ch2 := queue(t, c, 1)
	waitQueued(t, c, 2)
	c.Retry()
	r := <-ch1
	is.Equal(r.allowed, []int{0, 1}) // first waiter may try both
	c.Report(t1, []int{0, 1}, nil)   // both busy
	select {
	case <-ch2:
		t.Fatal("model 1 was found busy by an earlier waiter this round")
	default:
	}
	// Next round: the first waiter takes model 1, the second goes on.
	ch1 = next(c, t1)
	c.Retry()
	r = <-ch1
	is.NoErr(r.err)
	is.Equal(r.allowed, []int{0, 1}) // new round: nothing blocked
	c.Leave(t1)
	r = <-ch2
	is.Equal(r.allowed, []int{1}) // round continues with the next waiter
	c.Leave(t2)
	is.Equal(c.Waiting(), 0)
}

func TestTimeoutCancelAndQuiesce(t *testing.T) {
	t.Run("timeout", func(t *testing.T) {
		is := is.New(t)
		c := newController(t, admission.Config{Slots: []int{1}, QueueLimit: 4, QueueTimeout: time.Millisecond, Retry: time.Hour})
		_, ch := queue(t, c, 0)
		r := <-ch
		is.True(errors.Is(r.err, admission.ErrQueueTimeout)) // deadline passes with no capacity
		is.Equal(c.Waiting(), 0)
	})
	t.Run("cancel", func(t *testing.T) {
		is := is.New(t)
		c := newController(t, admission.Config{Slots: []int{1}, QueueLimit: 4, Retry: time.Hour})
		tk := c.NewTicket([]int{0}, "m")
		ctx, cancel := context.WithCancel(context.Background())
		_, err := c.Acquire(ctx, tk)
		is.NoErr(err)
		c.Report(tk, []int{0}, nil)
		done := make(chan error)
		go func() { _, err := c.Acquire(ctx, tk); done <- err }()
		waitQueued(t, c, 1)
		cancel()
		is.True(errors.Is(<-done, context.Canceled))
		is.Equal(c.Waiting(), 0) // cancelled waiter left at once
	})
	t.Run("quiesce", func(t *testing.T) {
		is := is.New(t)
		c := newController(t, admission.Config{Slots: []int{1}, QueueLimit: 4, Retry: time.Hour})
		is.NoErr(c.Reserve(0))
		_, ch := queue(t, c, 0)
		waitQueued(t, c, 1)
		c.Quiesce()
		is.True(errors.Is((<-ch).err, admission.ErrShuttingDown))   // waiter refused
		is.True(errors.Is(c.Reserve(0), admission.ErrShuttingDown)) // no new reservations
		waitDone := make(chan error)
		go func() { waitDone <- c.Wait(context.Background()) }()
		select {
		case <-waitDone:
			t.Fatal("Wait returned while a reservation is held")
		default:
		}
		c.Release(0, true)
		is.NoErr(<-waitDone) // idle after the last release
	})
}

// TestAdmittedOrderIsArrivalOrder: tickets that reach the queue in any
// order are served in the order they arrived (NewTicket order).
func TestAdmittedOrderIsArrivalOrder(t *testing.T) {
	is := is.New(t)
	const n = 50
	c := newController(t, admission.Config{Slots: []int{1}, QueueLimit: n, Retry: time.Hour})
	is.NoErr(c.Reserve(0)) // busy until the test releases it
	tickets := make([]*admission.Ticket, n)
	for i := range tickets {
		tickets[i] = c.NewTicket([]int{0}, "m")
	}
	turns := make(chan int, n)
	for i, tk := range tickets { // goroutines reach the queue in any order
		go func() {
			_, err := c.Acquire(context.Background(), tk)
			if err == nil && tk.QueuedAt().IsZero() {
				if c.Reserve(0) == nil {
					t.Error("slot should be held")
				}
				c.Report(tk, []int{0}, nil)
				_, err = c.Acquire(context.Background(), tk)
			}
			if err != nil {
				t.Error(err)
				return
			}
			turns <- i
		}()
	}
	waitQueued(t, c, n)
	var got []int
	c.Release(0, true)
	for len(got) < n {
		i := <-turns
		got = append(got, i)
		is.NoErr(c.Reserve(0))
		c.Leave(tickets[i])
		c.Release(0, true)
	}
	for i := range got {
		is.Equal(got[i], i) // served in arrival order
	}
}
