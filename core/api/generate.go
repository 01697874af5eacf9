package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dflash/dflash_server/core/router"
	"github.com/dflash/dflash_server/sdk"
)

// blockKind is the kind of a run of output: the APIs group output into
// blocks (Anthropic content blocks, Responses output items, Chat message
// fields) that hold one kind each.
type blockKind int

const (
	kindReasoning blockKind = iota + 1
	kindText
	kindTool
)

// block is one run of same-kind output.
type block struct {
	kind blockKind
	// index counts all blocks of the response from 0 (Anthropic block index,
	// Responses output_index).
	index int
	// call counts tool calls from 0 (Chat tool_calls index).
	call int
	// id and name of a tool call; id is the backend's or a generated one.
	id, name string
	// text is everything emitted so far: text, reasoning or arguments.
	text []byte
	// carry holds the bytes of a UTF-8 character split across events.
	carry string
	// itemID is the API-level id of the block (Responses item id).
	itemID string
}

// sink turns the tracker's transitions into one API's output.
type sink interface {
	open(b *block)
	// piece is a non-empty valid-UTF-8 part of b. lp are the logprobs of the
	// tokens of the event that carried it, when requested.
	piece(b *block, s string, lp []sdk.TokenLogprob)
	close(b *block)
	// finish ends a completed response; reason already folds in tool calls.
	finish(f *sdk.Finish, reason sdk.FinishReason, blocks []*block)
	// fail ends the response with a backend failure after admission.
	fail(err error)
}

// streamSink is a sink that writes SSE as it goes.
type streamSink interface {
	sink
	heartbeat()
	writeErr() error
}

// tracker splits the backend's events into blocks. It is shared by all APIs
// so that their outputs agree on what the model said.
type tracker struct {
	sink   sink
	newID  func(prefix string) string
	blocks []*block
	cur    *block
	calls  map[int]*block
	// lp are logprobs not yet attached to a piece.
	lp []sdk.TokenLogprob
}

func newTracker(s sink, newID func(string) string) *tracker {
	return &tracker{sink: s, newID: newID, calls: map[int]*block{}}
}

// feed handles one event; it reports whether the event finished the stream.
func (t *tracker) feed(ev *sdk.Event) bool {
	if len(ev.Logprobs) > 0 {
		t.lp = append(t.lp, ev.Logprobs...)
	}
	if ev.Reasoning != "" {
		t.textual(kindReasoning, ev.Reasoning)
	}
	if ev.Text != "" {
		t.textual(kindText, ev.Text)
	}
	for _, d := range ev.ToolCalls {
		t.tool(d)
	}
	if ev.Finish == nil {
		return false
	}
	t.closeCur()
	reason := ev.Finish.Reason
	if len(t.calls) > 0 && (reason == sdk.FinishStop || reason == sdk.FinishNone) {
		reason = sdk.FinishToolCalls
	}
	t.sink.finish(ev.Finish, reason, t.blocks)
	return true
}

func (t *tracker) textual(k blockKind, s string) {
	if t.cur == nil || t.cur.kind != k {
		t.closeCur()
		t.openBlock(&block{kind: k})
	}
	t.emit(t.cur, s)
}

func (t *tracker) tool(d sdk.ToolCallDelta) {
	b := t.calls[d.Index]
	if b == nil {
		t.closeCur()
		b = &block{kind: kindTool, call: len(t.calls), id: d.ID, name: d.Name}
		if b.id == "" {
			b.id = t.newID("call_")
		}
		t.calls[d.Index] = b
		t.openBlock(b)
	}
	// A piece for an earlier call after a later one started is passed on:
	// every API addresses argument pieces by index or item id.
	if d.ArgumentsDelta != "" {
		t.emit(b, d.ArgumentsDelta)
	}
}

func (t *tracker) openBlock(b *block) {
	b.index = len(t.blocks)
	t.blocks = append(t.blocks, b)
	t.cur = b
	t.sink.open(b)
}

// emit passes s on, holding back a trailing incomplete UTF-8 character
// until the rest of it arrives: JSON cannot carry half a character.
func (t *tracker) emit(b *block, s string) {
	if b.carry != "" {
		s, b.carry = b.carry+s, ""
	}
	if n := incompleteTail(s); n > 0 {
		s, b.carry = s[:len(s)-n], s[len(s)-n:]
	}
	if s == "" {
		return
	}
	b.text = append(b.text, s...)
	lp := t.lp
	t.lp = nil
	t.sink.piece(b, s, lp)
}

func (t *tracker) closeCur() {
	b := t.cur
	if b == nil {
		return
	}
	t.cur = nil
	if b.carry != "" {
		// The character never completed; pass the bytes on and let the JSON
		// encoder replace them with U+FFFD.
		s := b.carry
		b.carry = ""
		b.text = append(b.text, s...)
		lp := t.lp
		t.lp = nil
		t.sink.piece(b, s, lp)
	}
	t.sink.close(b)
}

// incompleteTail is the number of trailing bytes of s that begin a UTF-8
// character without completing it.
func incompleteTail(s string) int {
	for i := len(s) - 1; i >= 0 && i >= len(s)-utf8.UTFMax+1; i-- {
		if utf8.RuneStart(s[i]) {
			if utf8.FullRuneInString(s[i:]) {
				return 0
			}
			return len(s) - i
		}
	}
	return 0
}

// errNoFinish is a stream that ended without its finish event.
var errNoFinish = errors.New("generation stream ended without a finish event")

// generation is what a handler hands to run: the decoded request and how to
// build the API's sink once a model admitted it.
type generation struct {
	shape     shape
	requestID string
	req       *sdk.ChatRequest
	// stream: the response is written as events arrive; otherwise as one
	// body at the end, and the backend is told it may hold its events
	// (sdk.ChatRequest.Whole).
	stream bool
	// newSink builds the sink after admission; for streams it must send the
	// SSE headers and opening events.
	newSink func(st Stream, w http.ResponseWriter) sink
}

// run routes g and writes its response. Nothing is written before the
// router admits the request, so a refusal is still an HTTP status.
func (s *Server) run(w http.ResponseWriter, r *http.Request, g generation) {
	ctx := r.Context()
	g.req.ID = g.requestID
	g.req.Whole = !g.stream
	began := time.Now()
	api := apiName(r.URL.Path)
	st, err := s.rt.Start(router.WithAPI(ctx, api), g.req)
	if err != nil {
		if ctx.Err() != nil {
			// The client left while waiting: nobody reads an answer.
			s.observe("", api, statusClientClosed, began)
			return
		}
		ae := s.errorFor(err, g.shape)
		s.observe("", api, ae.status, began)
		writeError(w, g.shape, g.requestID, ae)
		return
	}
	defer st.Close()
	defer func() {
		code := http.StatusOK
		if ctx.Err() != nil {
			code = statusClientClosed
		}
		s.observe(st.Model(), api, code, began)
	}()
	h := w.Header()
	h.Set("X-Dflash-Model", st.Model())
	if route := st.Route(); route != "" {
		h.Set("X-Dflash-Route", route)
	}
	h.Set("X-Dflash-Queue-Ms", strconv.FormatInt(st.QueueWait().Milliseconds(), 10))
	sk := g.newSink(st, w)
	// A bug after the headers went out must still end the response in the
	// API's own way (an in-stream error event), not as a cut connection.
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			s.opts.Logger.Error("api generation panic", "request_id", g.requestID, "panic", v)
			sk.fail(fmt.Errorf("internal error while generating (request id %s)", g.requestID))
		}
	}()
	tr := newTracker(sk, s.newID)
	if ss, ok := sk.(streamSink); ok && s.opts.Heartbeat > 0 {
		s.pumpWithHeartbeat(ctx, st, tr, ss)
		return
	}
	for {
		ev, err := st.Recv(ctx)
		if done := s.handle(ctx, tr, sk, ev, err); done {
			return
		}
		if ss, ok := sk.(streamSink); ok && ss.writeErr() != nil {
			return
		}
	}
}

// handle processes one Recv result and reports whether the response ended.
func (s *Server) handle(ctx context.Context, tr *tracker, sk sink, ev sdk.Event, err error) bool {
	switch {
	case err == nil:
		return tr.feed(&ev)
	case ctx.Err() != nil:
		// Client gone: no finish, no error event; Close cancels generation.
		return true
	case errors.Is(err, io.EOF):
		sk.fail(errNoFinish)
	default:
		sk.fail(fmt.Errorf("generation failed: %w", err))
	}
	return true
}

type recvResult struct {
	ev  sdk.Event
	err error
}

// pumpWithHeartbeat reads the stream on a second goroutine so that the
// writer can send keep-alives while the model is quiet (long prefill, a long
// tool argument held back by the parser).
func (s *Server) pumpWithHeartbeat(ctx context.Context, st Stream, tr *tracker, ss streamSink) {
	pctx, cancel := context.WithCancel(ctx)
	ch := make(chan recvResult)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// A panic here would kill the process; hand it to the writer as an
		// error instead.
		defer func() {
			if v := recover(); v != nil {
				select {
				case ch <- recvResult{err: fmt.Errorf("stream receive panicked: %v", v)}:
				case <-pctx.Done():
				}
			}
		}()
		for {
			ev, err := st.Recv(pctx)
			select {
			case ch <- recvResult{ev, err}:
			case <-pctx.Done():
				return
			}
			if err != nil || ev.Finish != nil {
				return
			}
		}
	}()
	// Stop the reader before the caller's deferred Close.
	defer func() {
		cancel()
		<-done
	}()
	timer := time.NewTimer(s.opts.Heartbeat)
	defer timer.Stop()
	for {
		select {
		case res := <-ch:
			if s.handle(ctx, tr, ss, res.ev, res.err) || ss.writeErr() != nil {
				return
			}
			timer.Reset(s.opts.Heartbeat)
		case <-timer.C:
			ss.heartbeat()
			if ss.writeErr() != nil {
				return
			}
			timer.Reset(s.opts.Heartbeat)
		case <-ctx.Done():
			return
		}
	}
}

// statusClientClosed is the status recorded (never sent) when the client
// went away, as nginx and the serving landscape call it.
const statusClientClosed = 499

// observe records one generation request's outcome, when the server asked
// for it.
func (s *Server) observe(model, api string, code int, began time.Time) {
	if s.opts.ObserveRequest != nil {
		s.opts.ObserveRequest(model, api, code, time.Since(began))
	}
}

// apiName labels a generation route for metrics.
func apiName(path string) string {
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return "chat"
	case strings.HasSuffix(path, "/completions"):
		return "completions"
	case strings.HasSuffix(path, "/messages"):
		return "messages"
	case strings.HasSuffix(path, "/responses"):
		return "responses"
	}
	return "other"
}
