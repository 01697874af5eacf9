package engine_test

import (
	"context"
	"errors"
	"math"
	"sort"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/engine/enginetest"
)

// candSampler is FakeModel as a CandidateSampler whose candidates never decide a draw: each row's best k (lower id on
// ties) and its log-sum-exp, SampleCandidates always open, LogitsRow the last forward's whole rows (or rowErr). What
// the engine does around a CandidateSampler is then observable without a native sampler: the rows it fetches, the
// pacer, the errors.
type candSampler struct {
	*enginetest.FakeModel
	rows                []float32
	rowErr              error
	candSteps, rowSteps int
	draws               int
}

const vocab = enginetest.VocabSize

func (c *candSampler) Forward(ctx context.Context, batch []engine.SeqInput) ([]float32, error) {
	c.rowSteps++
	return c.FakeModel.Forward(ctx, batch)
}

func (c *candSampler) ForwardCandidates(ctx context.Context, batch []engine.SeqInput, k int) (engine.Candidates, error) {
	rows, err := c.FakeModel.Forward(ctx, batch)
	if err != nil {
		return engine.Candidates{}, err
	}
	c.candSteps++
	c.rows = append(c.rows[:0], rows...)
	n := len(rows) / vocab
	out := engine.Candidates{K: k, IDs: make([]int32, n*k), Logits: make([]float32, n*k), LSE: make([]float32, n)}
	for r := range n {
		row := rows[r*vocab : (r+1)*vocab]
		order := make([]int32, vocab)
		for i := range order {
			order[i] = int32(i)
		}
		sort.SliceStable(order, func(a, b int) bool { return row[order[a]] > row[order[b]] })
		mx, sum := float64(row[order[0]]), 0.0
		for _, v := range row {
			sum += math.Exp(float64(v) - mx)
		}
		out.LSE[r] = float32(mx + math.Log(sum))
		for j := range k {
			id, v := int32(-1), float32(math.Inf(-1))
			if !math.IsInf(float64(row[order[j]]), -1) {
				id, v = order[j], row[order[j]]
			}
			out.IDs[r*k+j], out.Logits[r*k+j] = id, v
		}
	}
	return out, nil
}

func (c *candSampler) SampleCandidates(_ []int32, _ []float32, _ []bool, _ float32, _ *engine.Sampling, _ *uint64) (int32, bool, error) {
	c.draws++
	return 0, false, nil
}

func (c *candSampler) LogitsRow(row int, dst []float32) error {
	if c.rowErr != nil {
		return c.rowErr
	}
	copy(dst, c.rows[row*vocab:(row+1)*vocab])
	return nil
}

// TestCandidateSamplerOpenDraws: sampled requests without top-k on a CandidateSampler take candidate steps; a draw the
// candidates leave open samples the whole row the model hands back for its row of the step (four requests batched:
// each gets its own row, the tokens of a model without the sampler), the pacer goes back to whole-row steps when most
// draws are open, and a row the model cannot hand back ends the request with an error naming it.
func TestCandidateSamplerOpenDraws(t *testing.T) {
	prompts := []string{"the cat", "a longer prompt of several chunks", "x", "hello there"}
	generate := func(t *testing.T, m engine.Model, fake *enginetest.FakeModel, tokens int) ([][]int32, []error) {
		t.Helper()
		e, err := engine.New(engine.Config{Model: m, Vocab: enginetest.ByteVocab{}, MaxCtx: 512, StepTokens: 8})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close(context.Background())
		g := holdForwards(fake)
		runs := make([]*async, len(prompts))
		for i, p := range prompts {
			r := request(p, tokens)
			r.Sampling = engine.Sampling{Temperature: 1, TopP: 1, Seed: uint64(i + 1)}
			runs[i] = start(context.Background(), e, r)
			waitAdmitted(t, runs[i])
		}
		g.open()
		out, errs := make([][]int32, len(prompts)), make([]error, len(prompts))
		for i, a := range runs {
			a.wait(t)
			out[i], errs[i] = a.c.result().tokens, a.err
		}
		return out, errs
	}
	newFake := func() *enginetest.FakeModel {
		m := enginetest.NewFakeModel(4, 512, 4)
		m.Dist = letterLogits
		return m
	}

	t.Run("whole rows decide open draws", func(t *testing.T) {
		is := is.New(t)
		plain := newFake()
		want, _ := generate(t, plain, plain, 16)
		fake := newFake()
		cs := &candSampler{FakeModel: fake}
		got, errs := generate(t, cs, fake, 16)
		for i := range prompts {
			is.NoErr(errs[i])
			is.Equal(len(got[i]), 16)
			is.Equal(got[i], want[i]) // each request sampled its own row
		}
		is.True(cs.candSteps > 0 && cs.draws > 0) // candidate steps, their draws left open
	})
	t.Run("the pacer goes back to whole rows", func(t *testing.T) {
		is := is.New(t)
		fake := newFake()
		cs := &candSampler{FakeModel: fake}
		_, errs := generate(t, cs, fake, 64)
		for _, err := range errs {
			is.NoErr(err)
		}
		is.True(cs.draws < 4*64/2) // paused long before every draw went through candidates
		is.True(cs.rowSteps > 0)   // whole-row steps after it
	})
	t.Run("a row the model cannot hand back", func(t *testing.T) {
		is := is.New(t)
		fake := newFake()
		cs := &candSampler{FakeModel: fake, rowErr: errors.New("no such row")}
		_, errs := generate(t, cs, fake, 8)
		for _, err := range errs {
			is.True(err != nil)
			is.True(strings.Contains(err.Error(), "the whole logits row: no such row")) // names the cause
		}
	})
}
