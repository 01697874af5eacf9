package api

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/dflash/dflash_server/sdk"
)

// fakeRouter is a scripted stand-in for core/router's *Router: Start answers
// with script(req) and records the request it saw.
type fakeRouter struct {
	mu      sync.Mutex
	last    *sdk.ChatRequest
	script  func(req *sdk.ChatRequest) (*fakeStream, error)
	streams []*fakeStream
	// tokenErr, when set, fails Tokenize, Detokenize and CountTokens.
	tokenErr error
}

func (f *fakeRouter) Start(ctx context.Context, req *sdk.ChatRequest) (Stream, error) {
	f.mu.Lock()
	f.last = req
	script := f.script
	f.mu.Unlock()
	st, err := script(req)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.streams = append(f.streams, st)
	f.mu.Unlock()
	return st, nil
}

func (f *fakeRouter) lastRequest() *sdk.ChatRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

func (f *fakeRouter) Tokenize(_ context.Context, model, text string, _ bool) (string, []int32, error) {
	if f.tokenErr != nil {
		return "", nil, f.tokenErr
	}
	ids := make([]int32, 0, len(text))
	for _, b := range []byte(text) {
		ids = append(ids, int32(b))
	}
	return "fake-model", ids, nil
}

func (f *fakeRouter) Detokenize(_ context.Context, _ string, ids []int32) (string, string, error) {
	if f.tokenErr != nil {
		return "", "", f.tokenErr
	}
	b := make([]byte, len(ids))
	for i, id := range ids {
		b[i] = byte(id)
	}
	return "fake-model", string(b), nil
}

// CountTokens counts one token per byte of every message's content.
func (f *fakeRouter) CountTokens(_ context.Context, req *sdk.ChatRequest) (string, int, error) {
	if f.tokenErr != nil {
		return "", 0, f.tokenErr
	}
	n := 0
	if req.Prompt != nil {
		n = len(req.Prompt.Text)
	}
	for _, m := range req.Messages {
		n += len(m.Content)
	}
	return "fake-model", n, nil
}

type fakeModelStatus struct {
	Name  string `json:"name"`
	State string `json:"state"`
	Slots int    `json:"slots"`
}

func (f *fakeRouter) models() []fakeModelStatus {
	return []fakeModelStatus{{Name: "fake-model", State: "ready", Slots: 2}, {Name: "fake-fallback", State: "loading", Slots: 1}}
}

func (f *fakeRouter) Models() []any {
	var out []any
	for _, m := range f.models() {
		out = append(out, m)
	}
	return out
}

type fakeStatus struct {
	Policy  string            `json:"policy"`
	Waiting int               `json:"waiting"`
	Models  []fakeModelStatus `json:"models"`
}

func (f *fakeRouter) Status() any {
	return fakeStatus{Policy: "primary-first", Models: f.models()}
}

// fakeStream replays events, then io.EOF; with failWith set it returns that
// error after the events instead; with hang set it blocks after the events
// until ctx is done.
type fakeStream struct {
	model     string
	route     string
	admission sdk.Admission
	wait      time.Duration
	events    []sdk.Event
	failWith  error
	hang      bool
	// panicAt makes Recv panic when it reaches event index panicAt-1.
	panicAt int
	next    int
	closed  atomic.Bool
	// gate, when set, makes Recv wait for a value before each event.
	gate chan struct{}
	// closedCh is closed by the first Close.
	closedCh  chan struct{}
	closeOnce sync.Once
}

func (s *fakeStream) Model() string {
	if s.model == "" {
		return "fake-model"
	}
	return s.model
}
func (s *fakeStream) Admission() sdk.Admission { return s.admission }
func (s *fakeStream) Route() string            { return s.route }
func (s *fakeStream) QueueWait() time.Duration { return s.wait }
func (s *fakeStream) Close() {
	s.closed.Store(true)
	s.closeOnce.Do(func() {
		if s.closedCh != nil {
			close(s.closedCh)
		}
	})
}

func (s *fakeStream) Recv(ctx context.Context) (sdk.Event, error) {
	if s.gate != nil && s.next < len(s.events) {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return sdk.Event{}, ctx.Err()
		}
	}
	if err := ctx.Err(); err != nil {
		return sdk.Event{}, err
	}
	if s.closed.Load() {
		return sdk.Event{}, errors.New("recv on closed stream")
	}
	if s.panicAt > 0 && s.next == s.panicAt-1 {
		panic("fake stream exploded")
	}
	if s.next < len(s.events) {
		ev := s.events[s.next]
		s.next++
		return ev, nil
	}
	if s.failWith != nil {
		return sdk.Event{}, s.failWith
	}
	if s.hang {
		<-ctx.Done()
		return sdk.Event{}, ctx.Err()
	}
	return sdk.Event{}, io.EOF
}

// script helpers

func finish(reason sdk.FinishReason, prompt, completion int) sdk.Event {
	return sdk.Event{Finish: &sdk.Finish{Reason: reason, Usage: sdk.Usage{PromptTokens: prompt, CompletionTokens: completion}}}
}

func stream(events ...sdk.Event) func(*sdk.ChatRequest) (*fakeStream, error) {
	return func(*sdk.ChatRequest) (*fakeStream, error) {
		return &fakeStream{route: "primary", admission: sdk.Admission{Outcome: sdk.OutcomeAdmitted, PromptTokens: 21},
			wait: 1500 * time.Microsecond, events: events}, nil
	}
}

func refuse(err error) func(*sdk.ChatRequest) (*fakeStream, error) {
	return func(*sdk.ChatRequest) (*fakeStream, error) { return nil, err }
}

func discardLogger() hclog.Logger { return hclog.NewNullLogger() }
