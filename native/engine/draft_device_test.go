package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/matryer/is"
)

// TestDraftDeviceMatchesReference runs the draft steps of TestDraftMatchesReference on the device under test
// ($DFLASH_TEST_DEVICE): every candidate logit and log-sum-exp within deviceBound of the row's range of the float64
// reference, for each attention-mask variant. The last three steps have one shape: a device with graphs runs the
// first op by op, captures the second and replays the third.
func TestDraftDeviceMatchesReference(t *testing.T) {
	lib := testDevice(t)
	zero := 0
	for _, tc := range []struct {
		name string
		cfg  func(*draftConfig)
	}{
		{"sliding causal + full", func(*draftConfig) {}},
		{"sliding both ways + full", func(c *draftConfig) { c.causal = &zero }},
		{"no sliding, logit scale and softcap", func(c *draftConfig) { c.window, c.logitScale, c.softcap = 0, 1.5, 3 }},
		{"block of 16 over a long context", func(c *draftConfig) { c.window = 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			c := tinyDraft()
			tc.cfg(&c)
			m, spec := loadDraft(t, lib, c)
			ref := newRefDraft(c, spec)
			rng := rand.New(rand.NewPCG(5, 6))
			a, b := must(m.NewSeq()), must(m.NewSeq())
			ra, rb := ref.newSeq(), ref.newSeq()
			steps := []struct{ ctxA, blkA, ctxB, blkB int }{{7, 6, 13, 4}, {3, 5, 1, 8}, {300, 16, 40, 16}, {5, 8, 3, 8},
				{5, 8, 3, 8}, {5, 8, 3, 8}}
			worst := 0.0
			for si, st := range steps {
				fa, fb := randomFeatures(rng, st.ctxA, c.feat), randomFeatures(rng, st.ctxB, c.feat)
				ba, bb := randomTokens(rng, st.blkA, c.vocab), randomTokens(rng, st.blkB, c.vocab)
				is.NoErr(m.Reserve(a, must(m.SeqLen(a))+st.ctxA+st.blkA))
				is.NoErr(m.Reserve(b, must(m.SeqLen(b))+st.ctxB+st.blkB))
				res, err := m.DraftForward([]DraftEntry{{Seq: a, Features: fa, Block: ba}, {Seq: b, Features: fb, Block: bb}}, 8)
				is.NoErr(err)
				worst = math.Max(worst, deviceRowsError(t, fmt.Sprintf("step %d", si), res, 0, ref.step(ra, fa, ba)))
				worst = math.Max(worst, deviceRowsError(t, fmt.Sprintf("step %d", si), res, 1, ref.step(rb, fb, bb)))
			}
			t.Logf("worst candidate error: %.2e of the row's range", worst)
			if worst > deviceBound {
				t.Fatalf("draft on %s differs from the reference by %.3g of a row's range (bound %g)", lib.Kind(), worst, deviceBound)
			}
		})
	}
}

// deviceRowsError is the largest error of entry e's candidate logits and lse against the reference rows, relative to
// each row's range.
func deviceRowsError(t *testing.T, what string, res *Result, e int, want [][]float64) float64 {
	t.Helper()
	worst := 0.0
	for i, row := range want {
		ids, logits, lse, ok := res.Candidates(e, i)
		if !ok {
			t.Fatalf("%s: entry %d has no row %d", what, e, i)
		}
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, x := range row {
			lo, hi = math.Min(lo, x), math.Max(hi, x)
		}
		z := 0.0
		for _, x := range row {
			z += math.Exp(x - hi)
		}
		span := math.Max(hi-lo, 1e-6)
		for j, id := range ids {
			worst = math.Max(worst, math.Abs(float64(logits[j])-row[id])/span)
		}
		worst = math.Max(worst, math.Abs(float64(lse)-(hi+math.Log(z)))/span)
	}
	return worst
}
