package engine_test

import (
	"context"
	"math"
	"sort"
	"testing"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/engine/enginetest"
	"github.com/matryer/is"
)

// candidateFake is the fake model with a CandidateModel forward computed from its own logits rows (best first, lower
// id on ties), counting the forwards that went each way.
type candidateFake struct {
	*enginetest.FakeModel
	candidateForwards int
	maxK              int // the most candidates a forward asked for
}

func (c *candidateFake) ForwardCandidates(ctx context.Context, batch []engine.SeqInput, k int) (engine.Candidates, error) {
	logits, err := c.FakeModel.Forward(ctx, batch)
	if err != nil {
		return engine.Candidates{}, err
	}
	c.candidateForwards++
	c.maxK = max(c.maxK, k)
	v := c.VocabSize()
	rows := len(logits) / v
	out := engine.Candidates{K: k, IDs: make([]int32, rows*k), Logits: make([]float32, rows*k), LSE: make([]float32, rows)}
	for r := 0; r < rows; r++ {
		row := logits[r*v : (r+1)*v]
		idx := make([]int, v)
		for i := range idx {
			idx[i] = i
		}
		sort.SliceStable(idx, func(a, b int) bool { return row[idx[a]] > row[idx[b]] })
		var sum float64
		for _, x := range row {
			sum += math.Exp(float64(x - row[idx[0]]))
		}
		out.LSE[r] = row[idx[0]] + float32(math.Log(sum))
		for j := 0; j < k; j++ {
			out.IDs[r*k+j], out.Logits[r*k+j] = int32(idx[j]), row[idx[j]]
		}
	}
	return out, nil
}

func TestCandidateSteps(t *testing.T) {
	tests := []struct {
		name           string
		edit           func(*engine.Request)
		wantCandidates bool
		wantK          int // candidates asked per row: the pick or the top-k, and the one end-of-generation id
	}{
		{"greedy", func(*engine.Request) {}, true, 2},
		{"ignore eos suppresses it among the candidates", func(r *engine.Request) { r.IgnoreEOS = true }, true, 2},
		{"top-k sampling", func(r *engine.Request) { r.Sampling.Temperature, r.Sampling.TopK = 0.8, 5 }, true, 6},
		{"top-k sampling, eos suppressed", func(r *engine.Request) {
			r.Sampling.Temperature, r.Sampling.TopK, r.IgnoreEOS = 0.8, 5, true
		}, true, 6},
		{"sampling over the whole vocabulary", func(r *engine.Request) { r.Sampling.Temperature = 0.8 }, false, 0},
		{"top-k larger than the candidates", func(r *engine.Request) { r.Sampling.Temperature, r.Sampling.TopK = 0.8, 64 }, false, 0},
		{"logprobs", func(r *engine.Request) { r.Logprobs, r.TopLogprobs = true, 2 }, true, 3},
		{"logprobs, eos suppressed", func(r *engine.Request) { r.Logprobs, r.TopLogprobs, r.IgnoreEOS = true, 2, true }, false, 0},
		{"penalties", func(r *engine.Request) { r.Sampling.PresencePenalty, r.Sampling.PenaltyLastN = 0.5, -1 }, false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			generate := func(m engine.Model) *collector {
				req := request("q", 6)
				tc.edit(req)
				e, err := engine.New(engine.Config{Model: m, Vocab: enginetest.ByteVocab{}, MaxCtx: 256})
				is.NoErr(err)
				defer e.Close(context.Background())
				c, err := run(e, req)
				is.NoErr(err)
				return c
			}
			plain := enginetest.NewFakeModel(4, 64, 1)
			plain.Next = enginetest.Reply(1, enginetest.Encode("ok"))
			want := generate(plain).result()
			fake := &candidateFake{FakeModel: enginetest.NewFakeModel(4, 64, 1)}
			fake.Next = enginetest.Reply(1, enginetest.Encode("ok"))
			gotC := generate(fake)
			got := gotC.result()
			is.Equal(got.text, want.text) // the candidates decide as the whole row does
			// and give the same log-probabilities (to rounding: the row's log-sum-exp is summed another way)
			wantLP, gotLP := logprobsOf(generate(plain)), logprobsOf(gotC)
			is.Equal(len(gotLP), len(wantLP))
			for i := range wantLP {
				is.Equal(gotLP[i].Token, wantLP[i].Token)
				is.True(math.Abs(gotLP[i].Logprob-wantLP[i].Logprob) < 1e-5)
				is.Equal(len(gotLP[i].Top), len(wantLP[i].Top))
				for j := range wantLP[i].Top {
					is.Equal(gotLP[i].Top[j].Token, wantLP[i].Top[j].Token)
					is.True(math.Abs(gotLP[i].Top[j].Logprob-wantLP[i].Top[j].Logprob) < 1e-5)
				}
			}
			is.Equal(fake.candidateForwards > 0, tc.wantCandidates) // and are used only where they suffice
			is.Equal(fake.maxK, tc.wantK)                           // no more of them than the rows need
		})
	}
}

// logprobsOf is every token's log-probability entry of a finished stream, in order.
func logprobsOf(c *collector) []sdk.TokenLogprob {
	var out []sdk.TokenLogprob
	for _, ev := range c.events {
		out = append(out, ev.Logprobs...)
	}
	return out
}
