package engine

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
)

// How a sequence's next token is chosen: from its whole logits row, or from the row's best candidates.

// choose samples the next token from a row given whole (row) or as its candidates (c != nil).
func (e *Engine) choose(s *sequence, row []float32, c *candidateRow) (int32, error) {
	if c != nil {
		return e.pickCandidate(s, c)
	}
	return e.pick(s, row)
}

// suppressEOG reports whether end-of-generation may not be sampled yet.
func suppressEOG(s *sequence) bool { return s.req.IgnoreEOS || len(s.generated) < s.req.MinTokens }

// suppressRow makes a whole row's end-of-generation tokens impossible while s may not end yet.
func (e *Engine) suppressRow(s *sequence, row []float32) {
	if !suppressEOG(s) {
		return
	}
	for _, id := range e.eog {
		if int(id) < len(row) {
			row[id] = float32(math.Inf(-1))
		}
	}
}

// suppressCandidates is suppressRow for a candidate row; padding candidates (id -1) are impossible too.
func (e *Engine) suppressCandidates(s *sequence, c *candidateRow) {
	suppress := suppressEOG(s)
	inf := float32(math.Inf(-1))
	for j, id := range c.ids {
		if id < 0 || (suppress && slices.Contains(e.eog, id)) {
			c.logits[j] = inf
		}
	}
}

// pick samples the next token from the whole row, with end-of-generation
// suppressed while the request wants it.
func (e *Engine) pick(s *sequence, row []float32) (tok int32, err error) {
	e.suppressRow(s, row)
	if e.constrained(s) {
		tok, err = e.sampleJSON(s, row)
	} else {
		tok, err = e.m.Sample(row, &s.req.Sampling, s.generated, &s.rng)
	}
	if err != nil {
		return 0, fmt.Errorf("sample: %w", err)
	}
	return tok, nil
}

// pickCandidate is pick for a candidate row: the sampler runs on the candidates (already in the order it would sort
// the whole row into), so the choice and the draw are the ones the whole row would give.
func (e *Engine) pickCandidate(s *sequence, c *candidateRow) (int32, error) {
	// a draw drawsFromCandidates let into this candidate step (not asked again: the pacer may turn during the step)
	if s.req.Sampling.Temperature > 0 && s.req.Sampling.TopK <= 0 && e.sampler != nil {
		return e.drawCandidate(s, c)
	}
	e.suppressCandidates(s, c)
	j, err := e.m.Sample(c.logits, &s.req.Sampling, nil, &s.rng)
	if err != nil {
		return 0, fmt.Errorf("sample: %w", err)
	}
	if j < 0 || int(j) >= len(c.ids) || c.ids[j] < 0 {
		return 0, fmt.Errorf("sample: candidate %d of %d has no token", j, len(c.ids))
	}
	return c.ids[j], nil
}

// drawCandidate draws a token without top-k from the candidates where they decide it, else from the whole row, which
// the model still holds: the same token either way.
// Suppressed end-of-generation candidates are flagged, not set to -Inf, so that their share of the log-sum-exp is
// known (at the end of an answer with ignore_eos it is most of it).
func (e *Engine) drawCandidate(s *sequence, c *candidateRow) (int32, error) {
	var suppressed []bool
	if suppressEOG(s) {
		suppressed = e.suppressed[:0]
		for _, id := range c.ids {
			suppressed = append(suppressed, slices.Contains(e.eog, id))
		}
		e.suppressed = suppressed
	}
	tok, ok, err := e.sampler.SampleCandidates(c.ids, c.logits, suppressed, c.lse, &s.req.Sampling, &s.rng)
	if err != nil {
		return 0, fmt.Errorf("sample: %w", err)
	}
	e.draws.observe(ok)
	if ok {
		return tok, nil
	}
	if len(e.row) < e.nv {
		e.row = make([]float32, e.nv)
	}
	if err := e.sampler.LogitsRow(c.row, e.row); err != nil {
		return 0, fmt.Errorf("sample: the whole logits row: %w", err)
	}
	row := e.row[:e.nv]
	tok, err = e.pick(s, row)
	if err == nil && tok >= 0 && int(tok) < len(row) {
		c.drawn, c.drawnLogit, c.drawnSet = tok, row[tok], true // (its logprob; end of generation is not suppressed with logprobs)
	}
	return tok, err
}

// drawn is a token presample drew for a sequence's next advance.
type drawn struct {
	tok int32
	err error
	ok  bool
}

// presample draws at once, on several goroutines, the next tokens of this step's sequences whose draw reads a whole
// logits row (a positive temperature, no JSON constraint, no forced token; verify blocks excepted): the host sampler
// reads the whole vocabulary for each (~1 ms for 150k logits), which the step would otherwise pay once per sequence,
// one after another. Each sequence draws with its own generator and history, as advance would, so the tokens are
// the same; advance takes them from s.drawn.
func (e *Engine) presample(batch []SeqInput, members []*sequence, first []int, rowAt func(int) ([]float32, *candidateRow)) {
	type job struct {
		s   *sequence
		row []float32
	}
	var jobs []job
	for i, in := range batch {
		s := members[i]
		if in.Logits == LogitsNone || (in.Logits == LogitsAll && s.spec != nil) || len(s.forced) > 0 ||
			s.req.Sampling.Temperature <= 0 || e.constrained(s) {
			continue
		}
		r, _ := rowAt(lastRow(in, first[i]))
		jobs = append(jobs, job{s, r})
	}
	if len(jobs) < 2 {
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(len(jobs), runtime.GOMAXPROCS(0)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := next.Add(1) - 1; j < int64(len(jobs)); j = next.Add(1) - 1 {
				s := jobs[j].s
				tok, err := e.pick(s, jobs[j].row)
				s.drawn = drawn{tok: tok, err: err, ok: true}
			}
		}()
	}
	wg.Wait()
}
