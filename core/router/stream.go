package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/dflash/dflash_server/sdk"
)

// eventBuffer is how many events a backend may run ahead of the reader
// before Emit blocks (back-pressure on that sequence only).
const eventBuffer = 16

// Stream is an admitted request. Recv and Close may be called from
// different goroutines; Recv from one goroutine at a time.
type Stream struct {
	r    *Router
	m    int
	name string

	ctx    context.Context // the backend call's context
	cancel context.CancelFunc
	admitc chan sdk.Admission
	events chan sdk.Event
	done   chan struct{} // closed when Backend.Start returned
	err    error         // Start's result, read after done

	admitSent atomic.Bool
	served    atomic.Bool // the engine admitted: its end frees capacity
	closed    atomic.Bool
	refs      atomic.Int32 // Start running + not closed

	// Set before the Stream is handed out.
	adm       sdk.Admission
	route     string
	queueWait time.Duration

	// Emitter side (the backend's goroutine).
	begun    time.Time
	admitted time.Time
	firstOut time.Time
	lastOut  time.Time  // the last event with tokens
	api      string     // the client API, for metric labels (WithAPI)
	whole    bool       // the request's Whole: its events may all come at the end
	gaps     []tokenGap // a Whole request's gaps between events, observed at its finish

	finished bool // Recv side
}

func newStream(ctx context.Context, r *Router, m int) *Stream {
	s := &Stream{
		r:      r,
		m:      m,
		name:   r.names[m],
		admitc: make(chan sdk.Admission, 1),
		events: make(chan sdk.Event, eventBuffer),
		done:   make(chan struct{}),
		api:    apiOf(ctx),
	}
	// Derived from the request so a client that goes away cancels
	// generation even before the API layer calls Close.
	s.ctx, s.cancel = context.WithCancel(ctx)
	s.refs.Store(2)
	return s
}

// run calls the backend; the reservation is released only after Start
// returned and the Stream was closed.
func (s *Stream) run(req *sdk.ChatRequest) {
	defer func() {
		if v := recover(); v != nil {
			s.err = fmt.Errorf("backend %s panicked: %v", s.name, v)
		}
		close(s.done)
		s.unref()
	}()
	s.begun = time.Now()
	s.whole = req.Whole
	s.err = s.r.models[s.m].Backend.Start(s.ctx, req, (*emitter)(s))
}

// errNoAdmission: the backend neither admitted nor refused within the admission timeout.
var errNoAdmission = errors.New("no admission")

// awaitAdmission waits for the first message of the Start stream, at most
// timeout (0: no limit). done is false when ctx ended first.
func (s *Stream) awaitAdmission(ctx context.Context, timeout time.Duration) (a sdk.Admission, err error, done bool) {
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-expired:
		return a, fmt.Errorf("backend %s: %w within %s", s.name, errNoAdmission, timeout), true
	case a = <-s.admitc:
		return a, nil, true
	case <-s.done:
		select {
		case a = <-s.admitc:
			return a, nil, true
		default:
		}
		if s.err == nil {
			return a, fmt.Errorf("backend %s: start returned without an admission", s.name), true
		}
		return a, s.err, true
	case <-ctx.Done():
		return a, nil, false
	}
}

func (s *Stream) unref() {
	if s.refs.Add(-1) != 0 {
		return
	}
	s.cancel()
	served := s.served.Load()
	if served {
		// Before the release, so that Wait returning means the gauge is
		// settled too.
		s.r.met.AddRunning(s.name, -1)
	}
	s.r.adm.Release(s.m, served)
}

// Model is the name of the model that admitted the request.
func (s *Stream) Model() string { return s.name }

// Admission is the backend's admission message (PromptTokens etc.).
func (s *Stream) Admission() sdk.Admission { return s.adm }

// Route explains the choice for the X-Dflash-Route header: "primary",
// "pinned" (by-name policy), "policy" (the policy put another model first)
// or "fallback:<model>=<why>,..." naming each model tried before the one
// that served and why it was passed over (busy, never_fits, unavailable).
func (s *Stream) Route() string { return s.route }

// QueueWait is how long the request waited in the routing queue.
func (s *Stream) QueueWait() time.Duration { return s.queueWait }

// Recv returns the next event. After the event carrying Finish it returns
// io.EOF; any other error is a backend failure after admission (or
// ErrNoFinish). When ctx ends first it returns ctx.Err().
func (s *Stream) Recv(ctx context.Context) (sdk.Event, error) {
	if s.finished {
		return sdk.Event{}, io.EOF
	}
	select {
	case e := <-s.events:
		return s.deliver(e), nil
	case <-s.done:
		// Events emitted before Start returned come first.
		select {
		case e := <-s.events:
			return s.deliver(e), nil
		default:
		}
		if s.err != nil {
			return sdk.Event{}, fmt.Errorf("backend %s: %w", s.name, s.err)
		}
		return sdk.Event{}, fmt.Errorf("backend %s: %w", s.name, ErrNoFinish)
	case <-ctx.Done():
		return sdk.Event{}, ctx.Err()
	}
}

func (s *Stream) deliver(e sdk.Event) sdk.Event {
	if e.Finish != nil {
		s.finished = true
	}
	return e
}

// Close ends the request: it cancels generation if it has not finished and
// lets the reservation go once the backend's Start has returned. It is
// idempotent and must always be called.
func (s *Stream) Close() {
	if !s.closed.CompareAndSwap(false, true) {
		return
	}
	s.cancel()
	s.unref()
}

// tokenGap is n tokens that arrived d after the ones before them.
type tokenGap struct {
	d time.Duration
	n int
}

// emitter is the Stream as the backend sees it.
type emitter Stream

var _ sdk.Emitter = (*emitter)(nil)

var errAdmittedTwice = errors.New("admission sent twice")

func (e *emitter) Admit(a sdk.Admission) error {
	s := (*Stream)(e)
	if !s.admitSent.CompareAndSwap(false, true) {
		return errAdmittedTwice
	}
	if a.Outcome == sdk.OutcomeAdmitted {
		s.admitted = time.Now()
		s.served.Store(true)
		s.r.met.AddRunning(s.name, 1)
	}
	s.admitc <- a // buffered for exactly this one message
	return nil
}

func (e *emitter) Emit(ev sdk.Event) error {
	s := (*Stream)(e)
	if !s.served.Load() {
		return errors.New("event before admission")
	}
	s.observe(ev)
	select {
	case s.events <- ev:
		return nil
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

// observe records latency and token metrics on the backend's side, so a
// slow reader does not skew them.
func (s *Stream) observe(ev sdk.Event) {
	met := s.r.met
	if met == nil {
		return
	}
	now := time.Now()
	if s.firstOut.IsZero() && (ev.Text != "" || ev.Reasoning != "" || len(ev.ToolCalls) > 0) {
		s.firstOut = now
		if !s.whole {
			met.ObserveTTFT(s.name, s.api, s.firstOut.Sub(s.begun))
		}
	}
	if n := len(ev.TokenIDs); n > 0 {
		if !s.lastOut.IsZero() {
			if s.whole {
				s.gaps = append(s.gaps, tokenGap{now.Sub(s.lastOut), n})
			} else {
				met.ObserveITL(s.name, s.api, now.Sub(s.lastOut), n)
			}
		}
		s.lastOut = now
	}
	f := ev.Finish
	if f == nil {
		return
	}
	if s.whole {
		s.observeWhole(f)
	}
	met.AddTokens(s.name, f.Usage.PromptTokens, f.Usage.CompletionTokens)
	met.AddDraft(s.name, f.Timings.DraftProposed, f.Timings.DraftAccepted, f.Timings.DraftSteps)
	if n := f.Usage.CompletionTokens; n > 1 {
		switch {
		case f.Timings.DecodeMS > 0:
			met.ObserveTPOT(s.name, s.api, time.Duration(f.Timings.DecodeMS*float64(time.Millisecond)/float64(n-1)))
		case !s.firstOut.IsZero():
			met.ObserveTPOT(s.name, s.api, time.Since(s.firstOut)/time.Duration(n-1))
		}
	}
}

// observeWhole records the latencies of a Whole request at its finish. Its events may all have come together (the
// backend held them for the one body), so where the finish has the engine's timings they say when the first token
// came (the engine's prefill after the admission) and how the others followed (its decode time over them); a backend
// without timings sent its events as they came, and their arrivals say it.
func (s *Stream) observeWhole(f *sdk.Finish) {
	met := s.r.met
	if !s.firstOut.IsZero() {
		ttft := s.firstOut.Sub(s.begun)
		if f.Timings.PrefillMS > 0 && !s.admitted.IsZero() {
			ttft = s.admitted.Sub(s.begun) + time.Duration(f.Timings.PrefillMS*float64(time.Millisecond))
		}
		met.ObserveTTFT(s.name, s.api, ttft)
	}
	if n := f.Usage.CompletionTokens; f.Timings.DecodeMS > 0 && n > 1 {
		met.ObserveITL(s.name, s.api, time.Duration(f.Timings.DecodeMS*float64(time.Millisecond)), n-1)
		return
	}
	for _, g := range s.gaps {
		met.ObserveITL(s.name, s.api, g.d, g.n)
	}
}

// apiKey is the context key of WithAPI.
type apiKey struct{}

// WithAPI labels a request's context with the client API it came through ("chat", "messages", ...), for the
// latency metrics the router records per model and API.
func WithAPI(ctx context.Context, api string) context.Context { return context.WithValue(ctx, apiKey{}, api) }

// apiOf is the WithAPI label of ctx, "other" without one.
func apiOf(ctx context.Context) string {
	if api, ok := ctx.Value(apiKey{}).(string); ok && api != "" {
		return api
	}
	return "other"
}
