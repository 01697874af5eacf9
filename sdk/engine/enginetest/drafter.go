package enginetest

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/dflash/dflash_server/sdk/engine"
)

// OracleDrafter is a test double of engine.Drafter whose acceptance the test controls: it knows the target's Next
// and proposes exactly what the target will favour, except at the positions Wrong picks, where its best candidate
// is another token and the right one comes second (so a tree can recover what a chain loses); later positions are
// proposed as if the right token had been taken. It rebuilds each sequence's context from FakeModel features and fails a draft whose context does not
// continue exactly where the sequence's stands (Errs collects those failures, which the engine would otherwise
// absorb by decoding plainly).
type OracleDrafter struct {
	Next  func(history []int32) int32
	Block int
	// Wrong reports whether the proposal for absolute position pos is to be wrong (nil: never).
	Wrong func(pos int) bool
	// Dist, when set, is the draft's own distribution (logits over the vocabulary given the history) for inputs that
	// ask for sampled proposals (DraftInput.Sample): each proposal is drawn from softmax of its k best logits by
	// engine.DrawCandidate and conditions the next (Next and Wrong are not used for them).
	Dist func(history []int32) []float32

	mu     sync.Mutex
	slots  int
	seqs   map[engine.SeqID]*oracleSeq
	Errs   []error
	Drafts int // Draft calls
}

type oracleSeq struct {
	ctx      []int32
	reserved int
}

var _ engine.Drafter = (*OracleDrafter)(nil)

// NewOracleDrafter returns a drafter of block tokens with slots sequences.
func NewOracleDrafter(next func([]int32) int32, block, slots int) *OracleDrafter {
	return &OracleDrafter{Next: next, Block: block, slots: slots, seqs: map[engine.SeqID]*oracleSeq{}}
}

func (d *OracleDrafter) BlockSize() int       { return d.Block }
func (d *OracleDrafter) MaskToken() int32     { return -7 }
func (d *OracleDrafter) CaptureLayers() []int { return []int{0} }
func (d *OracleDrafter) FeatureSize() int     { return FeatureSize }

func (d *OracleDrafter) NewSeq() (engine.SeqID, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id := engine.SeqID(0); int(id) < d.slots; id++ {
		if _, used := d.seqs[id]; !used {
			d.seqs[id] = &oracleSeq{}
			return id, nil
		}
	}
	return 0, fmt.Errorf("every one of %d draft slots is in use", d.slots)
}

func (d *OracleDrafter) FreeSeq(id engine.SeqID) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.seqs[id]; !ok {
		return d.fail(fmt.Errorf("free unknown draft sequence %d", id))
	}
	delete(d.seqs, id)
	return nil
}

func (d *OracleDrafter) Reserve(id engine.SeqID, tokens int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.seqs[id]
	if !ok {
		return d.fail(fmt.Errorf("reserve for unknown draft sequence %d", id))
	}
	s.reserved = max(s.reserved, tokens)
	return nil
}

func (d *OracleDrafter) Truncate(id engine.SeqID, tokens int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, ok := d.seqs[id]
	if !ok || tokens > len(s.ctx) {
		return d.fail(fmt.Errorf("truncate draft sequence %d to %d", id, tokens))
	}
	s.ctx = s.ctx[:tokens]
	return nil
}

// Live is the number of draft sequences allocated.
func (d *OracleDrafter) Live() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.seqs)
}

func (d *OracleDrafter) fail(err error) error {
	d.Errs = append(d.Errs, err)
	return err
}

func (d *OracleDrafter) Draft(_ context.Context, in []engine.DraftInput, k int) (engine.Candidates, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.Drafts++
	c := engine.Candidates{K: k}
	for _, x := range in {
		s, ok := d.seqs[x.Seq]
		if !ok {
			return c, d.fail(fmt.Errorf("draft on unknown sequence %d", x.Seq))
		}
		if len(x.Features)%FeatureSize != 0 {
			return c, d.fail(fmt.Errorf("draft sequence %d: %d feature floats", x.Seq, len(x.Features)))
		}
		if need := len(s.ctx) + len(x.Features)/FeatureSize + len(x.Block); need > s.reserved {
			return c, d.fail(fmt.Errorf("draft sequence %d: %d tokens, %d reserved", x.Seq, need, s.reserved))
		}
		for i := 0; i < len(x.Features); i += FeatureSize {
			if pos := int(x.Features[i+1]); pos != len(s.ctx) {
				return c, d.fail(fmt.Errorf("draft sequence %d: context row for position %d after %d rows", x.Seq, pos, len(s.ctx)))
			}
			s.ctx = append(s.ctx, int32(x.Features[i]))
		}
		if len(x.Block) == 0 {
			continue
		}
		hist := append(append([]int32(nil), s.ctx...), x.Block[0])
		for j := 1; j < len(x.Block); j++ {
			if x.Block[j] != d.MaskToken() {
				return c, d.fail(fmt.Errorf("draft sequence %d: block position %d is %d, not the mask", x.Seq, j, x.Block[j]))
			}
			if x.Sample != nil && d.Dist != nil {
				hist = append(hist, d.drawProposal(&c, hist, k, x.Sample))
				continue
			}
			p := d.Next(hist)
			hist = append(hist, p)
			cands := []int32{p}
			if d.Wrong != nil && d.Wrong(len(s.ctx)+j) {
				cands = []int32{wrongToken(p), p}
			}
			for r := 0; r < k; r++ {
				id, v := int32(-1), float32(math.Inf(-1))
				if r < len(cands) {
					id, v = cands[r], float32(-r)
				}
				c.IDs = append(c.IDs, id)
				c.Logits = append(c.Logits, v)
			}
			c.LSE = append(c.LSE, 1)
			if c.Probs != nil {
				c.Probs = append(c.Probs, make([]float32, k)...)
			}
		}
	}
	return c, nil
}

// drawProposal appends one sampled row to c: the k best tokens of Dist(hist), the one drawn first, and their
// probabilities. It returns the drawn token.
func (d *OracleDrafter) drawProposal(c *engine.Candidates, hist []int32, k int, smp *engine.DraftSample) int32 {
	row := d.Dist(hist)
	ids := make([]int32, len(row))
	for i := range ids {
		ids[i] = int32(i)
	}
	slices.SortStableFunc(ids, func(a, b int32) int { return cmp.Compare(row[b], row[a]) })
	ids = ids[:k]
	scores := make([]float64, k)
	for i, id := range ids {
		scores[i] = float64(row[id])
	}
	probs := make([]float32, k)
	j := engine.DrawCandidate(scores, smp.Temperature, smp.Rng, probs)
	ids[0], ids[j] = ids[j], ids[0]
	probs[0], probs[j] = probs[j], probs[0]
	scores[0], scores[j] = scores[j], scores[0]
	if c.Probs == nil {
		c.Probs = make([]float32, len(c.IDs)) // rows of earlier inputs: not sampled
	}
	for i, id := range ids {
		c.IDs = append(c.IDs, id)
		c.Logits = append(c.Logits, float32(scores[i]))
	}
	c.Probs = append(c.Probs, probs...)
	c.LSE = append(c.LSE, 1)
	return ids[0]
}

// wrongToken is a token other than p.
func wrongToken(p int32) int32 {
	if p == 'x' {
		return 'y'
	}
	return 'x'
}

// softmaxWeights is exp((logit - max) / temp) of each logit, and their sum.
func softmaxWeights(logits []float32, temp float32) ([]float64, float64) {
	mx := math.Inf(-1)
	for _, v := range logits {
		mx = math.Max(mx, float64(v))
	}
	w := make([]float64, len(logits))
	sum := 0.0
	for i, v := range logits {
		w[i] = math.Exp((float64(v) - mx) / float64(temp))
		sum += w[i]
	}
	return w, sum
}

// drawSoftmax draws an index from softmax(logits / temp) with a xorshift64* step of rng.
func drawSoftmax(logits []float32, temp float32, rng *uint64) int32 {
	w, sum := softmaxWeights(logits, temp)
	x := *rng
	x ^= x >> 12
	x ^= x << 25
	x ^= x >> 27
	*rng = x
	u := float64((x*0x2545F4914F6CDD1D)>>11) / float64(1<<53) * sum
	for i, v := range w {
		if u < v {
			return int32(i)
		}
		u -= v
	}
	return int32(len(w) - 1)
}
