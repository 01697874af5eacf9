package engine

import (
	"context"
	"sync"

	"github.com/dflash/dflash_server/sdk"
)

// outbox carries one request's events from the step loop to the request's
// own sender goroutine. put never blocks: the loop checks full() and leaves
// the sequence out of the batch while its consumer is behind, so the queue
// holds at most limit events plus one step's worth.
//
// A Whole request's outbox holds its events for the finish (or the close
// after an error): put wakes the sender only then, and the queue has no
// bound, so the sender and the plugin transport do nothing per token.
type outbox struct {
	mu     sync.Mutex
	q      []sdk.Event
	limit  int
	hold   bool
	closed bool
	// stalled is set by the loop when it paused the sequence for a full
	// outbox; the sender wakes the loop once there is room again.
	stalled bool
	ready   chan struct{} // cap 1: events or close for the sender
	wake    func()
}

func newOutbox(limit int, hold bool, wake func()) *outbox {
	return &outbox{limit: limit, hold: hold, ready: make(chan struct{}, 1), wake: wake}
}

func (o *outbox) put(ev sdk.Event) {
	o.mu.Lock()
	o.q = append(o.q, ev)
	o.mu.Unlock()
	if !o.hold || ev.Finish != nil {
		signal(o.ready)
	}
}

// full reports whether the consumer is behind; if so the loop will be woken
// when it catches up.
func (o *outbox) full() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.q) >= o.limit && !o.hold {
		o.stalled = true
		return true
	}
	return false
}

func (o *outbox) close() {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	signal(o.ready)
}

// take waits for events and returns them all; done is true when the outbox
// is closed and empty. It returns early (nil, false) when ctx is done.
func (o *outbox) take(ctx context.Context) (evs []sdk.Event, done bool) {
	for {
		o.mu.Lock()
		if len(o.q) > 0 {
			evs, o.q = o.q, nil
			wake := o.stalled
			o.stalled = false
			o.mu.Unlock()
			if wake {
				o.wake()
			}
			return evs, false
		}
		if o.closed {
			o.mu.Unlock()
			return nil, true
		}
		o.mu.Unlock()
		select {
		case <-o.ready:
		case <-ctx.Done():
			return nil, false
		}
	}
}

// signal does a non-blocking send on a cap-1 channel.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// coalesce merges queued events of a consumer that fell behind into as few
// as keep their order (an event is read as Reasoning, Text, ToolCalls), so
// a slow consumer catches up with fewer, larger messages.
func coalesce(evs []sdk.Event) []sdk.Event {
	if len(evs) < 2 {
		return evs
	}
	out := evs[:1]
	for _, ev := range evs[1:] {
		last := &out[len(out)-1]
		if !mergeable(last, &ev) {
			out = append(out, ev)
			continue
		}
		last.Reasoning += ev.Reasoning
		last.Text += ev.Text
		last.ToolCalls = append(last.ToolCalls, ev.ToolCalls...)
		last.TokenIDs = append(last.TokenIDs, ev.TokenIDs...)
		last.Logprobs = append(last.Logprobs, ev.Logprobs...)
		last.Finish = ev.Finish
	}
	return out
}

func mergeable(a, b *sdk.Event) bool {
	switch {
	case a.Finish != nil:
		return false
	case b.Reasoning != "" && (a.Text != "" || len(a.ToolCalls) > 0):
		return false
	case b.Text != "" && len(a.ToolCalls) > 0:
		return false
	}
	return true
}
