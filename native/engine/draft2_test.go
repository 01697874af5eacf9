package engine

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/matryer/is"
)

// checkTrans compares a DFlash2 result's transition scores of entry e with the reference for its candidates.
func checkTrans(t *testing.T, what string, res *Result, e int, ref *refDraft, root int32) {
	t.Helper()
	var cands [][]int32
	for i := 0; ; i++ {
		ids, _, _, ok := res.Candidates(e, i)
		if !ok {
			break
		}
		cands = append(cands, ids)
	}
	want := ref.trans(root, cands)
	for row := range cands {
		got := res.Transitions(e, row)
		if len(got) != res.K*res.K {
			t.Fatalf("%s: entry %d row %d: %d transition scores, want %d", what, e, row, len(got), res.K*res.K)
		}
		for i := 0; i < res.K; i++ {
			for j := 0; j < res.K; j++ {
				w := want[row][i][j]
				if d := math.Abs(float64(got[i*res.K+j]) - w); d > 1e-4*math.Max(1, math.Abs(w)) {
					t.Errorf("%s: entry %d row %d trans[%d][%d] = %g, reference %g", what, e, row, i, j, got[i*res.K+j], w)
				}
			}
		}
	}
}

func TestDraft2MatchesReference(t *testing.T) {
	lib := openCPU(t)
	cases := []struct {
		name string
		cfg  func(*draftConfig)
	}{
		{"sliding both ways + full", func(*draftConfig) {}},
		{"kernel 3, group 8, logit scale and softcap", func(c *draftConfig) {
			c.convK, c.convGroup, c.logitScale, c.softcap = 3, 8, 1.5, 3
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			c := tinyDraft2()
			tc.cfg(&c)
			m, spec := loadDraft(t, lib, c)
			is.True(m.Info().DFlash2())
			is.Equal(m.Info().SelectorTopK, c.selTopK)
			ref := newRefDraft(c, spec)
			rng := rand.New(rand.NewPCG(15, 16))
			a, b := must(m.NewSeq()), must(m.NewSeq())
			ra, rb := ref.newSeq(), ref.newSeq()
			steps := []struct{ ctxA, blkA, ctxB, blkB int }{{7, 8, 13, 4}, {3, 8, 1, 2}}
			for si, st := range steps {
				fa, fb := randomFeatures(rng, st.ctxA, c.feat), randomFeatures(rng, st.ctxB, c.feat)
				ba, bb := randomTokens(rng, st.blkA, c.vocab), randomTokens(rng, st.blkB, c.vocab)
				res, err := m.DraftForward([]DraftEntry{{Seq: a, Features: fa, Block: ba}, {Seq: b, Features: fb, Block: bb}}, c.selTopK)
				is.NoErr(err)
				rows := st.blkA - 1 + st.blkB - 1
				is.Equal(len(res.Trans), rows*c.selTopK*c.selTopK)
				what := fmt.Sprintf("step %d", si)
				checkRows(t, what, res, 0, ref.step(ra, fa, ba))
				checkTrans(t, what, res, 0, ref, ba[0])
				checkRows(t, what, res, 1, ref.step(rb, fb, bb))
				checkTrans(t, what, res, 1, ref, bb[0])
				is.Equal(must(m.SeqLen(a)), len(ra.K[0]))
			}
		})
	}
}

func TestDraft2BatchedEqualsAlone(t *testing.T) {
	is := is.New(t)
	c := tinyDraft2()
	m, _ := loadDraft(t, openCPU(t), c)
	rng := rand.New(rand.NewPCG(20, 21))
	type part struct {
		feats []float32
		block []int32
	}
	parts := []part{
		{randomFeatures(rng, 9, c.feat), randomTokens(rng, 8, c.vocab)},
		{randomFeatures(rng, 2, c.feat), randomTokens(rng, 1, c.vocab)}, // one block token: no rows
		{randomFeatures(rng, 20, c.feat), randomTokens(rng, 5, c.vocab)},
		{randomFeatures(rng, 4, c.feat), randomTokens(rng, 8, c.vocab)},
	}
	var batch []DraftEntry
	for _, p := range parts {
		batch = append(batch, DraftEntry{Seq: must(m.NewSeq()), Features: p.feats, Block: p.block})
	}
	k := c.selTopK
	res, err := m.DraftForward(batch, k)
	is.NoErr(err)
	is.Equal(len(res.LSE), 7+4+7)
	for i, p := range parts {
		s := must(m.NewSeq())
		alone, err := m.DraftForward([]DraftEntry{{Seq: s, Features: p.feats, Block: p.block}}, k)
		is.NoErr(err)
		for r := 0; r < len(p.block)-1; r++ {
			ids, logits, lse, ok := res.Candidates(i, r)
			is.True(ok)
			aids, alogits, alse, _ := alone.Candidates(0, r)
			is.Equal(ids, aids)
			if e := relErr(append(logits, lse), append(alogits, alse)); e > 1e-5 {
				t.Errorf("entry %d row %d: batched vs alone rel err %g", i, r, e)
			}
			if e := relErr(res.Transitions(i, r), alone.Transitions(0, r)); e > 1e-5 {
				t.Errorf("entry %d row %d: transitions batched vs alone rel err %g", i, r, e)
			}
		}
		is.NoErr(m.FreeSeq(s))
	}
}

func TestDraft2Errors(t *testing.T) {
	lib := openCPU(t)
	t.Run("incomplete keys", func(t *testing.T) {
		is := is.New(t)
		spec := randomDraftSpec(tinyDraft2())
		delete(spec.Meta, "dflash.selector_rank")
		_, err := lib.LoadModel(spec)
		is.True(errors.Is(err, ErrInvalid))
	})
	t.Run("missing selector", func(t *testing.T) {
		is := is.New(t)
		spec := randomDraftSpec(tinyDraft2())
		drop(&spec, "selector_successor.weight")
		_, err := lib.LoadModel(spec)
		is.True(errors.Is(err, ErrInvalid))
	})
	t.Run("v1 draft has no transitions", func(t *testing.T) {
		is := is.New(t)
		m, _ := loadDraft(t, lib, tinyDraft())
		is.True(!m.Info().DFlash2())
		res, err := m.DraftForward([]DraftEntry{{Seq: must(m.NewSeq()), Block: []int32{1, 2, 3}}}, 4)
		is.NoErr(err)
		is.True(res.Trans == nil)
	})
}

// TestDraft2DeviceMatchesReference runs DFlash2 draft steps on the device under test ($DFLASH_TEST_DEVICE): logits
// as TestDraftDeviceMatchesReference, transition scores within deviceBound of the largest reference score.
func TestDraft2DeviceMatchesReference(t *testing.T) {
	lib := testDevice(t)
	is := is.New(t)
	c := tinyDraft2()
	m, spec := loadDraft(t, lib, c)
	is.True(m.Info().DFlash2())
	ref := newRefDraft(c, spec)
	rng := rand.New(rand.NewPCG(25, 26))
	a, b := must(m.NewSeq()), must(m.NewSeq())
	ra, rb := ref.newSeq(), ref.newSeq()
	worst := 0.0
	for si, st := range []struct{ ctxA, blkA, ctxB, blkB int }{{7, 8, 13, 4}, {300, 8, 40, 8}} {
		fa, fb := randomFeatures(rng, st.ctxA, c.feat), randomFeatures(rng, st.ctxB, c.feat)
		ba, bb := randomTokens(rng, st.blkA, c.vocab), randomTokens(rng, st.blkB, c.vocab)
		is.NoErr(m.Reserve(a, must(m.SeqLen(a))+st.ctxA+st.blkA))
		is.NoErr(m.Reserve(b, must(m.SeqLen(b))+st.ctxB+st.blkB))
		res, err := m.DraftForward([]DraftEntry{{Seq: a, Features: fa, Block: ba}, {Seq: b, Features: fb, Block: bb}}, c.selTopK)
		is.NoErr(err)
		for e, x := range []struct {
			r     *refSeq
			f     []float32
			block []int32
		}{{ra, fa, ba}, {rb, fb, bb}} {
			what := fmt.Sprintf("step %d", si)
			worst = math.Max(worst, deviceRowsError(t, what, res, e, ref.step(x.r, x.f, x.block)))
			var cands [][]int32
			for i := 0; ; i++ {
				ids, _, _, ok := res.Candidates(e, i)
				if !ok {
					break
				}
				cands = append(cands, ids)
			}
			want := ref.trans(x.block[0], cands)
			for row := range cands {
				got := res.Transitions(e, row)
				span := 1e-6
				for _, wi := range want[row] {
					for _, w := range wi {
						span = math.Max(span, math.Abs(w))
					}
				}
				for i, wi := range want[row] {
					for j, w := range wi {
						worst = math.Max(worst, math.Abs(float64(got[i*res.K+j])-w)/span)
					}
				}
			}
		}
	}
	t.Logf("worst error: %.2e of the row's range", worst)
	if worst > deviceBound {
		t.Fatalf("DFlash2 draft on %s differs from the reference by %.3g (bound %g)", lib.Kind(), worst, deviceBound)
	}
}
