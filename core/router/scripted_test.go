package router_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/dflash/dflash_server/core/metrics"
	"github.com/dflash/dflash_server/core/router"
	"github.com/dflash/dflash_server/sdk"
)

// scriptedBackend is an in-process sdk.Backend whose engine-level capacity
// (sequence slots, KV pool, context) the test sets, and whose admitted
// requests advance only when the test opens their gates. A request needs
// len(first message) prompt tokens plus MaxTokens of KV.
type scriptedBackend struct {
	name    string
	maxCtx  int
	kvTotal int

	mu       sync.Mutex
	slots    int
	active   int
	kvUsed   int
	kvExtra  int // KV held outside the router's view (engine-side pressure)
	starts   int
	counts   int // CountTokens calls
	admitted []string
	startErr error
	invalid  string
	// hang, when set, makes Start answer nothing until it is closed or the request ends (a hung plugin).
	hang chan struct{}
	// auto: admitted requests finish at once; otherwise each is handed to
	// the test on runs and waits for its gates.
	auto bool
	// prefillMS is the finish's Timings.PrefillMS (the engine's time from admission to the first token).
	prefillMS float64
	runs      chan *scriptedRun
	stash     []*scriptedRun // runs taken off runs while looking for another
}

func newScripted(name string, slots, kv int) *scriptedBackend {
	return &scriptedBackend{name: name, slots: slots, kvTotal: kv, maxCtx: kv, runs: make(chan *scriptedRun, 1024)}
}

// scriptedRun is one admitted request's gates, opened by the test.
type scriptedRun struct {
	id      string
	prefill gate // then one text event
	finish  gate // then the finish event
	retire  gate // then Start frees KV and returns
	// cancelled is closed when the backend saw its context end.
	cancelled chan struct{}
	// returned is closed when Start has returned.
	returned chan struct{}
}

type gate struct {
	ch   chan struct{}
	once *sync.Once
}

func newGate() gate         { return gate{make(chan struct{}), &sync.Once{}} }
func (g gate) open()        { g.once.Do(func() { close(g.ch) }) }
func (r *scriptedRun) all() { r.prefill.open(); r.finish.open(); r.retire.open() }

func chat(id string, prompt, maxTokens int) *sdk.ChatRequest {
	return &sdk.ChatRequest{ID: id, Messages: []sdk.Message{{Role: "user", Content: strings.Repeat("x", prompt)}}, MaxTokens: maxTokens}
}

func (b *scriptedBackend) Info(context.Context) (sdk.BackendInfo, error) {
	return sdk.BackendInfo{Name: "scripted", Architectures: []string{"scripted"}}, nil
}
func (b *scriptedBackend) ValidateOptions(context.Context, sdk.ModelConfig) error { return nil }
func (b *scriptedBackend) Load(context.Context, sdk.ModelConfig, func(sdk.LoadProgress)) (sdk.ModelDescription, error) {
	return b.desc(), nil
}
func (b *scriptedBackend) desc() sdk.ModelDescription {
	return sdk.ModelDescription{Name: b.name, MaxConcurrency: b.slots, KVPoolTokens: b.kvTotal, MaxCtx: b.maxCtx}
}

func (b *scriptedBackend) Start(ctx context.Context, req *sdk.ChatRequest, emit sdk.Emitter) error {
	b.mu.Lock()
	hang := b.hang
	b.mu.Unlock()
	if hang != nil {
		select {
		case <-hang:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	prompt := len(req.Messages[0].Content)
	need := prompt + req.MaxTokens
	b.mu.Lock()
	b.starts++
	var a sdk.Admission
	switch {
	case b.startErr != nil:
		err := b.startErr
		b.mu.Unlock()
		return err
	case b.invalid != "":
		a = sdk.Admission{Outcome: sdk.OutcomeInvalid, Reason: b.invalid}
	case need > b.maxCtx:
		a = sdk.Admission{Outcome: sdk.OutcomeNeverFits, PromptTokens: prompt, NeededTokens: need, LimitTokens: b.maxCtx, Reason: "context"}
	case need > b.kvTotal:
		a = sdk.Admission{Outcome: sdk.OutcomeNeverFits, PromptTokens: prompt, NeededTokens: need, LimitTokens: b.kvTotal, Reason: "kv pool"}
	case b.active >= b.slots || b.kvUsed+b.kvExtra+need > b.kvTotal:
		a = sdk.Admission{Outcome: sdk.OutcomeBusy, PromptTokens: prompt}
	default:
		a = sdk.Admission{Outcome: sdk.OutcomeAdmitted, PromptTokens: prompt}
		b.active++
		b.kvUsed += need
		b.admitted = append(b.admitted, req.ID)
	}
	b.mu.Unlock()
	if err := emit.Admit(a); err != nil || a.Outcome != sdk.OutcomeAdmitted {
		return err
	}
	defer func() {
		b.mu.Lock()
		b.active--
		b.kvUsed -= need
		b.mu.Unlock()
	}()
	finish := sdk.Event{Finish: &sdk.Finish{Reason: sdk.FinishStop,
		Usage:   sdk.Usage{PromptTokens: prompt, CompletionTokens: 3},
		Timings: sdk.Timings{PrefillMS: b.prefillMS, DecodeMS: 2, DraftProposed: 4, DraftAccepted: 3}}}
	if b.auto {
		if err := emit.Emit(sdk.Event{Text: "hi"}); err != nil {
			return err
		}
		return emit.Emit(finish)
	}
	run := &scriptedRun{id: req.ID, prefill: newGate(), finish: newGate(), retire: newGate(),
		cancelled: make(chan struct{}), returned: make(chan struct{})}
	defer close(run.returned)
	b.runs <- run
	step := func(g gate, ev sdk.Event) error {
		select {
		case <-g.ch:
			return emit.Emit(ev)
		case <-ctx.Done():
			close(run.cancelled)
			<-run.retire.ch // retirement takes as long as the test says
			return ctx.Err()
		}
	}
	if err := step(run.prefill, sdk.Event{Text: "hello"}); err != nil {
		return err
	}
	if err := step(run.finish, finish); err != nil {
		return err
	}
	<-run.retire.ch
	return nil
}

func (b *scriptedBackend) Tokenize(_ context.Context, text string, _ bool) ([]int32, error) {
	return []int32{int32(len(text)), int32(len(b.name))}, nil
}
func (b *scriptedBackend) Detokenize(_ context.Context, ids []int32) (string, error) {
	return b.name, nil
}
func (b *scriptedBackend) CountTokens(_ context.Context, req *sdk.ChatRequest) (int, error) {
	b.mu.Lock()
	b.counts++
	b.mu.Unlock()
	return len(req.Messages[0].Content), nil
}
func (b *scriptedBackend) Stats(context.Context) (sdk.ModelStats, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return sdk.ModelStats{ActiveSequences: b.active, KVTokensUsed: b.kvUsed + b.kvExtra, KVTokensTotal: b.kvTotal, DraftAccepted: 3, DraftProposed: 4}, nil
}
func (b *scriptedBackend) Shutdown(context.Context) error { return nil }

func (b *scriptedBackend) startCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.starts
}

func (b *scriptedBackend) admittedIDs() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.admitted...)
}

func (b *scriptedBackend) set(f func(b *scriptedBackend)) {
	b.mu.Lock()
	f(b)
	b.mu.Unlock()
}

// next returns the next admitted run.
func (b *scriptedBackend) next(t *testing.T) *scriptedRun {
	t.Helper()
	select {
	case r := <-b.runs:
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no request was admitted", b.name)
		return nil
	}
}

// runOf returns the run of the admitted request id; runs of other
// requests that arrive first are kept for later calls.
func (b *scriptedBackend) runOf(t *testing.T, id string) *scriptedRun {
	t.Helper()
	for {
		b.mu.Lock()
		for i, r := range b.stash {
			if r.id == id {
				b.stash = append(b.stash[:i], b.stash[i+1:]...)
				b.mu.Unlock()
				return r
			}
		}
		b.mu.Unlock()
		r := b.next(t)
		b.mu.Lock()
		b.stash = append(b.stash, r)
		b.mu.Unlock()
	}
}

var _ sdk.Backend = (*scriptedBackend)(nil)

// fixture is a router over scripted backends.
type fixture struct {
	r   *router.Router
	met *metrics.Registry
	b   []*scriptedBackend
}

func newFixture(t *testing.T, cfg router.Config, backends ...*scriptedBackend) *fixture {
	t.Helper()
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New(metrics.Options{})
	}
	if cfg.Retry == 0 {
		// Only releases wake waiters unless a test wants the retry.
		cfg.Retry = time.Hour
	}
	models := make([]*router.Model, len(backends))
	for i, b := range backends {
		models[i] = &router.Model{Name: b.name, Backend: b, Desc: b.desc(), Info: router.ModelInfo{Arch: "scripted", BackendName: "scripted"}}
	}
	f := &fixture{r: router.New(cfg, models), met: cfg.Metrics, b: backends}
	t.Cleanup(func() {
		for _, b := range backends {
			b.mu.Lock()
			for _, run := range b.stash {
				run.all()
			}
			b.mu.Unlock()
			for {
				select {
				case run := <-b.runs:
					run.all()
					continue
				default:
				}
				break
			}
		}
	})
	return f
}

type outcome struct {
	s   *router.Stream
	err error
}

// startAsync routes req in the background.
func (f *fixture) startAsync(ctx context.Context, req *sdk.ChatRequest) chan outcome {
	ch := make(chan outcome, 1)
	go func() {
		s, err := f.r.Start(ctx, req)
		ch <- outcome{s, err}
	}()
	return ch
}

// waitUntil polls cond: some states (a request sitting in the queue) have
// no other observable point. It fails only if cond never holds.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never happened: %s", what)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func (f *fixture) waiting() int { return f.r.Status().Waiting }

func (f *fixture) waitQueued(t *testing.T, n int) {
	t.Helper()
	waitUntil(t, "queue length reached", func() bool { return f.waiting() == n })
}

func (f *fixture) inFlight(model string) int {
	for _, m := range f.r.Models() {
		if m.Name == model {
			return m.InFlight
		}
	}
	return -1
}

// drain reads a stream to its end.
func drain(ctx context.Context, s *router.Stream) ([]sdk.Event, error) {
	var evs []sdk.Event
	for {
		e, err := s.Recv(ctx)
		if err != nil {
			return evs, err
		}
		evs = append(evs, e)
	}
}

func rejectionOf(err error) *router.Rejection {
	var rj *router.Rejection
	if errors.As(err, &rj) {
		return rj
	}
	return nil
}

// metricValue sums the samples of name whose labels include want (a histogram's: its sample count).
func metricValue(t *testing.T, reg *metrics.Registry, name string, want map[string]string) float64 {
	sum := 0.0
	for _, m := range series(t, reg, name, want) {
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// histogramSum is the sum of the observations of histogram name over the series whose labels include want.
func histogramSum(t *testing.T, reg *metrics.Registry, name string, want map[string]string) float64 {
	sum := 0.0
	for _, m := range series(t, reg, name, want) {
		sum += m.GetHistogram().GetSampleSum()
	}
	return sum
}

// series is the registry's series of name whose labels include want.
func series(t *testing.T, reg *metrics.Registry, name string, want map[string]string) []*dto.Metric {
	t.Helper()
	mfs, err := reg.Prometheus().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []*dto.Metric
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			match := true
			for k, v := range want {
				match = match && labels[k] == v
			}
			if match {
				out = append(out, m)
			}
		}
	}
	return out
}
