package engine

import (
	"fmt"
	"math"
)

// Speculative sampling with sampled drafts (dflash spec §3.5, schemes 2 and 3). For a request with a positive
// temperature the draft draws each proposal x from its own distribution q (softmax of its candidates' scores at the
// request's temperature, DrawCandidate), and the target's row for that block position has p, the distribution the
// request's sampler draws from there (Distributor). The proposal is kept with probability min(1, p(x) / q(x));
// otherwise the row's token is drawn from the residual max(p - q, 0), normalised. Whatever q is, the token follows p
// (Leviathan et al. 2023, Chen et al. 2023), and the closer q is to p the more proposals are kept. A one-hot q (the
// draft's best candidate) keeps x with probability p(x): the sample-and-match rule, which the engine uses where it has
// no q (greedy requests, a Model without SampleDist, a JSON constraint, trees) and unless Config.SampledDrafts.

// draftRow is the draft's distribution for one proposal: candidate tokens and their probabilities, the proposal first.
type draftRow struct {
	ids   []int32
	probs []float32
}

// prob is q(tok).
func (q draftRow) prob(tok int32) float64 {
	for i, id := range q.ids {
		if id == tok {
			return float64(q.probs[i])
		}
	}
	return 0
}

// rngNext advances a splitmix64 generator state (the native sampler's generator) and returns its next value.
func rngNext(state *uint64) uint64 {
	*state += 0x9e3779b97f4a7c15
	z := *state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// rngFloat is a uniform draw from [0, 1).
func rngFloat(state *uint64) float64 { return float64(rngNext(state)>>11) / (1 << 53) }

// DrawCandidate draws an index of scores with probability softmax(scores / temperature) from rng (a sequence's
// generator, DraftSample.Rng) and writes every index's probability into probs (len(scores)); -Inf scores get 0 and
// are never drawn. It is how a Drafter draws a row's proposal for DraftInput.Sample. It returns -1 when no score is
// finite.
func DrawCandidate(scores []float64, temperature float32, rng *uint64, probs []float32) int {
	mx := math.Inf(-1)
	for _, v := range scores {
		mx = max(mx, v)
	}
	if math.IsInf(mx, -1) {
		clear(probs[:len(scores)])
		return -1
	}
	w := make([]float64, len(scores))
	sum := 0.0
	for i, v := range scores {
		w[i] = math.Exp((v - mx) / float64(temperature))
		sum += w[i]
	}
	for i, v := range w {
		probs[i] = float32(v / sum)
	}
	return drawIndex(w, rng)
}

// drawIndex draws an index of w by its weight (any positive total); the last of positive weight when rounding
// leaves the draw past the end.
func drawIndex(w []float64, rng *uint64) int {
	total := 0.0
	for _, v := range w {
		total += v
	}
	u := rngFloat(rng) * total
	last := 0
	for i, v := range w {
		if v <= 0 {
			continue
		}
		if u < v {
			return i
		}
		u -= v
		last = i
	}
	return last
}

// acceptDraft is the rule for one block row: p (tokens pIDs with probabilities pProbs) the target's distribution,
// q the draft's with its proposal first. It returns the row's token and whether it is the proposal.
func acceptDraft(pIDs []int32, pProbs []float64, q draftRow, rng *uint64, residual []float64) (int32, bool) {
	x := q.ids[0]
	px := 0.0
	for i, id := range pIDs {
		if id == x {
			px = pProbs[i]
			break
		}
	}
	if rngFloat(rng)*float64(q.probs[0]) < px {
		return x, true
	}
	residual = residual[:len(pIDs)]
	mass := 0.0
	for i, id := range pIDs {
		residual[i] = max(pProbs[i]-q.prob(id), 0)
		mass += residual[i]
	}
	if !(mass > 0) { // p <= q everywhere: only rounding can get here
		copy(residual, pProbs)
	}
	return pIDs[drawIndex(residual, rng)], false
}

// sampledDraft reports whether s's next block is drawn from the draft's distribution (DraftInput.Sample).
func (e *Engine) sampledDraft(s *sequence) bool {
	return e.dist != nil && e.cfg.SampledDrafts && e.tree == nil && s.req.Sampling.Temperature > 0 && !e.constrained(s)
}

// chooseDraft picks block row i's token for s by acceptDraft when the block's proposal there was drawn from the
// draft's distribution and the model says what its sampler draws from there, else as plain decoding does (then the
// row keeps the proposal only when it sampled it: sample-and-match, lossless for any proposal). row and c are the
// row as choose takes it.
func (e *Engine) chooseDraft(s *sequence, i int, proposal int32, row []float32, c *candidateRow) (int32, bool, error) {
	q, ok := s.spec.draftRow(i)
	if !ok || q.ids[0] != proposal || s.req.Sampling.Temperature <= 0 || e.constrained(s) {
		tok, err := e.choose(s, row, c)
		return tok, err == nil && tok == proposal, err
	}
	ids, probs, err := e.targetDist(s, row, c)
	if err != nil { // (a library without sample_dist, say): the row decides as plain decoding does, lossless too
		tok, err := e.choose(s, row, c)
		return tok, err == nil && tok == proposal, err
	}
	if cap(e.residual) < len(ids) {
		e.residual = make([]float64, len(ids))
	}
	tok, accepted := acceptDraft(ids, probs, q, &s.rng, e.residual)
	return tok, accepted, nil
}

// targetDist is the distribution s's sampler draws from for a row given whole or as candidates, as token ids (in the
// engine's scratch, valid until the next call).
func (e *Engine) targetDist(s *sequence, row []float32, c *candidateRow) ([]int32, []float64, error) {
	logits, history := row, s.generated
	if c != nil {
		e.suppressCandidates(s, c)
		logits, history = c.logits, nil
	} else {
		e.suppressRow(s, row)
	}
	if cap(e.pIDs) < len(logits) {
		e.pIDs, e.pProbs = make([]int32, len(logits)), make([]float64, len(logits))
	}
	ids, probs := e.pIDs[:len(logits)], e.pProbs[:len(logits)]
	n, err := e.dist.SampleDist(logits, &s.req.Sampling, history, ids, probs)
	if err != nil {
		return nil, nil, fmt.Errorf("sample: %w", err)
	}
	ids, probs = ids[:n], probs[:n]
	if c != nil {
		for i, j := range ids {
			ids[i] = c.ids[j]
		}
	}
	return ids, probs, nil
}
