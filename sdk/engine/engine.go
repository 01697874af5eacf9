package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dflash/dflash_server/sdk"
)

// ErrClosed ends the requests still running when the engine is closed.
var ErrClosed = errors.New("engine closed")

// Config configures an Engine.
type Config struct {
	Model Model
	Vocab Vocab
	// MaxConcurrency is the number of sequences generating at once (0: the
	// model's slot count; never more than it).
	MaxConcurrency int
	// MaxCtx is the context length of one sequence, prompt included (> 0).
	MaxCtx int
	// StepTokens is the most tokens one forward processes: every decoding
	// sequence's token first, then prefill chunks in admission order fill
	// the rest (0: 512).
	StepTokens int
	// DecodeHeadroom is how many tokens ahead a sequence reserves KV, and
	// the headroom admission keeps free for every running sequence
	// (0: 64).
	DecodeHeadroom int
	// EventBuffer is how many events a request's outbox holds before its
	// sequence is paused for its slow consumer (0: 32).
	EventBuffer int
	// PrefixCacheSlots is how many retired sequences are kept with their
	// KV for later prompts that share their prefix (0: off). Each takes a
	// model sequence slot besides the MaxConcurrency running ones, and the
	// Model must be a Rewinder. Cached KV is evicted, oldest first, as
	// soon as admission or a running sequence needs the blocks.
	PrefixCacheSlots int
	// Special reports the tokens that are not plain text (control and
	// added tokens such as <|im_start|> or <think>); constrained output
	// never contains them. nil: every token with bytes is text.
	Special func(id int32) bool
	// Drafter turns on speculative decoding (nil: off); the Model must then be a Verifier. DraftBlock is how many
	// block tokens (root and proposals) a sequence verifies at most (0: the draft's block size).
	Drafter    Drafter
	DraftBlock int
	// DraftAlways drafts on every step. By default the engine measures whether drafting pays (tokens per second of
	// drafting steps against plain ones) and decodes plainly in bursts while it does not.
	DraftAlways bool
	// Store keeps sequence states of prompts (up to their SnapshotAt, or whole) beyond the engine, e.g. on disk, and
	// a request whose prompt starts with a stored prefix starts from its state; the Model must be a StateModel.
	// Output is the same with it or without. nil: off.
	Store StateStore
	// TreeBudget verifies a tree of up to this many draft tokens (DDTree: the draft's likeliest continuations,
	// best first, the top-1 chain first) instead of the chain; 0 verifies the chain. The Model must be a
	// TreeVerifier; at most 63.
	TreeBudget int
	// SampledDrafts draws a sampled request's proposals from the draft's distribution and keeps each by the
	// speculative-sampling rule (draftsample.go) where the Model is a Distributor; on the demo pair that keeps as
	// many proposals as sample-and-match at low temperatures and 13-16 % more at 1 and above (docs/PERFORMANCE.md).
	// Otherwise the draft proposes its best candidates, kept while the target samples them. Both are lossless.
	SampledDrafts bool
	// WholeRowDraws samples requests without top-k from whole rows even where the Model is a CandidateSampler (the
	// same tokens; for comparisons of the two in one run).
	WholeRowDraws bool
}

// Limits is the capacity the engine enforces.
type Limits struct {
	MaxConcurrency int
	KVPoolTokens   int
	KVBlockSize    int
	MaxCtx         int
}

// Engine runs requests on one model with continuous batching. Its methods
// are safe for concurrent use.
type Engine struct {
	cfg   Config
	m     Model
	rew   Rewinder // nil without a prefix cache
	vocab Vocab
	eog   []int32
	// special marks the tokens constrained output may not contain (nil:
	// none).
	special []bool
	// plainOnce builds plainChars, the mask's fast path inside strings.
	plainOnce  sync.Once
	plainChars []int32
	bs         int
	nv         int

	// Speculative decoding (nil draft: off).
	ver      Verifier
	draft    Drafter
	drafts   int // block tokens verified at most
	featSize int
	capture  []int
	pace     pacer
	tree     TreeVerifier // nil: chains
	dist     Distributor  // nil: sampled requests verify by sample-and-match
	// scratch of targetDist and acceptDraft
	pIDs     []int32
	pProbs   []float64
	residual []float64
	store    StateStore // nil: no state store
	states   StateModel
	// sampler draws sampled requests without top-k from candidates (nil: they read whole rows); row is its scratch
	// for the draws it leaves open.
	sampler    CandidateSampler
	row        []float32
	suppressed []bool
	draws      drawPacer

	ctx    context.Context // cancelled by Close; passed to Forward
	cancel context.CancelFunc
	wakeCh chan struct{}
	done   chan struct{}

	mu          sync.Mutex
	totalBlocks int
	freeBlocks  int
	slots       int
	seqs        []*sequence // admitted and not retired, admission order
	incoming    []*sequence
	cache       []*cacheEntry // prefix cache, oldest first
	evicted     []*cacheEntry // out of the ledger, sequences not yet freed
	closing     bool
	stats       sdk.ModelStats

	// Loop-only.
	active []*sequence
}

// New starts an engine on a loaded model.
func New(cfg Config) (*Engine, error) {
	if cfg.Model == nil || cfg.Vocab == nil {
		return nil, errors.New("engine: config needs a Model and a Vocab")
	}
	m := cfg.Model
	bs, blocks, nv := m.KVBlockSize(), m.KVBlocks(), m.VocabSize()
	if bs <= 0 || blocks <= 0 || nv <= 0 || m.MaxSeqs() <= 0 {
		return nil, fmt.Errorf("engine: model reports block size %d, %d blocks, vocabulary %d, %d sequence slots; all must be positive", bs, blocks, nv, m.MaxSeqs())
	}
	if cfg.MaxCtx <= 0 {
		return nil, fmt.Errorf("engine: max context %d must be positive", cfg.MaxCtx)
	}
	var rew Rewinder
	if cfg.PrefixCacheSlots > 0 {
		var ok bool
		if rew, ok = m.(Rewinder); !ok {
			return nil, errors.New("engine: the prefix cache needs a model that can rewind sequences")
		}
		if m.MaxSeqs() <= cfg.PrefixCacheSlots {
			return nil, fmt.Errorf("engine: %d prefix cache slots leave none of the model's %d sequence slots to run requests", cfg.PrefixCacheSlots, m.MaxSeqs())
		}
	}
	if run := m.MaxSeqs() - max(0, cfg.PrefixCacheSlots); cfg.MaxConcurrency <= 0 || cfg.MaxConcurrency > run {
		cfg.MaxConcurrency = run
	}
	if cfg.StepTokens <= 0 {
		cfg.StepTokens = 512
	}
	if cfg.DecodeHeadroom <= 0 {
		cfg.DecodeHeadroom = 64
	}
	if cfg.Drafter != nil {
		// Admission keeps room for a whole verify block (or tree) of every running sequence.
		cfg.DecodeHeadroom = max(cfg.DecodeHeadroom, cfg.Drafter.BlockSize(), cfg.TreeBudget+1)
	}
	if cfg.EventBuffer <= 0 {
		cfg.EventBuffer = 32
	}
	ver, err := checkSpec(cfg)
	if err != nil {
		return nil, err
	}
	var states StateModel
	if cfg.Store != nil {
		var ok bool
		if states, ok = m.(StateModel); !ok {
			return nil, errors.New("engine: a state store needs a model that can export and import sequence states")
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Engine{
		cfg: cfg, m: m, rew: rew, vocab: cfg.Vocab, eog: cfg.Vocab.EOGTokens(), bs: bs, nv: nv,
		ctx: ctx, cancel: cancel, wakeCh: make(chan struct{}, 1), done: make(chan struct{}),
		totalBlocks: blocks, freeBlocks: blocks, slots: cfg.MaxConcurrency,
		store: cfg.Store, states: states,
	}
	if !cfg.WholeRowDraws {
		e.sampler, _ = m.(CandidateSampler)
	}
	if ver != nil {
		e.ver, e.draft, e.featSize, e.capture = ver, cfg.Drafter, cfg.Drafter.FeatureSize(), cfg.Drafter.CaptureLayers()
		e.drafts = cfg.DraftBlock
		if e.drafts == 0 {
			e.drafts = cfg.Drafter.BlockSize()
		}
		if cfg.TreeBudget > 0 {
			e.tree = ver.(TreeVerifier)
		}
		e.dist, _ = m.(Distributor)
	}
	if cfg.Special != nil {
		e.special = make([]bool, nv)
		for id := range e.special {
			e.special[id] = cfg.Special(int32(id))
		}
	}
	e.stats.KVTokensTotal = blocks * bs
	go e.loop()
	return e, nil
}

// Limits reports the capacity the engine enforces.
func (e *Engine) Limits() Limits {
	return Limits{MaxConcurrency: e.slots, KVPoolTokens: e.totalBlocks * e.bs, KVBlockSize: e.bs, MaxCtx: e.cfg.MaxCtx}
}

// Stats is a snapshot of the engine's counters.
func (e *Engine) Stats() sdk.ModelStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.stats
	st.ActiveSequences = len(e.seqs)
	st.KVTokensUsed = (e.totalBlocks - e.freeBlocks) * e.bs
	return st
}

// Close ends every running request with ErrClosed, frees their sequences
// and stops the step loop. The model is the caller's to free afterwards.
func (e *Engine) Close(ctx context.Context) error {
	e.mu.Lock()
	e.closing = true
	e.mu.Unlock()
	e.cancel()
	e.wake()
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close engine: %w", ctx.Err())
	}
}

func (e *Engine) wake() { signal(e.wakeCh) }

// Run runs one request: it decides admission atomically and emits it, then
// (when admitted) streams the request's events, ending with one whose Finish
// is set. It returns once the sequence has left the batch and its KV is
// free: after the finish, after ctx is cancelled (ctx.Err()), after emit
// failed (that error), or with the error that ended the sequence (the KV
// pool ran out, the model failed, the engine closed).
func (e *Engine) Run(ctx context.Context, req *Request, emit sdk.Emitter) error {
	if reason := validate(req); reason != "" {
		return emit.Admit(sdk.Admission{Outcome: sdk.OutcomeInvalid, PromptTokens: len(req.Prompt), Reason: reason})
	}
	adm, s := e.admit(ctx, req)
	if err := emit.Admit(adm); err != nil {
		if s != nil {
			e.unadmit(s)
		}
		return err
	}
	if s == nil {
		return nil
	}
	e.lookupStored(s)
	e.mu.Lock()
	e.incoming = append(e.incoming, s)
	e.mu.Unlock()
	e.wake()
	return e.send(ctx, s, emit)
}

// send is the request's sender: it hands the outbox's events to emit until
// the loop retires the sequence. A Whole request's outbox gives them all at
// its finish: a message per token cost the sender, the plugin transport and
// the core a few hundred microseconds of CPU, taken from the compute threads
// of a model on the CPU (~3-7 % of a 2-thread decode).
func (e *Engine) send(ctx context.Context, s *sequence, emit sdk.Emitter) error {
	var emitErr error
	wait := ctx
	for {
		evs, done := s.out.take(wait)
		if done {
			break
		}
		if evs == nil { // ctx done: make the loop drop the sequence, then wait for it
			wait = context.Background()
			e.wake()
			continue
		}
		if emitErr != nil || ctx.Err() != nil {
			continue
		}
		for _, ev := range coalesce(evs) {
			if err := emit.Emit(ev); err != nil {
				emitErr = err
				s.abort.Store(true)
				e.wake()
				break
			}
		}
	}
	switch {
	case s.err != nil:
		return s.err
	case emitErr != nil:
		return emitErr
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return nil
}

// loop is the step loop, the only goroutine that calls the model.
func (e *Engine) loop() {
	defer close(e.done)
	for {
		e.reap()
		e.mu.Lock()
		in := e.incoming
		e.incoming = nil
		closing := e.closing
		e.mu.Unlock()
		for _, s := range in {
			e.active = append(e.active, s)
			if closing {
				e.retire(s, ErrClosed)
				continue
			}
			e.startSeq(s)
		}
		if closing {
			for len(e.active) > 0 {
				e.retire(e.active[0], ErrClosed)
			}
			e.dropCache()
			return
		}
		for _, s := range slices.Clone(e.active) {
			if s.ctx.Err() != nil {
				e.retire(s, s.ctx.Err())
			} else if s.abort.Load() {
				e.retire(s, nil)
			}
		}
		t0 := time.Now()
		drafted := e.speculating() && (e.cfg.DraftAlways || e.pace.drafting())
		if drafted {
			e.propose()
		}
		batch, members := e.schedule()
		if len(batch) == 0 {
			<-e.wakeCh
			continue
		}
		decodeOnly := !slices.ContainsFunc(members, func(s *sequence) bool { return s.state != stateDecode })
		generated := e.step(batch, members)
		if e.speculating() && decodeOnly {
			e.pace.observe(drafted, generated, time.Since(t0))
		}
	}
}

// startSeq gives an admitted sequence its model slot and the KV the ledger
// promised it.
func (e *Engine) startSeq(s *sequence) {
	e.reap()
	if s.reuse == nil || !e.adopt(s) {
		id, err := e.m.NewSeq()
		if err != nil {
			e.retire(s, fmt.Errorf("allocate sequence: %w", err))
			return
		}
		s.id, s.hasID = id, true
	}
	if err := e.m.Reserve(s.id, s.held*e.bs); err != nil {
		e.retire(s, fmt.Errorf("reserve %d KV tokens for the prompt: %w", s.held*e.bs, err))
		return
	}
	s.reservedTk = s.held * e.bs
	s.state = statePrefill
	e.importStored(s)
	e.startSpec(s)
}

// schedule builds the next forward: each decoding sequence's next token
// (unless its consumer is behind), then prefill chunks in admission order
// up to the step's token budget.
func (e *Engine) schedule() ([]SeqInput, []*sequence) {
	var batch []SeqInput
	var members []*sequence
	budget := e.cfg.StepTokens
	for _, s := range e.active {
		if s.state != stateDecode || len(s.feed) == 0 || s.out.full() {
			continue
		}
		in := SeqInput{Seq: s.id, Tokens: s.feed, Logits: LogitsLast}
		if len(s.feed) > 1 { // a draft block to verify
			in.Logits, in.Record = LogitsAll, true
			if s.spec != nil && len(s.spec.parents) == len(s.feed) {
				in.Parents = s.spec.parents
			}
		}
		batch = append(batch, in)
		members = append(members, s)
		budget -= len(s.feed)
	}
	for _, s := range e.active {
		if budget <= 0 {
			break
		}
		if s.state != statePrefill {
			continue
		}
		n := min(len(s.req.Prompt)-s.nPast, budget)
		if at := e.snapshotAt(s); s.nPast < at {
			n = min(n, at-s.nPast) // end a forward exactly there
		}
		mode := LogitsNone
		if s.nPast+n == len(s.req.Prompt) {
			mode = LogitsLast
		}
		batch = append(batch, SeqInput{Seq: s.id, Tokens: s.req.Prompt[s.nPast : s.nPast+n], Logits: mode})
		members = append(members, s)
		budget -= n
	}
	// Grow reservations; a sequence the pool cannot hold any more leaves.
	kept := 0
	for i, in := range batch {
		s := members[i]
		err := e.grow(s, s.nPast+len(in.Tokens))
		if err != nil && in.Logits == LogitsAll && s.state == stateDecode {
			// No room for the draft block: the root alone, as plain decoding would go on.
			in = e.unblock(s, in)
			err = e.grow(s, s.nPast+1)
		}
		if err != nil {
			e.retire(s, err)
			continue
		}
		batch[kept], members[kept] = in, s
		kept++
	}
	return batch[:kept], members[:kept]
}

// grow makes sure s holds KV for need tokens, reserving a stretch of decode
// headroom ahead when the pool allows it.
func (e *Engine) grow(s *sequence, need int) error {
	if need <= s.reservedTk {
		return nil
	}
	if need > e.cfg.MaxCtx {
		return fmt.Errorf("sequence reached the context of %d tokens", e.cfg.MaxCtx)
	}
	target := max(need, min(s.limit, need+e.cfg.DecodeHeadroom))
	e.mu.Lock()
	extra := blocksFor(target, e.bs) - s.held
	e.evictLocked(extra)
	if extra > e.freeBlocks {
		target = need
		extra = blocksFor(need, e.bs) - s.held
	}
	if extra > e.freeBlocks {
		free := e.freeBlocks
		e.mu.Unlock()
		return fmt.Errorf("%w: sequence needs KV for %d tokens after %d generated, %d tokens free in a pool of %d",
			ErrNoKV, need, len(s.generated), free*e.bs, e.totalBlocks*e.bs)
	}
	if extra > 0 {
		e.freeBlocks -= extra
		s.held += extra
	}
	e.mu.Unlock()
	e.reap()
	if err := e.m.Reserve(s.id, s.held*e.bs); err != nil {
		return fmt.Errorf("reserve %d KV tokens: %w", s.held*e.bs, err)
	}
	s.reservedTk = s.held * e.bs
	return nil
}

// step runs one forward and advances every sequence in it; it returns the tokens it generated.
func (e *Engine) step(batch []SeqInput, members []*sequence) int64 {
	var (
		logits []float32
		cands  Candidates
		feats  []float32
		err    error
	)
	e.draws.step()
	cm, useCands := e.m.(CandidateModel)
	useCands = useCands && e.allFromCandidates(batch, members)
	k := 0
	if useCands {
		k = e.candidatesFor(members)
	}
	switch {
	case e.speculating():
		logits, cands, feats, err = e.ver.ForwardCapture(e.ctx, batch, e.capture, k)
	case useCands:
		cands, err = cm.ForwardCandidates(e.ctx, batch, k)
	default:
		logits, err = e.m.Forward(e.ctx, batch)
	}
	if err != nil {
		if e.ctx.Err() != nil {
			err = ErrClosed
		} else {
			err = fmt.Errorf("forward: %w", err)
		}
		for _, s := range members {
			e.retire(s, err)
		}
		return 0
	}
	tok0 := 0
	var generated int64
	rowAt := func(row int) ([]float32, *candidateRow) {
		if useCands {
			k := cands.K
			return nil, &candidateRow{ids: cands.IDs[row*k : (row+1)*k], logits: cands.Logits[row*k : (row+1)*k], lse: cands.LSE[row], row: row}
		}
		return logits[row*e.nv : (row+1)*e.nv], nil
	}
	first := firstRows(batch)
	if !useCands {
		e.presample(batch, members, first, rowAt)
	}
	for i, in := range batch {
		s := members[i]
		var f []float32 // the entry's features
		if feats != nil {
			f = feats[tok0*e.featSize : (tok0+len(in.Tokens))*e.featSize]
			tok0 += len(in.Tokens)
		}
		if in.Logits == LogitsAll && s.spec != nil {
			rows := func(j int) ([]float32, *candidateRow) { return rowAt(first[i] + j) }
			var n int
			if in.Parents != nil {
				n = e.verifyTree(s, s.nPast, in.Tokens, in.Parents, rows, f)
			} else {
				n = e.verify(s, s.nPast, in.Tokens, rows, f)
			}
			generated += int64(n)
			continue
		}
		s.nPast += len(in.Tokens)
		if s.spec != nil {
			s.spec.pending = append(s.spec.pending, f...)
		}
		if at := e.snapshotAt(s); s.nPast == at {
			e.atSnapshot(s)
		}
		if in.Logits == LogitsNone {
			continue
		}
		r, c := rowAt(lastRow(in, first[i]))
		if s.state == statePrefill {
			s.state = stateDecode
			s.tFirst = time.Now()
		}
		e.advance(s, r, c)
		generated++
	}
	e.mu.Lock()
	for _, s := range members {
		s.pos = s.nPast + len(s.feed)
	}
	e.mu.Unlock()
	return generated
}

// firstRows is each batch entry's first logits row.
func firstRows(batch []SeqInput) []int {
	first := make([]int, len(batch))
	row := 0
	for i, in := range batch {
		first[i] = row
		switch in.Logits {
		case LogitsLast:
			row++
		case LogitsAll:
			row += len(in.Tokens)
		}
	}
	return first
}

// lastRow is the logits row of an entry's last token, its first row being first.
func lastRow(in SeqInput, first int) int {
	if in.Logits == LogitsAll {
		return first + len(in.Tokens) - 1
	}
	return first
}

// advance picks the sequence's next token from its logits row and handles
// the output it makes.
func (e *Engine) advance(s *sequence, row []float32, c *candidateRow) {
	var (
		tok    int32
		forced bool
		err    error
	)
	switch {
	case len(s.forced) > 0: // a forced token (closing the reasoning) needs no sample
		tok, forced = s.forced[0], true
		s.forced = s.forced[1:]
	case s.drawn.ok: // presample drew it
		tok, err = s.drawn.tok, s.drawn.err
		s.drawn = drawn{}
	default:
		tok, err = e.choose(s, row, c)
	}
	if err != nil {
		e.retire(s, err)
		return
	}
	var ev sdk.Event
	if e.commit(s, &ev, tok, forced, row, c) {
		return
	}
	s.feed = append(s.feed[:0], tok)
	s.out.put(ev)
}

// retire takes a sequence out of the batch, frees its slot and KV, and
// closes its outbox; err is what Run returns (nil after a normal finish or
// when the consumer is gone).
func (e *Engine) retire(s *sequence, err error) {
	if s.state == stateDone {
		return
	}
	s.state = stateDone
	if c := s.reuse; c != nil { // retired before it adopted its cache entry
		s.reuse = nil
		e.freeEntry(c)
	}
	if s.hasID && !e.keep(s, err) {
		if ferr := e.m.FreeSeq(s.id); ferr != nil && err == nil {
			err = fmt.Errorf("free sequence: %w", ferr)
		}
	}
	e.endSpec(s)
	e.mu.Lock()
	e.freeBlocks += s.held
	s.held = 0
	e.seqs = slices.DeleteFunc(e.seqs, func(x *sequence) bool { return x == s })
	e.mu.Unlock()
	e.active = slices.DeleteFunc(e.active, func(x *sequence) bool { return x == s })
	s.err = err
	s.out.close()
}
