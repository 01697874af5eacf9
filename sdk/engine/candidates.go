package engine

// Steps whose rows need only their best logits ask a CandidateModel for candidates instead of whole rows.

// candidateK is the most candidates a step asks a CandidateModel for per row.
const candidateK = 64

// candidateRow is one row of a CandidateModel forward.
type candidateRow struct {
	ids    []int32
	logits []float32
	lse    float32 // the whole row's log-sum-exp
	row    int     // the row's index in its forward (CandidateSampler.LogitsRow)
	// a token drawn from the whole row (drawCandidate) and its logit, for its logprob: it may not be a candidate
	drawn      int32
	drawnLogit float32
	drawnSet   bool
}

// allFromCandidates reports whether every row the batch asks for can be decided from its candidates alone.
func (e *Engine) allFromCandidates(batch []SeqInput, members []*sequence) bool {
	for i, in := range batch {
		if in.Logits != LogitsNone && !e.fromCandidates(members[i]) {
			return false
		}
	}
	return true
}

// fromCandidates reports whether s's next token depends only on its row's best candidateK logits: greedy, or
// sampling restricted to the top k (k small enough that end-of-generation ids suppressed among the candidates leave
// k others), with no penalties (they can lift a token from outside) and no JSON constraint (it may reject every
// candidate). Logprobs come from the candidates and the row's log-sum-exp too, unless end-of-generation is suppressed
// (the whole row's log-sum-exp then leaves those tokens out) or a token is forced (it may not be a candidate).
func (e *Engine) fromCandidates(s *sequence) bool {
	r := s.req
	if r.Format != FormatText {
		return false
	}
	if r.Logprobs && (suppressEOG(s) || len(s.forced) > 0 || r.TopLogprobs > candidateK) {
		return false
	}
	p := &r.Sampling
	penalised := p.PenaltyLastN != 0 &&
		((p.RepeatPenalty != 1 && p.RepeatPenalty != 0) || p.PresencePenalty != 0 || p.FrequencyPenalty != 0)
	if penalised {
		return false
	}
	return p.Temperature <= 0 || (p.TopK > 0 && p.TopK <= candidateK-len(e.eog)) || e.drawsFromCandidates(s)
}

// drawsFromCandidates reports whether s's next token is drawn by the CandidateSampler (a temperature in (0, 1], no
// top-k, no min-p; penalties and logprobs that candidates cannot give were ruled out before), its row fetched whole
// where the candidates leave the draw open. Only sequences without a draft: verify rows take their own path.
func (e *Engine) drawsFromCandidates(s *sequence) bool {
	p := &s.req.Sampling
	return e.sampler != nil && e.draws.on() && s.spec == nil &&
		p.Temperature > 0 && p.Temperature <= 1 && p.TopK <= 0 && p.MinP <= 0
}

// drawPacer keeps drawing from candidates only while they decide most draws. An open draw costs the candidates' pass
// and a row copy on top of the whole-row draw, which then also runs alone instead of beside the step's other draws
// (presample); rows as flat as a random-weight model's leave most draws open, a trained model's few. Which path draws
// never changes a token.
type drawPacer struct {
	open float64 // moving average of the fraction of draws left open
	off  int     // steps left that draw from whole rows
}

const (
	drawWeight  = 1.0 / 32 // weight of the newest draw in the average
	drawMaxOpen = 0.5      // past this fraction of open draws, whole rows for a while
	drawOffFor  = 512      // steps
)

func (p *drawPacer) on() bool { return p.off == 0 }

// step counts a step, which ends a pause after drawOffFor of them.
func (p *drawPacer) step() {
	if p.off > 0 {
		p.off--
	}
}

// observe records one draw from candidates.
func (p *drawPacer) observe(decided bool) {
	x := 1.0
	if decided {
		x = 0
	}
	p.open += drawWeight * (x - p.open)
	if p.open > drawMaxOpen {
		p.off, p.open = drawOffFor, 0
	}
}

// candidatesFor is how many candidates per row decide every row of the step (all fromCandidates): the greedy pick or
// every token a top-k draw may take, past the end-of-generation ids a row may suppress. Fewer is cheaper: a device
// picks each candidate by one more pass over the row's chunks (CUDA's top-k), so 64 for a greedy step cost ~0.1 ms
// a step that a small model's whole forward does not.
func (e *Engine) candidatesFor(members []*sequence) int {
	k := 1
	for _, s := range members {
		if p := &s.req.Sampling; p.Temperature > 0 {
			k = max(k, p.TopK)
			if p.TopK <= 0 { // drawsFromCandidates: the sampler's whole ranked head
				k = candidateK
			}
		}
		if s.req.Logprobs {
			k = max(k, s.req.TopLogprobs)
		}
	}
	return min(candidateK, k+len(e.eog))
}
