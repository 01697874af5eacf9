package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/engine/enginetest"
)

// collector is an sdk.Emitter that records a stream.
type collector struct {
	mu       sync.Mutex
	adm      sdk.Admission
	events   []sdk.Event
	admitted chan struct{}
	// onEvent, when set, runs on every event before it is recorded; an
	// error is returned to the engine (the consumer is gone).
	onEvent func(n int, ev sdk.Event) error
}

func newCollector() *collector { return &collector{admitted: make(chan struct{})} }

func (c *collector) Admit(a sdk.Admission) error {
	c.mu.Lock()
	c.adm = a
	c.mu.Unlock()
	close(c.admitted)
	return nil
}

func (c *collector) Emit(ev sdk.Event) error {
	c.mu.Lock()
	n := len(c.events)
	c.mu.Unlock()
	if c.onEvent != nil {
		if err := c.onEvent(n, ev); err != nil {
			return err
		}
	}
	c.mu.Lock()
	c.events = append(c.events, ev)
	c.mu.Unlock()
	return nil
}

func (c *collector) admission() sdk.Admission {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.adm
}

// result sums up a stream.
type result struct {
	reasoning, text string
	tokens          []int32
	finish          *sdk.Finish
	events          int
}

func (c *collector) result() result {
	c.mu.Lock()
	defer c.mu.Unlock()
	var r result
	for _, ev := range c.events {
		r.reasoning += ev.Reasoning
		r.text += ev.Text
		r.tokens = append(r.tokens, ev.TokenIDs...)
		if ev.Finish != nil {
			r.finish = ev.Finish
		}
	}
	r.events = len(c.events)
	return r
}

func newEngine(t *testing.T, m *enginetest.FakeModel, cfg engine.Config) *engine.Engine {
	t.Helper()
	cfg.Model, cfg.Vocab = m, enginetest.ByteVocab{}
	if cfg.MaxCtx == 0 {
		cfg.MaxCtx = 256
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatalf("new engine: %v", err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	return e
}

func request(prompt string, maxTokens int) *engine.Request {
	return &engine.Request{Prompt: enginetest.Encode(prompt), MaxTokens: maxTokens, Detokenizer: &enginetest.Detokenizer{}}
}

// run runs req to the end and returns its stream and Run's error.
func run(e *engine.Engine, req *engine.Request) (*collector, error) {
	c := newCollector()
	err := e.Run(context.Background(), req, c)
	return c, err
}

// gate holds the model's forwards until released, so tests can line up
// several requests before the loop moves.
type gate struct {
	once    sync.Once
	opened  sync.Once
	release chan struct{}
	entered chan struct{}
}

func holdForwards(m *enginetest.FakeModel) *gate {
	g := &gate{release: make(chan struct{}), entered: make(chan struct{})}
	m.BeforeForward = func([]engine.SeqInput) {
		g.once.Do(func() { close(g.entered) })
		<-g.release
	}
	return g
}

func (g *gate) open() { g.opened.Do(func() { close(g.release) }) }

// async runs req in the background.
type async struct {
	c    *collector
	err  error
	done chan struct{}
}

func start(ctx context.Context, e *engine.Engine, req *engine.Request) *async {
	a := &async{c: newCollector(), done: make(chan struct{})}
	go func() {
		a.err = e.Run(ctx, req, a.c)
		close(a.done)
	}()
	return a
}

// wait fails the test instead of hanging when a stream never ends (a
// stalled loop).
func (a *async) wait(t *testing.T) {
	t.Helper()
	select {
	case <-a.done:
	case <-time.After(20 * time.Second):
		t.Fatal("request never finished: the step loop stalled")
	}
}

func waitAdmitted(t *testing.T, a *async) sdk.Admission {
	t.Helper()
	select {
	case <-a.c.admitted:
	case <-a.done:
		t.Fatalf("run ended before admission: %v", a.err)
	}
	return a.c.admission()
}

func TestAdmissionThroughRun(t *testing.T) {
	is := is.New(t)
	// 4-token blocks, 16 blocks (64 tokens), 2 slots, context 48, headroom 8.
	m := enginetest.NewFakeModel(4, 19, 2)
	e := newEngine(t, m, engine.Config{MaxCtx: 48, DecodeHeadroom: 8})
	g := holdForwards(m)
	defer g.open()

	// Never fits the context: 40 + 10 > 48.
	c, err := run(e, request(strings.Repeat("x", 40), 10))
	is.NoErr(err)
	adm := c.admission()
	is.Equal(adm.Outcome, sdk.OutcomeNeverFits)
	is.Equal(adm.NeededTokens, 50)
	is.Equal(adm.LimitTokens, 48)
	is.Equal(adm.PromptTokens, 40)
	is.True(strings.Contains(adm.Reason, "context of 48"))

	// First request: prompt 20, promise 20+8 = 7 blocks; 12 left.
	a := start(context.Background(), e, request(strings.Repeat("a", 20), 20))
	is.Equal(waitAdmitted(t, a).Outcome, sdk.OutcomeAdmitted)
	<-g.entered // the loop is inside its first forward, holding nothing else

	// Second: prompt 28 + headroom 8 = 9 blocks, and the first needs no
	// more headroom yet.
	b := start(context.Background(), e, request(strings.Repeat("b", 28), 8))
	is.Equal(waitAdmitted(t, b).Outcome, sdk.OutcomeAdmitted)
	st := e.Stats()
	is.Equal(st.KVTokensUsed, 64)
	is.Equal(st.ActiveSequences, 2)

	// Third: no free slot.
	c, err = run(e, request("hi", 4))
	is.NoErr(err)
	is.Equal(c.admission().Outcome, sdk.OutcomeBusy)
	is.True(strings.Contains(c.admission().Reason, "no free sequence slot (2 of 2 in use)"))

	g.open()
	a.wait(t)
	b.wait(t)
	is.NoErr(a.err)
	is.NoErr(b.err)
	is.Equal(e.Stats().KVTokensUsed, 0)
	is.Equal(m.FreeBlocks(), 19)
}

func TestAdmissionBusyOnKV(t *testing.T) {
	is := is.New(t)
	m := enginetest.NewFakeModel(4, 8, 4) // 32 tokens
	e := newEngine(t, m, engine.Config{MaxCtx: 64, DecodeHeadroom: 8})
	g := holdForwards(m)
	defer g.open()
	a := start(context.Background(), e, request(strings.Repeat("a", 16), 16)) // promise 6 blocks
	is.Equal(waitAdmitted(t, a).Outcome, sdk.OutcomeAdmitted)
	// 2 blocks left; a prompt of 4 + headroom 8 needs 3.
	c, err := run(e, request("abcd", 8))
	is.NoErr(err)
	is.Equal(c.admission().Outcome, sdk.OutcomeBusy)
	is.True(strings.Contains(c.admission().Reason, "not enough free KV: needs 12 tokens"))
	// The whole pool would hold it: never fits is only for the pool's size.
	c, err = run(e, request(strings.Repeat("z", 30), 8))
	is.NoErr(err)
	is.Equal(c.admission().Outcome, sdk.OutcomeNeverFits)
	is.Equal(c.admission().LimitTokens, 32)
	g.open()
	a.wait(t)
}

func TestInvalidRequests(t *testing.T) {
	m := enginetest.NewFakeModel(4, 8, 2)
	e := newEngine(t, m, engine.Config{})
	for _, tc := range []struct {
		name string
		req  *engine.Request
		want string
	}{
		{"empty prompt", request("", 4), "prompt is empty"},
		{"no max tokens", request("hi", 0), "max tokens 0"},
		{"no detokenizer", &engine.Request{Prompt: []int32{1}, MaxTokens: 1}, "detokenizer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			c, err := run(e, tc.req)
			is.NoErr(err)
			is.Equal(c.admission().Outcome, sdk.OutcomeInvalid)
			is.True(strings.Contains(c.admission().Reason, tc.want))
		})
	}
}

func TestSchedulerMixesPrefillChunksWithDecode(t *testing.T) {
	is := is.New(t)
	m := enginetest.NewFakeModel(4, 64, 4)
	e := newEngine(t, m, engine.Config{StepTokens: 8})
	g := holdForwards(m)
	a := start(context.Background(), e, request("hi", 10))
	waitAdmitted(t, a)
	<-g.entered // step 1 holds a's 2-token prefill
	b := start(context.Background(), e, request(strings.Repeat("p", 20), 3))
	waitAdmitted(t, b)
	g.open()
	a.wait(t)
	b.wait(t)
	is.NoErr(a.err)
	is.NoErr(b.err)

	steps := m.Steps()
	type ent = enginetest.Entry
	want := [][]ent{
		{{Seq: 0, Tokens: 2, Logits: engine.LogitsLast}},
		{{Seq: 0, Tokens: 1, Logits: engine.LogitsLast}, {Seq: 1, Tokens: 7, Logits: engine.LogitsNone}},
		{{Seq: 0, Tokens: 1, Logits: engine.LogitsLast}, {Seq: 1, Tokens: 7, Logits: engine.LogitsNone}},
		{{Seq: 0, Tokens: 1, Logits: engine.LogitsLast}, {Seq: 1, Tokens: 6, Logits: engine.LogitsLast}},
		{{Seq: 0, Tokens: 1, Logits: engine.LogitsLast}, {Seq: 1, Tokens: 1, Logits: engine.LogitsLast}},
	}
	// b's admission reaches the test just before Run hands b to the loop,
	// so the loop may run a step or more with a alone first (the race
	// detector's scheduling showed it): skip those, then b joins.
	is.True(len(steps) >= 1)
	is.Equal(fmt.Sprint(steps[0]), fmt.Sprint(want[0])) // step 0: a's prefill
	rest := steps[1:]
	for len(rest) > 0 && len(rest[0]) == 1 && rest[0][0].Seq == 0 {
		is.Equal(fmt.Sprint(rest[0]), fmt.Sprint([]ent{{Seq: 0, Tokens: 1, Logits: engine.LogitsLast}})) // a decodes alone until b joins
		rest = rest[1:]
	}
	is.True(len(rest) >= len(want)-1)
	for i, w := range want[1:] {
		is.Equal(fmt.Sprint(rest[i]), fmt.Sprint(w)) // step i after b joined
	}
	is.Equal(len(a.c.result().tokens), 10)
	is.Equal(len(b.c.result().tokens), 3)
}

// letterLogits gives eight letters history-dependent logits (everything else impossible): a FakeModel.Dist whose
// sampled tokens depend on every token fed before.
func letterLogits(history []int32) []float32 {
	row := make([]float32, enginetest.VocabSize)
	for i := range row {
		row[i] = float32(math.Inf(-1))
	}
	h := uint64(1469598103934665603)
	for _, t := range history {
		h = (h ^ uint64(t)) * 1099511628211
	}
	for i := range 8 {
		row['a'+i] = float32((h>>(8*i))&0xff) / 64
	}
	return row
}

// TestBatchedDecodeMatchesAlone: a request's tokens do not depend on what it shares forwards with, greedy or sampled
// (sampled rows are drawn on several goroutines at once: each with its own generator, history and row).
func TestBatchedDecodeMatchesAlone(t *testing.T) {
	prompts := []string{"the cat", "a much longer prompt that takes several chunks", "x", "hello there"}
	for _, tc := range []struct {
		name string
		temp float32
		dist func([]int32) []float32
	}{
		{"greedy", 0, nil},
		{"sampled", 1, letterLogits},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			req := func(i int) *engine.Request {
				r := request(prompts[i], 24)
				r.Sampling = engine.Sampling{Temperature: tc.temp, Seed: uint64(i + 1)}
				return r
			}
			alone := make([][]int32, len(prompts))
			for i := range prompts {
				m := enginetest.NewFakeModel(4, 64, 1)
				m.Dist = tc.dist
				e := newEngine(t, m, engine.Config{StepTokens: 8})
				c, err := run(e, req(i))
				is.NoErr(err)
				alone[i] = c.result().tokens
				is.Equal(len(alone[i]), 24)
			}
			m := enginetest.NewFakeModel(4, 128, 4)
			m.Dist = tc.dist
			e := newEngine(t, m, engine.Config{StepTokens: 8})
			g := holdForwards(m)
			runs := make([]*async, len(prompts))
			for i := range prompts {
				runs[i] = start(context.Background(), e, req(i))
				waitAdmitted(t, runs[i])
			}
			g.open()
			for i, a := range runs {
				a.wait(t)
				is.NoErr(a.err)
				is.Equal(a.c.result().tokens, alone[i]) // same tokens batched as alone
			}
			batched := 0
			for _, s := range m.Steps() {
				if len(s) > 1 {
					batched++
				}
			}
			is.True(batched > 0) // the sequences really shared forwards
		})
	}
}

func TestStopConditions(t *testing.T) {
	const prompt = "q"
	for _, tc := range []struct {
		name      string
		reply     string
		maxTokens int
		minTokens int
		stop      []string
		text      string
		reason    sdk.FinishReason
		stopSeq   string
		tokens    int
	}{
		{name: "eos", reply: "hello", maxTokens: 20, text: "hello", reason: sdk.FinishStop, tokens: 6},
		{name: "max tokens", reply: "hello world", maxTokens: 5, text: "hello", reason: sdk.FinishLength, tokens: 5},
		{name: "stop across tokens", reply: "hello wor" + "ld STOP here", maxTokens: 40, stop: []string{"STOP"},
			text: "hello world ", reason: sdk.FinishStopSequence, stopSeq: "STOP", tokens: 16},
		{name: "earliest stop wins", reply: "abcXYdefXY", maxTokens: 40, stop: []string{"def", "XY"},
			text: "abc", reason: sdk.FinishStopSequence, stopSeq: "XY", tokens: 5},
		{name: "partial stop released", reply: "ababd", maxTokens: 40, stop: []string{"abc"},
			text: "ababd", reason: sdk.FinishStop, tokens: 6},
		{name: "partial stop at max tokens", reply: "xxab", maxTokens: 4, stop: []string{"abc"},
			text: "xxab", reason: sdk.FinishLength, tokens: 4},
		{name: "min tokens suppress eos", reply: "hi", maxTokens: 5, minTokens: 4,
			text: "hi..", reason: sdk.FinishStop, tokens: 5},
		{name: "utf-8 split across tokens", reply: "héllo ✓", maxTokens: 40, text: "héllo ✓", reason: sdk.FinishStop, tokens: 11},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			m := enginetest.NewFakeModel(4, 64, 1)
			m.Next = enginetest.Reply(len(prompt), enginetest.Encode(tc.reply))
			e := newEngine(t, m, engine.Config{})
			req := request(prompt, tc.maxTokens)
			req.Stop, req.MinTokens = tc.stop, tc.minTokens
			c, err := run(e, req)
			is.NoErr(err)
			r := c.result()
			is.Equal(r.text, tc.text)
			is.True(r.finish != nil)
			is.Equal(r.finish.Reason, tc.reason)
			is.Equal(r.finish.StopSequence, tc.stopSeq)
			is.Equal(r.finish.Usage.CompletionTokens, tc.tokens)
			is.Equal(len(r.tokens), tc.tokens)
			is.Equal(r.finish.Usage.PromptTokens, 1)
			for _, ev := range c.events {
				if tc.stopSeq != "" {
					is.True(!strings.Contains(ev.Text, tc.stopSeq[:1]) || strings.Contains(tc.text, tc.stopSeq[:1]))
				}
			}
		})
	}
}

func TestIgnoreEOS(t *testing.T) {
	is := is.New(t)
	m := enginetest.NewFakeModel(4, 64, 1)
	m.Next = enginetest.Reply(1, enginetest.Encode("ok"))
	e := newEngine(t, m, engine.Config{})
	req := request("q", 6)
	req.IgnoreEOS = true
	c, err := run(e, req)
	is.NoErr(err)
	r := c.result()
	is.Equal(r.text, "ok....")
	is.Equal(r.finish.Reason, sdk.FinishLength)
}

// A Whole request (its client takes one body) gets its events in one Emit, after the finish, with the text,
// tokens and finish the same request gets token by token; one that ends in an error still gets what came first.
func TestWholeRequestEmitsOnceAtTheEnd(t *testing.T) {
	is := is.New(t)
	m := enginetest.NewFakeModel(4, 64, 1)
	m.Next = enginetest.Reply(1, enginetest.Encode("hello there"))
	e := newEngine(t, m, engine.Config{})
	streamed, err := run(e, request("q", 32))
	is.NoErr(err)
	req := request("q", 32)
	req.Whole = true
	whole := newCollector()
	early := false // an event emitted while the request was still being decoded
	forwards := 0
	m.BeforeForward = func([]engine.SeqInput) {
		if forwards++; forwards != 6 {
			return
		}
		// five tokens are out: give the sender every chance to pass them on (it would, token by token)
		for range 1000 {
			runtime.Gosched()
		}
		whole.mu.Lock()
		early = len(whole.events) > 0
		whole.mu.Unlock()
	}
	is.NoErr(e.Run(context.Background(), req, whole))
	a, b := streamed.result(), whole.result()
	is.True(!early)
	is.Equal(b.events, 1)
	is.Equal(b.text, a.text)
	is.Equal(b.tokens, a.tokens)
	is.Equal(b.finish.Reason, a.finish.Reason)
	is.Equal(b.finish.Usage, a.finish.Usage)

	// 6 blocks of 4 for two sequences of 4 + 16: one of them runs out of KV mid-way
	m = enginetest.NewFakeModel(4, 6, 2)
	m.Next = enginetest.Reply(1, enginetest.Encode("abcdefghijklmnop"))
	e = newEngine(t, m, engine.Config{MaxCtx: 24, DecodeHeadroom: 4})
	g := holdForwards(m)
	reqs := []*engine.Request{request("aaaa", 16), request("bbbb", 16)}
	for _, r := range reqs {
		r.Whole, r.IgnoreEOS = true, true
	}
	x := start(context.Background(), e, reqs[0])
	waitAdmitted(t, x)
	<-g.entered
	y := start(context.Background(), e, reqs[1])
	waitAdmitted(t, y)
	g.open()
	x.wait(t)
	y.wait(t)
	failed := x
	if x.err == nil {
		failed = y
	}
	is.True(errors.Is(failed.err, engine.ErrNoKV))
	r := failed.c.result()
	is.True(r.finish == nil)
	is.True(len(r.tokens) > 0) // the tokens made before the pool ran out
}

func TestReasoningBudgets(t *testing.T) {
	closeTags := []int32{enginetest.ThinkClose, '\n'}
	for _, tc := range []struct {
		name      string
		budget    int
		hard      int
		maxTokens int
		reasoning string
		text      string
		reasonTok int
		reason    sdk.FinishReason
	}{
		// 5 reasoning tokens, then </think> (counted as reasoning) and "\n".
		{name: "think budget", budget: 5, maxTokens: 12, reasoning: "thoug", text: "\nHELLO", reasonTok: 6, reason: sdk.FinishLength},
		// 20 tokens, reply budget 8: closed when 8 are left (after 12), the
		// answer gets 8 - 2 tokens.
		{name: "hard limit reply budget", hard: 8, maxTokens: 20, reasoning: "thoughtsthou", text: "\nOKOKOK", reasonTok: 13, reason: sdk.FinishLength},
		{name: "no budget", maxTokens: 10, reasoning: "thoughtsth", reasonTok: 10, reason: sdk.FinishLength},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			m := enginetest.NewFakeModel(4, 64, 1)
			// Thinks forever; once the reasoning is closed it answers
			// "HELLO" / "OKOKOK..." by the history's length parity.
			m.Next = func(h []int32) int32 {
				closed := -1
				for i, t := range h {
					if t == enginetest.ThinkClose {
						closed = i
					}
				}
				if closed < 0 {
					return int32("thoughts"[(len(h)-1)%8])
				}
				ans := "HELLO"
				if tc.hard > 0 {
					ans = "OKOKOKOKOKOK"
				}
				n := len(h) - closed - 2 // after the forced "\n"
				if n < 0 {
					return 'X' // ignored: the engine forces "\n" here
				}
				if n < len(ans) {
					return int32(ans[n])
				}
				return enginetest.EOG
			}
			e := newEngine(t, m, engine.Config{})
			req := request("q", tc.maxTokens)
			req.Parser = &enginetest.ThinkParser{In: true}
			req.ReasoningBudget, req.HardLimitReplyBudget, req.CloseReasoning = tc.budget, tc.hard, closeTags
			c, err := run(e, req)
			is.NoErr(err)
			r := c.result()
			is.Equal(r.reasoning, tc.reasoning)
			is.Equal(r.text, tc.text)
			is.Equal(r.finish.Usage.ReasoningTokens, tc.reasonTok)
			is.Equal(r.finish.Reason, tc.reason)
		})
	}
}

func TestToolCallsFinish(t *testing.T) {
	is := is.New(t)
	m := enginetest.NewFakeModel(4, 64, 1)
	m.Next = enginetest.Reply(1, enginetest.Encode("ab!"))
	e := newEngine(t, m, engine.Config{})
	req := request("q", 10)
	req.Stop = []string{"b!x"}
	req.Parser = &toolParser{}
	c, err := run(e, req)
	is.NoErr(err)
	r := c.result()
	is.Equal(r.text, "ab") // held back "b" for the stop string, flushed before the call
	is.Equal(r.finish.Reason, sdk.FinishToolCalls)
	var calls []sdk.ToolCallDelta
	for _, ev := range c.events {
		if len(ev.ToolCalls) > 0 {
			is.True(strings.HasSuffix(ev.Text, "b")) // text of the same event comes before the call
		}
		calls = append(calls, ev.ToolCalls...)
	}
	is.Equal(calls, []sdk.ToolCallDelta{{Index: 0, ID: "call_0", Name: "f"}})
}

// toolParser turns "!" into a tool call.
type toolParser struct{}

func (toolParser) Feed(s string) engine.Output {
	if s == "!" {
		return engine.Output{ToolCalls: []sdk.ToolCallDelta{{Index: 0, ID: "call_0", Name: "f"}}}
	}
	return engine.Output{Text: s}
}
func (toolParser) Close() engine.Output { return engine.Output{} }
func (toolParser) InReasoning() bool    { return false }

func TestCancellationFreesKV(t *testing.T) {
	is := is.New(t)
	m := enginetest.NewFakeModel(4, 64, 2)
	e := newEngine(t, m, engine.Config{MaxCtx: 256})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := newCollector()
	c.onEvent = func(n int, _ sdk.Event) error {
		if n == 3 {
			cancel()
		}
		return nil
	}
	err := e.Run(ctx, request("go on", 200), c)
	is.True(errors.Is(err, context.Canceled))
	// Run returned: the sequence already left the batch and freed its KV.
	is.Equal(m.LiveSeqs(), 0)
	is.Equal(m.FreeBlocks(), 64)
	is.Equal(e.Stats().KVTokensUsed, 0)
	is.Equal(e.Stats().ActiveSequences, 0)
	is.True(c.result().finish == nil)
}

func TestConsumerGoneFreesKV(t *testing.T) {
	is := is.New(t)
	m := enginetest.NewFakeModel(4, 64, 2)
	e := newEngine(t, m, engine.Config{})
	gone := errors.New("client went away")
	c := newCollector()
	c.onEvent = func(n int, _ sdk.Event) error {
		if n == 2 {
			return gone
		}
		return nil
	}
	err := e.Run(context.Background(), request("go on", 200), c)
	is.True(errors.Is(err, gone))
	is.Equal(m.LiveSeqs(), 0)
	is.Equal(e.Stats().KVTokensUsed, 0)
}

func TestSlowConsumerDoesNotStallOthers(t *testing.T) {
	is := is.New(t)
	m := enginetest.NewFakeModel(4, 128, 2)
	e := newEngine(t, m, engine.Config{EventBuffer: 4})
	unblock, first := make(chan struct{}), make(chan struct{})
	slow := newCollector()
	slow.onEvent = func(n int, _ sdk.Event) error {
		switch n {
		case 0:
			close(first)
		case 1:
			<-unblock
		}
		return nil
	}
	ctx := context.Background()
	a := &async{c: slow, done: make(chan struct{})}
	go func() { a.err = e.Run(ctx, request("slow", 100), slow); close(a.done) }()
	waitAdmitted(t, a)
	// a's first tokens are out, so the loop gave it sequence 0 before b arrives (its admission alone did not: Run
	// queues the sequence for the loop after the admission event, and b could be started first, the race detector's
	// scheduling once had b on sequence 0, its 100 steps counted as a's)
	select {
	case <-first:
	case <-a.done:
		t.Fatalf("run ended before its first event: %v", a.err)
	}
	b := start(ctx, e, request("fast", 100))
	b.wait(t) // finishes while a's consumer is stuck
	is.NoErr(b.err)
	is.Equal(len(b.c.result().tokens), 100)

	// a was paused: it made at most three outboxes of 4 tokens: one the
	// sender took and passed, one it took and is stuck emitting, and one
	// waiting.
	aSteps := 0
	for _, s := range m.Steps() {
		for _, en := range s {
			if en.Seq == 0 && en.Logits == engine.LogitsLast {
				aSteps++
			}
		}
	}
	is.True(aSteps < 100)
	is.True(aSteps <= 3*4)
	close(unblock)
	a.wait(t)
	is.NoErr(a.err)
	r := a.c.result()
	is.Equal(len(r.tokens), 100)
	is.True(r.events < 100) // the backlog went out coalesced

	// Pausing changed nothing in what it generated.
	alone, err := run(newEngine(t, enginetest.NewFakeModel(4, 128, 1), engine.Config{}), request("slow", 100))
	is.NoErr(err)
	is.Equal(r.tokens, alone.result().tokens)
	is.Equal(r.text, alone.result().text)
}

func TestKVExhaustedMidRunEndsWithError(t *testing.T) {
	is := is.New(t)
	// 6 blocks of 4 = 24 tokens; two sequences of 4 + 16 each fit alone,
	// not together.
	m := enginetest.NewFakeModel(4, 6, 2)
	e := newEngine(t, m, engine.Config{MaxCtx: 24, DecodeHeadroom: 4})
	g := holdForwards(m)
	a := start(context.Background(), e, request("aaaa", 16))
	waitAdmitted(t, a)
	<-g.entered
	b := start(context.Background(), e, request("bbbb", 16))
	is.Equal(waitAdmitted(t, b).Outcome, sdk.OutcomeAdmitted)
	g.open()
	a.wait(t)
	b.wait(t)
	failed, ok := a, b
	if a.err == nil {
		failed, ok = b, a
	}
	is.True(errors.Is(failed.err, engine.ErrNoKV))
	is.True(strings.Contains(failed.err.Error(), "kv pool exhausted"))
	is.NoErr(ok.err)
	is.Equal(ok.c.result().finish.Reason, sdk.FinishLength)
	is.Equal(m.FreeBlocks(), 6)
	is.Equal(m.LiveSeqs(), 0)
}

func TestLogprobs(t *testing.T) {
	is := is.New(t)
	m := enginetest.NewFakeModel(4, 64, 1)
	m.Next = enginetest.Reply(1, enginetest.Encode("ab"))
	e := newEngine(t, m, engine.Config{})
	req := request("q", 8)
	req.Logprobs, req.TopLogprobs = true, 2
	c, err := run(e, req)
	is.NoErr(err)
	for _, ev := range c.events {
		is.Equal(len(ev.Logprobs), len(ev.TokenIDs))
		lp := ev.Logprobs[0]
		is.Equal(len(lp.Top), 2)
		is.Equal(lp.Top[0].Token, lp.Token) // greedy: the top alternative was taken
		is.True(lp.Logprob < 0 && lp.Logprob > -0.1)
		is.True(lp.Top[1].Logprob < lp.Top[0].Logprob)
	}
	is.Equal(c.events[0].Logprobs[0].Token, "a")
}

func TestCloseEndsRunningRequests(t *testing.T) {
	is := is.New(t)
	m := enginetest.NewFakeModel(4, 64, 1)
	e := newEngine(t, m, engine.Config{})
	g := holdForwards(m)
	a := start(context.Background(), e, request("x", 100))
	waitAdmitted(t, a)
	<-g.entered
	closed := make(chan error)
	go func() { closed <- e.Close(context.Background()) }()
	// Once Close has begun, new requests are turned away; only then let
	// the held forward finish.
	for {
		c, err := run(e, request("y", 4))
		is.NoErr(err)
		if strings.Contains(c.admission().Reason, "shutting down") {
			is.Equal(c.admission().Outcome, sdk.OutcomeBusy)
			break
		}
		runtime.Gosched()
	}
	g.open()
	is.NoErr(<-closed)
	a.wait(t)
	if !errors.Is(a.err, engine.ErrClosed) {
		t.Fatalf("err = %v", a.err)
	}
	is.Equal(m.LiveSeqs(), 0)
}

// discard is an sdk.Emitter that drops everything.
type discard struct{}

func (discard) Admit(sdk.Admission) error { return nil }
func (discard) Emit(sdk.Event) error      { return nil }
