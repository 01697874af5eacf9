package engine

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/dflash/dflash_server/sdk"
)

// Speculative decoding (draft and verify). A decoding sequence with a draft sequence feeds the target a block
// [root, proposals...] instead of its one root token; the target's row for each block position decides that
// position's token with the same history and sampler as plain decoding, and the block is accepted up to the first
// proposal that is not kept; the token decided there becomes the next root (the bonus). Greedy requests and those
// the engine has no draft distribution for keep a proposal when the target's sample equals it (sample-and-match: the
// speculative-sampling rule for a draft that proposes its argmax, a one-hot draft distribution); a sampled request
// on a Distributor model draws its proposals from the draft's distribution and keeps them by the general rule
// (draftsample.go). Either way greedy output equals target-only greedy output and sampled output follows the
// target's distribution.
//
// Invariants, per sequence with a draft (s.spec != nil), between steps:
//   - the target's KV holds s.nPast tokens; its features for positions [dlen, nPast) wait in pending;
//   - the draft sequence holds the context of positions [0, dlen): draft blocks are never kept.

// specSeq is one sequence's draft side.
type specSeq struct {
	id      SeqID
	dlen    int       // positions in the draft's context
	pending []float32 // target features of positions [dlen, nPast)
	// accepted is a moving average of the proposals this sequence's blocks had accepted; it sets how many rows the
	// next block verifies (see verifyLen).
	accepted float64
	// parents is the tree of the block in s.feed when it is one (tree verification), else nil; inTree is set from
	// its forward until its path is kept (the target then holds tree rows that no length can describe).
	parents []int32
	inTree  bool
	// qIDs and qProbs are the draft's distributions of the proposals of the block in s.feed when they were drawn
	// from it (DraftInput.Sample), qK candidates a proposal; empty otherwise.
	qIDs   []int32
	qProbs []float32
	qK     int
}

// dropDraftRows forgets the draft's distributions of the last block (its proposals were not drawn, or it is gone).
func (sp *specSeq) dropDraftRows() {
	sp.qIDs, sp.qProbs, sp.qK = sp.qIDs[:0], sp.qProbs[:0], 0
}

// draftRow is the draft's distribution of the block's proposal at block position i+1, if it was drawn from one.
func (sp *specSeq) draftRow(i int) (draftRow, bool) {
	if sp.qK == 0 || (i+1)*sp.qK > len(sp.qIDs) {
		return draftRow{}, false
	}
	return draftRow{ids: sp.qIDs[i*sp.qK : (i+1)*sp.qK], probs: sp.qProbs[i*sp.qK : (i+1)*sp.qK]}, true
}

// specCounts are one request's speculative counts, for its timings.
type specCounts struct {
	drafted  int // proposals verified
	accepted int // proposals accepted
	steps    int // verify forwards
}

// flushRows is how many pending feature rows a prefilling sequence may collect before they go to the draft in a
// context-only step (bounding host memory on long prompts).
const flushRows = 256

// speculating reports whether the engine drafts at all.
func (e *Engine) speculating() bool { return e.draft != nil }

// startSpec gives a new sequence its draft sequence. Without one the sequence decodes plainly; that is never an
// error.
// A sequence continuing from a prefix-cache entry took the entry's draft along (adoptSpec); one whose entry had none
// cannot draft, its draft would lack the cached context.
func (e *Engine) startSpec(s *sequence) {
	if !e.speculating() || s.spec != nil || s.nPast > 0 {
		return
	}
	if id, err := e.draft.NewSeq(); err == nil {
		s.spec = &specSeq{id: id, accepted: float64(e.drafts - 1)}
	}
}

// endSpec frees the sequence's draft side.
func (e *Engine) endSpec(s *sequence) {
	if s.spec != nil {
		_ = e.draft.FreeSeq(s.spec.id)
		s.spec = nil
	}
}

// blockLen is how many block tokens s may verify next: the draft's block, cut so that no row is verified that could
// not be committed (the token budget and the context end).
func (e *Engine) blockLen(s *sequence) int {
	return min(e.drafts, s.req.MaxTokens-len(s.generated), e.cfg.MaxCtx-s.nPast)
}

// verifyLen is how many block tokens s verifies next: about twice what its recent blocks had accepted, plus the root
// and one more, within blockLen. Rows past the first rejection are wasted work, which costs little on a GPU that is
// reading weights anyway but a row's full compute on a CPU; a draft that keeps being right earns back the whole
// block within a few steps. Which rows are verified never changes the output.
func (e *Engine) verifyLen(s *sequence) int {
	return min(e.blockLen(s), max(2, int(math.Ceil(2*s.spec.accepted))+2))
}

// acceptWeight is the weight of the newest block in specSeq.accepted.
const acceptWeight = 0.5

// propose runs one draft step for every decoding sequence that can take a block (its root is in s.feed) and for
// prefilling sequences whose pending features have piled up; a decoding sequence's feed becomes [root, proposals].
// When the draft fails, the step decodes plainly.
func (e *Engine) propose() {
	var (
		in      []DraftInput
		members []*sequence
	)
	for _, s := range e.active {
		sp := s.spec
		if sp == nil {
			continue
		}
		rows := len(sp.pending) / e.featSize
		block := 0
		switch {
		case s.state == stateDecode && len(s.feed) == 1 && len(s.forced) == 0 && !s.out.full():
			if q := e.blockLen(s); q > 1 {
				block = e.draft.BlockSize()
			}
		case s.state == statePrefill && rows >= flushRows:
		default:
			continue
		}
		if rows == 0 && block == 0 {
			continue
		}
		if err := e.draft.Reserve(sp.id, sp.dlen+rows+block); err != nil {
			continue // no room for the block: this sequence decodes plainly this step
		}
		inp := DraftInput{Seq: sp.id, Features: sp.pending}
		if block > 0 && e.sampledDraft(s) {
			inp.Sample = &DraftSample{Temperature: s.req.Sampling.Temperature, Rng: &s.rng}
		}
		if block > 0 {
			inp.Block = make([]int32, block)
			inp.Block[0] = s.feed[0]
			for i := 1; i < block; i++ {
				inp.Block[i] = e.draft.MaskToken()
			}
		}
		in = append(in, inp)
		members = append(members, s)
	}
	if len(in) == 0 {
		return
	}
	k := 1
	for _, x := range in {
		if e.tree != nil || x.Sample != nil {
			k = treeK // a tree's candidates, or those a proposal is drawn from
		}
	}
	c, err := e.draft.Draft(e.ctx, in, k)
	if err != nil {
		// The draft's state is unknown now: those sequences continue without it.
		for _, s := range members {
			e.endSpec(s)
		}
		return
	}
	row := 0
	for i, s := range members {
		sp := s.spec
		sp.dlen += len(sp.pending) / e.featSize
		sp.pending = sp.pending[:0]
		n := max(len(in[i].Block)-1, 0)
		if n == 0 {
			continue
		}
		if e.tree != nil {
			e.planTree(s, c, row, n)
			row += n
			continue
		}
		q := e.verifyLen(s)
		sp.dropDraftRows()
		sampled := in[i].Sample != nil && c.Probs != nil
		if sampled {
			sp.qK = c.K
		}
		for j := 0; j < n && len(s.feed) < q; j++ {
			at := (row + j) * c.K
			id := c.IDs[at]
			if id < 0 {
				break
			}
			s.feed = append(s.feed, id)
			if sampled {
				sp.qIDs = append(sp.qIDs, c.IDs[at:at+c.K]...)
				sp.qProbs = append(sp.qProbs, c.Probs[at:at+c.K]...)
			}
		}
		row += n
	}
}

// verify takes the target's rows for a verified block: rows(i) is the row of block position i. It commits the
// accepted proposals and the bonus as one event and cuts the target back to the accepted tokens. nBefore is the
// sequence's length before the block; feats the block's features.
func (e *Engine) verify(s *sequence, nBefore int, block []int32, rows func(int) ([]float32, *candidateRow), feats []float32) int {
	sp := s.spec
	e.countVerify(s, len(block)-1)
	var ev sdk.Event
	for i := range block {
		r, c := rows(i)
		var (
			tok      int32
			accepted bool
			err      error
		)
		if i+1 < len(block) {
			tok, accepted, err = e.chooseDraft(s, i, block[i+1], r, c)
		} else {
			tok, err = e.choose(s, r, c)
		}
		if err != nil {
			e.retire(s, err)
			return i
		}
		// Block position i is now part of the sequence: its KV and features are kept.
		s.nPast = nBefore + i + 1
		sp.pending = append(sp.pending, feats[i*e.featSize:(i+1)*e.featSize]...)
		if accepted {
			e.countAccepted(s)
		}
		if e.commit(s, &ev, tok, false, r, c) {
			return i + 1
		}
		if !accepted || len(s.forced) > 0 {
			sp.accepted += acceptWeight * (float64(i) - sp.accepted)
			if err := e.ver.Truncate(s.id, s.nPast); err != nil {
				e.retire(s, fmt.Errorf("roll back the rejected draft tokens: %w", err))
				return i + 1
			}
			s.feed = append(s.feed[:0], tok)
			s.out.put(ev)
			return i + 1
		}
	}
	return len(block) // not reached: the last row never has a proposal to accept
}

// countVerify counts a verify forward of proposed draft tokens, for s and for the engine's statistics.
func (e *Engine) countVerify(s *sequence, proposed int) {
	s.counts.steps++
	s.counts.drafted += proposed
	e.mu.Lock()
	e.stats.DraftSteps++
	e.stats.DraftProposed += int64(proposed)
	e.mu.Unlock()
}

// countAccepted counts one accepted proposal, before the token is committed (which may retire s: the statistics are
// complete by the time its request returns).
func (e *Engine) countAccepted(s *sequence) {
	s.counts.accepted++
	e.mu.Lock()
	e.stats.DraftAccepted++
	e.mu.Unlock()
}

// settleSpec brings a retiring sequence's draft up to its target before the prefix cache keeps both: the pending
// features go into the draft's context and the target's rows of a block the sequence ended in are cut off. It
// reports whether the pair is consistent.
func (e *Engine) settleSpec(s *sequence) bool {
	if !e.speculating() {
		return true
	}
	if s.spec != nil && s.spec.inTree {
		return false // ended inside a tree verify: its rows are in tree order, not the sequence's
	}
	if err := e.ver.Truncate(s.id, s.nPast); err != nil {
		return false
	}
	sp := s.spec
	if sp == nil {
		return true
	}
	if rows := len(sp.pending) / e.featSize; rows > 0 {
		if e.draft.Reserve(sp.id, sp.dlen+rows) != nil {
			return false
		}
		if _, err := e.draft.Draft(e.ctx, []DraftInput{{Seq: sp.id, Features: sp.pending}}, 1); err != nil {
			return false
		}
		sp.dlen += rows
		sp.pending = sp.pending[:0]
	}
	return sp.dlen == s.nPast
}

// adoptSpec continues a sequence's draft from its prefix-cache entry: the entry's draft sequence is cut back to the
// reused prefix (the draft keeps attention context only, so any length is reachable).
func (e *Engine) adoptSpec(s *sequence, c *cacheEntry) {
	if c.draft == nil {
		return
	}
	d := c.draft
	c.draft = nil
	if e.draft.Truncate(d.id, s.cached) != nil {
		_ = e.draft.FreeSeq(d.id)
		return
	}
	d.dlen, d.pending = s.cached, d.pending[:0]
	s.spec = d
}

// freeEntry frees a prefix-cache entry's model sequences.
func (e *Engine) freeEntry(c *cacheEntry) {
	_ = e.m.FreeSeq(c.id)
	if c.draft != nil {
		_ = e.draft.FreeSeq(c.draft.id)
		c.draft = nil
	}
}

// specTimings adds the request's speculative counts to its timings.
func specTimings(s *sequence, t *sdk.Timings) {
	t.DraftProposed, t.DraftAccepted, t.DraftSteps = s.counts.drafted, s.counts.accepted, s.counts.steps
}

// checkSpec validates a Config's draft against its model.
func checkSpec(cfg Config) (Verifier, error) {
	if cfg.Drafter == nil {
		return nil, nil
	}
	v, ok := cfg.Model.(Verifier)
	if !ok {
		return nil, errors.New("engine: speculative decoding needs a target model that can capture hidden states and truncate")
	}
	d := cfg.Drafter
	switch {
	case d.BlockSize() < 2:
		return nil, fmt.Errorf("engine: draft block size %d must be at least 2", d.BlockSize())
	case d.FeatureSize() <= 0 || len(d.CaptureLayers()) == 0:
		return nil, fmt.Errorf("engine: draft reads %d layers of %d features; both must be positive", len(d.CaptureLayers()), d.FeatureSize())
	case cfg.DraftBlock < 0 || cfg.DraftBlock > d.BlockSize():
		return nil, fmt.Errorf("engine: draft block %d is outside [1, %d] (the draft's block size)", cfg.DraftBlock, d.BlockSize())
	case cfg.TreeBudget < 0 || cfg.TreeBudget > maxTreeBudget:
		return nil, fmt.Errorf("engine: tree budget %d is outside [0, %d]", cfg.TreeBudget, maxTreeBudget)
	}
	if _, ok := v.(TreeVerifier); cfg.TreeBudget > 0 && !ok {
		return nil, errors.New("engine: tree verification needs a target model that can keep a path of a tree forward")
	}
	return v, nil
}

// pacer decides for the whole engine whether drafting pays on this device and model: it keeps moving averages of
// the tokens per second committed by decode steps that drafted and by plain ones, and while drafting yields less
// it drafts nothing for a burst of plain steps, then tries again. Plain steps are measured in a short burst every
// probeEvery drafting steps, so a change of load (batch size, acceptance) is seen. Which steps draft never changes
// the output.
type pacer struct {
	spec, plain float64 // tokens per second; 0: not measured yet
	plainLeft   int     // plain steps left in the current burst
	sinceProbe  int     // drafting steps since plain was last measured
}

const (
	paceWeight = 0.2 // weight of the newest step in the averages
	probeEvery = 64  // drafting steps between plain measurements
	probeSteps = 4   // plain steps of a measurement
	plainBurst = 48  // plain steps after drafting was found to cost more than it gives
)

// drafting reports whether this step drafts.
func (p *pacer) drafting() bool {
	switch {
	case p.plainLeft > 0:
		p.plainLeft--
		return false
	case p.sinceProbe >= probeEvery || (p.plain == 0 && p.sinceProbe >= probeSteps):
		p.sinceProbe = 0
		p.plainLeft = probeSteps - 1
		return false
	}
	return true
}

// observe records a decode-only step: whether it drafted, the tokens it committed and how long it took (draft,
// forward and acceptance).
func (p *pacer) observe(drafted bool, tokens int64, d time.Duration) {
	if tokens <= 0 || d <= 0 {
		return
	}
	rate := float64(tokens) / d.Seconds()
	avg := func(a *float64) {
		if *a == 0 {
			*a = rate
		} else {
			*a += paceWeight * (rate - *a)
		}
	}
	if !drafted {
		avg(&p.plain)
		return
	}
	avg(&p.spec)
	p.sinceProbe++
	if p.plain > 0 && p.spec < p.plain {
		p.plainLeft, p.sinceProbe = plainBurst, 0
	}
}

// unblock turns a decoding sequence's draft block back into its root alone (the pool has no room for the block).
func (e *Engine) unblock(s *sequence, in SeqInput) SeqInput {
	s.feed = s.feed[:1]
	if sp := s.spec; sp != nil {
		sp.parents = sp.parents[:0]
		sp.dropDraftRows()
	}
	in.Tokens, in.Logits, in.Record, in.Parents = s.feed, LogitsLast, false, nil
	return in
}
