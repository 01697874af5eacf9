package admission

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Sentinel errors callers branch on.
var (
	// ErrBusy: the model has no free reservation slot.
	ErrBusy = errors.New("no free slot")
	// ErrQueueFull: every candidate is busy and the queue is at its limit
	// (always, with a limit of 0).
	ErrQueueFull = errors.New("routing queue is full")
	// ErrQueueTimeout: the request waited longer than the queue timeout.
	ErrQueueTimeout = errors.New("timed out waiting in the routing queue")
	// ErrShuttingDown: Quiesce was called.
	ErrShuttingDown = errors.New("server is shutting down")
)

// DefaultRetry is how often waiters retry when no capacity was released.
const DefaultRetry = 250 * time.Millisecond

// Config sets up a Controller.
type Config struct {
	// Slots is the number of reservation slots of each model, by index.
	Slots []int
	// QueueLimit bounds the waiting requests; 0 refuses at once.
	QueueLimit int
	// QueueTimeout bounds the time a request may wait; 0 means no bound.
	QueueTimeout time.Duration
	// Retry is the period of the retry round while requests wait;
	// 0 means DefaultRetry.
	Retry time.Duration
	// OnQueue, when set, is called with a ticket's label and +1 or -1 as
	// it enters or leaves the queue. It runs under the controller's lock
	// and must not call back into the Controller.
	OnQueue func(label string, delta int)
}

type ledger struct {
	slots int
	inUse int
	// want counts queued tickets that list this model.
	want int
	// refused is set when Reserve said ErrBusy since the last release, so
	// that a release after a failed attempt still wakes waiters that the
	// attempt's borrowed slot turned away.
	refused bool
}

// Controller is the ledger and the queue. Invariants, under mu:
//   - models[m].inUse is the number of reservations on m; total their sum.
//   - models[m].want is the number of queued tickets whose candidates
//     include m.
//   - the queue list holds exactly the tickets in stQueued or stTurn, in
//     seq (arrival) order; waiting is its length.
//   - round.holder is the only ticket in stTurn; a round is in progress
//     exactly while it is set.
type Controller struct {
	mu      sync.Mutex
	models  []ledger
	limit   int
	timeout time.Duration
	retry   time.Duration
	onQueue func(string, int)

	seq        uint64
	head, tail *Ticket
	waiting    int
	total      int
	closed     bool
	// releases counts releases that may have freed capacity; a request
	// that failed its first attempt enqueues with a retry round when it
	// changed meanwhile (no lost wakeups).
	releases uint64
	idle     []chan struct{}

	round struct {
		holder  *Ticket
		resume  *Ticket
		pending bool
		blocked []bool
	}
	tick      *time.Timer
	tickArmed bool
}

// New returns a Controller for len(cfg.Slots) models.
func New(cfg Config) (*Controller, error) {
	c := &Controller{
		models:  make([]ledger, len(cfg.Slots)),
		limit:   cfg.QueueLimit,
		timeout: cfg.QueueTimeout,
		retry:   cfg.Retry,
		onQueue: cfg.OnQueue,
	}
	for m, n := range cfg.Slots {
		if n < 1 {
			return nil, fmt.Errorf("model %d: slots %d: need at least 1", m, n)
		}
		c.models[m].slots = n
	}
	if c.limit < 0 {
		return nil, fmt.Errorf("queue limit %d: must not be negative", c.limit)
	}
	if c.retry <= 0 {
		c.retry = DefaultRetry
	}
	c.round.blocked = make([]bool, len(cfg.Slots))
	return c, nil
}

type state uint8

const (
	stNew    state = iota // not yet attempted
	stFree                // attempting without being queued
	stQueued              // in the queue, waiting for a turn
	stTurn                // in the queue, attempting on its turn
	stDone                // admitted, abandoned or refused
)

// Ticket is one request's place in admission. It is used by one goroutine
// at a time: Acquire, then Report or Leave, in a loop.
type Ticket struct {
	seq      uint64
	cands    []int
	allowed  []int
	label    string
	state    state
	err      error
	wake     chan struct{}
	prev     *Ticket
	next     *Ticket
	queuedAt time.Time
	timer    *time.Timer
	releases uint64
}

// NewTicket returns a ticket for a request that may use the models cands,
// most preferred first; the ticket takes ownership of cands. Arrival order
// is the order of NewTicket calls. label names the ticket in OnQueue.
func (c *Controller) NewTicket(cands []int, label string) *Ticket {
	c.mu.Lock()
	c.seq++
	seq := c.seq
	c.mu.Unlock()
	valid := cands[:0]
	for _, m := range cands {
		if m >= 0 && m < len(c.models) {
			valid = append(valid, m)
		}
	}
	return &Ticket{
		seq:     seq,
		cands:   valid,
		allowed: make([]int, 0, len(valid)),
		label:   label,
		wake:    make(chan struct{}, 1),
	}
}

// QueuedAt is when the ticket entered the queue; zero if it never did.
func (t *Ticket) QueuedAt() time.Time { return t.queuedAt }

// Acquire returns the candidates the caller may try now, in preference
// order. On a ticket's first call they are those that no queued request
// wants; when there are none, and on every later call, the ticket waits in
// the queue for its turn. It fails with ErrQueueFull, ErrQueueTimeout,
// ErrShuttingDown or ctx's error; the ticket is then done.
//
// The returned slice is valid until the next call with this ticket.
func (c *Controller) Acquire(ctx context.Context, t *Ticket) ([]int, error) {
	c.mu.Lock()
	if t.state == stDone {
		err := t.err
		c.mu.Unlock()
		return nil, err
	}
	if c.closed {
		c.leaveLocked(t, ErrShuttingDown)
		c.mu.Unlock()
		return nil, ErrShuttingDown
	}
	switch t.state {
	case stNew:
		t.allowed = t.allowed[:0]
		for _, m := range t.cands {
			if c.models[m].want == 0 {
				t.allowed = append(t.allowed, m)
			}
		}
		if len(t.allowed) > 0 {
			t.state = stFree
			t.releases = c.releases
			c.mu.Unlock()
			return t.allowed, nil
		}
		// Every candidate is wanted by an earlier waiter: queue behind it.
		if err := c.enqueueLocked(t, false); err != nil {
			c.mu.Unlock()
			return nil, err
		}
	case stFree:
		if err := c.enqueueLocked(t, true); err != nil {
			c.mu.Unlock()
			return nil, err
		}
	case stTurn:
		// Acquire again without Report: give the same turn back.
		c.mu.Unlock()
		return t.allowed, nil
	}
	c.mu.Unlock()
	return c.wait(ctx, t)
}

// WouldQueue reports whether a fresh ticket's first Acquire would queue it
// without an attempt, because earlier waiters want all its candidates. It
// is a hint (the queue may change before Acquire); the router uses it to
// check cheaply that a request can fit at all before it waits.
func (c *Controller) WouldQueue(t *Ticket) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.state != stNew {
		return false
	}
	for _, m := range t.cands {
		if c.models[m].want == 0 {
			return false
		}
	}
	return true
}

func (c *Controller) enqueueLocked(t *Ticket, attempted bool) error {
	if len(t.cands) == 0 || c.waiting >= c.limit {
		t.state, t.err = stDone, ErrQueueFull
		return ErrQueueFull
	}
	// Insert in arrival order; concurrent first attempts can fail out of
	// order, so scan back from the tail (usually zero steps).
	after := c.tail
	for after != nil && after.seq > t.seq {
		after = after.prev
	}
	t.prev = after
	if after == nil {
		t.next = c.head
		c.head = t
	} else {
		t.next = after.next
		after.next = t
	}
	if t.next == nil {
		c.tail = t
	} else {
		t.next.prev = t
	}
	for _, m := range t.cands {
		c.models[m].want++
	}
	c.waiting++
	if c.onQueue != nil {
		c.onQueue(t.label, 1)
	}
	t.state = stQueued
	t.queuedAt = time.Now()
	if c.timeout > 0 {
		t.timer = time.NewTimer(c.timeout)
	}
	c.armTickLocked()
	if attempted && t.releases != c.releases {
		// Capacity came back while this request was attempting.
		c.requestRoundLocked()
	}
	return nil
}

func (c *Controller) wait(ctx context.Context, t *Ticket) ([]int, error) {
	var deadline <-chan time.Time
	if t.timer != nil {
		deadline = t.timer.C
	}
	for {
		select {
		case <-t.wake:
		case <-ctx.Done():
			c.Leave(t)
			return nil, ctx.Err()
		case <-deadline:
			c.mu.Lock()
			if t.state != stDone {
				c.leaveLocked(t, ErrQueueTimeout)
			}
			err := t.err
			c.mu.Unlock()
			return nil, err
		}
		c.mu.Lock()
		switch t.state {
		case stTurn:
			t.allowed = t.allowed[:0]
			for _, m := range t.cands {
				if !c.round.blocked[m] {
					t.allowed = append(t.allowed, m)
				}
			}
			c.mu.Unlock()
			return t.allowed, nil
		case stDone:
			err := t.err
			c.mu.Unlock()
			return nil, err
		}
		c.mu.Unlock()
	}
}

// Report ends an attempt that admitted nothing: busy are the candidates
// that had no capacity now, drop those that can never serve this request.
// It returns how many candidates remain; with none left the caller should
// Leave.
func (c *Controller) Report(t *Ticket, busy, drop []int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t.state == stDone {
		return len(t.cands)
	}
	queued := t.state == stQueued || t.state == stTurn
	for _, d := range drop {
		for i, m := range t.cands {
			if m == d {
				t.cands = append(t.cands[:i], t.cands[i+1:]...)
				if queued {
					c.models[m].want--
				}
				break
			}
		}
	}
	if t.state == stTurn {
		for _, m := range busy {
			if m >= 0 && m < len(c.models) {
				c.round.blocked[m] = true
			}
		}
		t.state = stQueued
		c.round.holder = nil
		c.round.resume = t.next
		c.advanceLocked()
	}
	return len(t.cands)
}

// Leave takes the ticket out of admission: after admission, on refusal or
// when the request is abandoned. It is idempotent.
func (c *Controller) Leave(t *Ticket) {
	c.mu.Lock()
	if t.state != stDone {
		c.leaveLocked(t, nil)
	}
	c.mu.Unlock()
}

func (c *Controller) leaveLocked(t *Ticket, err error) {
	if t.state == stQueued || t.state == stTurn {
		c.removeLocked(t)
	}
	t.state, t.err = stDone, err
	if t.timer != nil {
		t.timer.Stop()
	}
	signal(t)
}

func (c *Controller) removeLocked(t *Ticket) {
	holder := c.round.holder == t
	next := t.next
	if t.prev == nil {
		c.head = t.next
	} else {
		t.prev.next = t.next
	}
	if t.next == nil {
		c.tail = t.prev
	} else {
		t.next.prev = t.prev
	}
	t.prev, t.next = nil, nil
	for _, m := range t.cands {
		c.models[m].want--
	}
	c.waiting--
	if c.onQueue != nil {
		c.onQueue(t.label, -1)
	}
	if holder {
		c.round.holder = nil
		c.round.resume = next
		c.advanceLocked()
	}
}

func signal(t *Ticket) {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

func (c *Controller) requestRoundLocked() {
	if c.waiting == 0 || c.closed {
		return
	}
	if c.round.holder != nil {
		c.round.pending = true
		return
	}
	c.startRoundLocked()
}

func (c *Controller) startRoundLocked() {
	clear(c.round.blocked)
	c.round.resume = c.head
	c.advanceLocked()
}

// advanceLocked gives the turn to the next waiter from round.resume that
// may try a model no earlier waiter of this round found busy.
func (c *Controller) advanceLocked() {
	for w := c.round.resume; w != nil; w = w.next {
		if c.allWantedBlockedLocked() {
			break
		}
		if c.canTryLocked(w) {
			w.state = stTurn
			c.round.holder = w
			c.round.resume = nil
			signal(w)
			return
		}
	}
	c.round.resume = nil
	if c.round.pending {
		c.round.pending = false
		c.startRoundLocked()
	}
}

func (c *Controller) allWantedBlockedLocked() bool {
	for m := range c.models {
		if c.models[m].want > 0 && !c.round.blocked[m] {
			return false
		}
	}
	return true
}

func (c *Controller) canTryLocked(t *Ticket) bool {
	for _, m := range t.cands {
		if !c.round.blocked[m] {
			return true
		}
	}
	return false
}

func (c *Controller) armTickLocked() {
	if c.tickArmed || c.waiting == 0 {
		return
	}
	c.tickArmed = true
	if c.tick == nil {
		c.tick = time.AfterFunc(c.retry, c.onTick)
		return
	}
	c.tick.Reset(c.retry)
}

func (c *Controller) onTick() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tickArmed = false
	if c.waiting == 0 || c.closed {
		return
	}
	c.requestRoundLocked()
	c.armTickLocked()
}

// Retry starts a retry round now, as the periodic retry does; for callers
// that learn of capacity the ledger cannot see (a backend became ready).
func (c *Controller) Retry() {
	c.mu.Lock()
	c.releases++
	c.requestRoundLocked()
	c.mu.Unlock()
}

// Reserve takes a slot on model m. It fails with ErrBusy when all of m's
// slots are held and with ErrShuttingDown after Quiesce.
func (c *Controller) Reserve(m int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrShuttingDown
	}
	l := &c.models[m]
	if l.inUse >= l.slots {
		l.refused = true
		return ErrBusy
	}
	l.inUse++
	c.total++
	return nil
}

// Release returns a slot of model m. served says the reservation carried a
// request that ran (its end frees engine capacity): that wakes waiters.
// A slot borrowed by an attempt the backend refused wakes them only when
// someone was turned away meanwhile.
func (c *Controller) Release(m int, served bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := &c.models[m]
	if l.inUse == 0 {
		return
	}
	l.inUse--
	c.total--
	if served || l.refused {
		l.refused = false
		c.releases++
		if l.want > 0 {
			c.requestRoundLocked()
		}
	}
	if c.total == 0 {
		for _, ch := range c.idle {
			close(ch)
		}
		c.idle = nil
	}
}

// Quiesce refuses new work: waiters and later Acquire and Reserve calls get
// ErrShuttingDown. Reservations already held are kept until released.
func (c *Controller) Quiesce() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	for w := c.head; w != nil; {
		next := w.next
		w.prev, w.next = nil, nil
		if c.onQueue != nil {
			c.onQueue(w.label, -1)
		}
		w.state, w.err = stDone, ErrShuttingDown
		if w.timer != nil {
			w.timer.Stop()
		}
		signal(w)
		w = next
	}
	c.head, c.tail, c.waiting = nil, nil, 0
	for m := range c.models {
		c.models[m].want = 0
	}
	c.round.holder, c.round.resume, c.round.pending = nil, nil, false
	if c.tick != nil {
		c.tick.Stop()
		c.tickArmed = false
	}
}

// Wait blocks until no reservation is held or ctx ends.
func (c *Controller) Wait(ctx context.Context) error {
	c.mu.Lock()
	if c.total == 0 {
		c.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	c.idle = append(c.idle, ch)
	c.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Counts is a consistent snapshot of the ledger.
type Counts struct {
	// Waiting is the queue length.
	Waiting int
	// InUse, Slots and Wanted are per model: reservations held, slots,
	// and queued requests that may use the model.
	InUse  []int
	Slots  []int
	Wanted []int
	Closed bool
}

// Counts fills dst (reusing its slices) with the current counts.
func (c *Controller) Counts(dst *Counts) {
	n := len(c.models)
	dst.InUse = resize(dst.InUse, n)
	dst.Slots = resize(dst.Slots, n)
	dst.Wanted = resize(dst.Wanted, n)
	c.mu.Lock()
	defer c.mu.Unlock()
	dst.Waiting = c.waiting
	dst.Closed = c.closed
	for m := range c.models {
		dst.InUse[m] = c.models[m].inUse
		dst.Slots[m] = c.models[m].slots
		dst.Wanted[m] = c.models[m].want
	}
}

func resize(s []int, n int) []int {
	if cap(s) < n {
		return make([]int, n)
	}
	return s[:n]
}

// InUse is the number of reservations held on model m.
func (c *Controller) InUse(m int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.models[m].inUse
}

// Waiting is the number of queued requests.
func (c *Controller) Waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waiting
}

// Closed reports whether Quiesce was called.
func (c *Controller) Closed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}
