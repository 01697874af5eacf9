package engine_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/engine/enginetest"
)

// specEngine is an engine over a fake target and an oracle drafter of the given block.
func specEngine(t *testing.T, m *enginetest.FakeModel, d *enginetest.OracleDrafter, cfg engine.Config) *engine.Engine {
	t.Helper()
	cfg.Drafter, cfg.DraftAlways = d, true
	return newEngine(t, m, cfg)
}

// plainTokens is what target-only decoding generates for prompt.
func plainTokens(t *testing.T, prompt string, maxTokens int, recurrent bool) []int32 {
	t.Helper()
	m := enginetest.NewFakeModel(4, 128, 1)
	m.RecurrentState = recurrent
	c, err := run(newEngine(t, m, engine.Config{StepTokens: 16}), request(prompt, maxTokens))
	if err != nil {
		t.Fatal(err)
	}
	return c.result().tokens
}

func TestSpeculativeGreedyEqualsTargetOnly(t *testing.T) {
	every := func(n int) func(int) bool { return func(pos int) bool { return pos%n == 0 } }
	cases := []struct {
		name      string
		block     int
		verify    int // Config.DraftBlock
		wrong     func(int) bool
		recurrent bool
		wantAL    func(al float64) bool
	}{
		{name: "all accepted", block: 8, wantAL: func(al float64) bool { return al > 6 }},
		{name: "none accepted", block: 8, wrong: func(int) bool { return true }, wantAL: func(al float64) bool { return al == 1 }},
		{name: "every third wrong", block: 16, wrong: every(3), wantAL: func(al float64) bool { return al > 1.5 && al < 4 }},
		{name: "every fifth wrong, recurrent target", block: 16, wrong: every(5), recurrent: true, wantAL: func(al float64) bool { return al > 2 }},
		{name: "verify fewer than the block", block: 16, verify: 4, wantAL: func(al float64) bool { return al > 3 && al <= 4 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			for _, prompt := range []string{"the cat sat", "a", "speculative decoding keeps the target's output"} {
				want := plainTokens(t, prompt, 50, tc.recurrent)
				m := enginetest.NewFakeModel(4, 128, 1)
				m.RecurrentState = tc.recurrent
				d := enginetest.NewOracleDrafter(enginetest.Letters, tc.block, 1)
				d.Wrong = tc.wrong
				e := specEngine(t, m, d, engine.Config{StepTokens: 16, DraftBlock: tc.verify})
				c, err := run(e, request(prompt, 50))
				is.NoErr(err)
				r := c.result()
				is.Equal(r.tokens, want) // speculation never changes greedy output
				is.Equal(d.Errs, nil)    // the draft always got exactly the context it needed
				tm := r.finish.Timings
				is.True(tm.DraftSteps > 0)
				al := float64(tm.DraftAccepted+tm.DraftSteps) / float64(tm.DraftSteps)
				is.True(tc.wantAL(al)) // acceptance length as the drafter was told to behave
				is.Equal(e.Stats().DraftSteps, int64(tm.DraftSteps))
				is.Equal(m.LiveSeqs(), 0)
				is.Equal(d.Live(), 0)
			}
		})
	}
}

func TestSpeculativeBatchedEqualsAlone(t *testing.T) {
	is := is.New(t)
	prompts := []string{"the cat", "a much longer prompt that takes several chunks", "x", "hello there"}
	m := enginetest.NewFakeModel(4, 256, 4)
	d := enginetest.NewOracleDrafter(enginetest.Letters, 8, 4)
	d.Wrong = func(pos int) bool { return pos%4 == 1 }
	e := specEngine(t, m, d, engine.Config{StepTokens: 16})
	g := holdForwards(m)
	runs := make([]*async, len(prompts))
	for i, p := range prompts {
		runs[i] = start(context.Background(), e, request(p, 30))
		waitAdmitted(t, runs[i])
	}
	g.open()
	for i, a := range runs {
		a.wait(t)
		is.NoErr(a.err)
		is.Equal(a.c.result().tokens, plainTokens(t, prompts[i], 30, false))
	}
	is.Equal(d.Errs, nil)
	is.True(sharedVerifies(m) > 0) // several sequences verified their blocks in one forward
}

func TestSpeculativeStopsInsideABlock(t *testing.T) {
	is := is.New(t)
	reply := enginetest.Encode("hello world, this is the end")
	next := enginetest.Reply(len("prompt"), reply)
	cases := []struct {
		name      string
		maxTokens int
		stop      []string
		want      string
		reason    sdk.FinishReason
	}{
		{name: "end of generation", maxTokens: 100, want: "hello world, this is the end", reason: sdk.FinishStop},
		{name: "max tokens", maxTokens: 7, want: "hello w", reason: sdk.FinishLength},
		{name: "stop string", maxTokens: 100, stop: []string{"this"}, want: "hello world, ", reason: sdk.FinishStopSequence},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := enginetest.NewFakeModel(4, 64, 1)
			m.Next = next
			d := enginetest.NewOracleDrafter(next, 16, 1)
			e := specEngine(t, m, d, engine.Config{StepTokens: 32})
			req := request("prompt", tc.maxTokens)
			req.Stop = tc.stop
			c, err := run(e, req)
			is.NoErr(err)
			r := c.result()
			is.Equal(r.text, tc.want)
			is.Equal(r.finish.Reason, tc.reason)
			is.True(r.events < 6) // whole blocks went out as one event each
			for _, step := range m.Steps() {
				for _, ent := range step {
					is.True(ent.Tokens <= 16)
				}
			}
			is.Equal(m.LiveSeqs(), 0)
		})
	}
}

func TestSpeculativePrefixCacheKeepsTheDraft(t *testing.T) {
	is := is.New(t)
	m := enginetest.NewFakeModel(4, 128, 3)
	d := enginetest.NewOracleDrafter(enginetest.Letters, 8, 3)
	e := specEngine(t, m, d, engine.Config{StepTokens: 16, PrefixCacheSlots: 1})
	first := "a shared system prompt, long enough to be cached"
	c, err := run(e, request(first, 20))
	is.NoErr(err)
	is.Equal(d.Live(), 1) // the cache entry kept its draft sequence
	// The next turn continues the first: prompt and reply, then more.
	second := first + string(c.result().text) + " and more"
	c2, err := run(e, request(second, 20))
	is.NoErr(err)
	r := c2.result()
	is.True(r.finish.Usage.CachedTokens >= len(first))
	is.Equal(r.tokens, plainTokens(t, second, 20, false))
	is.Equal(d.Errs, nil)
	is.True(r.finish.Timings.DraftAccepted > 0) // the adopted draft context was right
}

func TestSpeculativeConfigErrors(t *testing.T) {
	is := is.New(t)
	m := enginetest.NewFakeModel(4, 16, 1)
	_, err := engine.New(engine.Config{Model: m, Vocab: enginetest.ByteVocab{}, MaxCtx: 32,
		Drafter: enginetest.NewOracleDrafter(enginetest.Letters, 8, 1), DraftBlock: 9})
	is.True(err != nil) // a verify block larger than the draft's
	_, err = engine.New(engine.Config{Model: m, Vocab: enginetest.ByteVocab{}, MaxCtx: 32,
		Drafter: enginetest.NewOracleDrafter(enginetest.Letters, 1, 1)})
	is.True(err != nil) // a block with no proposal
}

// TestSpeculativeSamplingFollowsTheTarget checks that sampled speculative decoding is lossless: over many seeds, the
// first three generated tokens follow the target's own joint distribution (a chi-square test against the exact
// probabilities), whether the draft proposes the target's most likely token (sample-and-match: right about half the
// time) or draws its proposals from a distribution of its own (the speculative-sampling rule: the target's own, one
// near it, one far from it, which leaves most proposals to the residual draw).
func TestSpeculativeSamplingFollowsTheTarget(t *testing.T) {
	alphabet := []int32{'a', 'b', 'c', 'd'}
	// letters gives the four letters history-dependent logits (everything else impossible), salted.
	letters := func(history []int32, salt uint64, scale float32) []float32 {
		row := make([]float32, enginetest.VocabSize)
		for i := range row {
			row[i] = float32(math.Inf(-1))
		}
		h := uint64(1469598103934665603) ^ salt
		for _, t := range history {
			h = (h ^ uint64(t)) * 1099511628211
		}
		for i, a := range alphabet {
			row[a] = float32((h>>(8*i))&0xff) / 96 * scale // logits in [0, 2.7 * scale)
		}
		return row
	}
	dist := func(history []int32) []float32 { return letters(history, 0, 1) }
	argmax := func(history []int32) int32 {
		row := dist(history)
		best := alphabet[0]
		for _, a := range alphabet {
			if row[a] > row[best] {
				best = a
			}
		}
		return best
	}
	probs := func(history []int32) map[int32]float64 {
		row := dist(history)
		p, sum := map[int32]float64{}, 0.0
		for _, a := range alphabet {
			p[a] = math.Exp(float64(row[a]))
			sum += p[a]
		}
		for a := range p {
			p[a] /= sum
		}
		return p
	}
	const runs, n = 6000, 3
	cases := []struct {
		name  string
		draft func([]int32) []float32 // the draft's own distribution; nil: it proposes the target's argmax
		// minAccepted and maxAccepted bound the proposals accepted over all runs (each verifies one: the first
		// token comes from the prompt, the block holds the root and one proposal, then the bonus)
		minAccepted, maxAccepted int
	}{
		{"sample and match", nil, 2400, 3500},
		{"drafts drawn from the target's distribution", dist, runs, runs},
		{"drafts drawn near it", func(h []int32) []float32 { return letters(h, 0, 0.7) }, 5000, runs - 1},
		{"drafts drawn far from it", func(h []int32) []float32 { return letters(h, 99, 2) }, 800, 2400},
	}
	prompt := enginetest.Encode("sample")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			m := enginetest.NewFakeModel(4, 64, 1)
			m.Dist = dist
			d := enginetest.NewOracleDrafter(argmax, 4, 1)
			d.Dist = tc.draft
			e := specEngine(t, m, d, engine.Config{StepTokens: 16, SampledDrafts: true})
			counts := map[string]int{}
			accepted := 0
			for seed := range runs {
				req := &engine.Request{Prompt: prompt, MaxTokens: n, IgnoreEOS: true, Detokenizer: &enginetest.Detokenizer{},
					Sampling: engine.Sampling{Temperature: 1, Seed: uint64(seed)}}
				c, err := run(e, req)
				is.NoErr(err)
				r := c.result()
				is.Equal(len(r.tokens), n)
				counts[string(r.tokens)]++
				accepted += r.finish.Timings.DraftAccepted
			}
			is.Equal(d.Errs, nil)
			t.Logf("%d proposals accepted", accepted)
			is.True(accepted >= tc.minAccepted && accepted <= tc.maxAccepted)
			// Exact joint probabilities of every 3-letter continuation.
			chi2, cells := 0.0, 0
			var walk func(hist []int32, p float64)
			walk = func(hist []int32, p float64) {
				if len(hist) == len(prompt)+n {
					want := p * runs
					got := float64(counts[string(hist[len(prompt):])])
					chi2 += (got - want) * (got - want) / want
					cells++
					return
				}
				for a, q := range probs(hist) {
					walk(append(slices.Clone(hist), a), p*q)
				}
			}
			walk(slices.Clone(prompt), 1)
			is.Equal(cells, 64)
			// 63 degrees of freedom: the 99.9th percentile of chi-square is about 103.4.
			if chi2 > 103.4 {
				t.Fatalf("chi-square %.1f over 64 cells: speculative samples do not follow the target's distribution", chi2)
			}
			t.Logf("chi-square %.1f (63 dof)", chi2)
		})
	}
}

// failingDist is the fake model with a SampleDist that fails (a library without sample_dist).
type failingDist struct{ *enginetest.FakeModel }

func (failingDist) SampleDist([]float32, *engine.Sampling, []int32, []int32, []float64) (int, error) {
	return 0, errors.New("the engine library predates sample_dist")
}

// TestSampledDraftsWithoutSampleDist: when the model cannot say what its sampler draws from, drawn proposals are
// verified by sample-and-match (lossless for any proposal) instead of failing the request.
func TestSampledDraftsWithoutSampleDist(t *testing.T) {
	is := is.New(t)
	m := enginetest.NewFakeModel(4, 64, 1)
	m.Dist = func(h []int32) []float32 { // two letters, history-independent: the draft's draws are often right
		row := make([]float32, enginetest.VocabSize)
		for i := range row {
			row[i] = float32(math.Inf(-1))
		}
		row['a'], row['b'] = 1, 0.5
		return row
	}
	d := enginetest.NewOracleDrafter(enginetest.Letters, 4, 1)
	d.Dist = m.Dist
	e, err := engine.New(engine.Config{Model: failingDist{m}, Vocab: enginetest.ByteVocab{}, MaxCtx: 256,
		Drafter: d, DraftAlways: true, SampledDrafts: true})
	is.NoErr(err)
	defer e.Close(context.Background())
	req := request("q", 32)
	req.IgnoreEOS, req.Sampling = true, engine.Sampling{Temperature: 1, Seed: 5}
	c, err := run(e, req)
	is.NoErr(err)
	r := c.result()
	is.Equal(len(r.tokens), 32)
	is.True(r.finish.Timings.DraftAccepted > 0)
}

// TestSpeculativePacing: by default the engine drafts only while drafting pays. The fake target's forwards take
// controlled time (1 ms, plus a cost per verified row beyond the first); with a draft that is always wrong and
// costly rows the engine soon decodes mostly plainly, with a draft that is always right and cheap rows it keeps
// drafting. The output is the target's either way.
func TestSpeculativePacing(t *testing.T) {
	cases := []struct {
		name    string
		wrong   func(int) bool
		perRow  time.Duration
		drafted func(steps, tokens int) bool
	}{
		{"drafting costs more than it gives", func(int) bool { return true }, 2 * time.Millisecond,
			func(steps, tokens int) bool { return steps < tokens/3 }},
		{"drafting pays", nil, 100 * time.Microsecond,
			func(steps, tokens int) bool { return steps > tokens/16 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			const tokens = 200
			m := enginetest.NewFakeModel(4, 256, 1)
			m.BeforeForward = func(batch []engine.SeqInput) {
				d := time.Millisecond
				for _, in := range batch {
					if in.Logits == engine.LogitsAll {
						d += time.Duration(len(in.Tokens)-1) * tc.perRow
					}
				}
				time.Sleep(d)
			}
			d := enginetest.NewOracleDrafter(enginetest.Letters, 8, 1)
			d.Wrong = tc.wrong
			e := newEngine(t, m, engine.Config{StepTokens: 16, MaxCtx: 512, Drafter: d})
			c, err := run(e, request("pace me", tokens))
			is.NoErr(err)
			r := c.result()
			is.Equal(r.tokens, plainTokens(t, "pace me", tokens, false))
			steps := r.finish.Timings.DraftSteps
			t.Logf("%d verify steps for %d tokens, %d accepted", steps, tokens, r.finish.Timings.DraftAccepted)
			is.True(tc.drafted(steps, tokens))
		})
	}
}

// sharedVerifies counts the forwards of m in which more than one sequence verified a draft block or tree.
func sharedVerifies(m *enginetest.FakeModel) int {
	shared := 0
	for _, step := range m.Steps() {
		n := 0
		for _, ent := range step {
			if ent.Logits == engine.LogitsAll {
				n++
			}
		}
		if n > 1 {
			shared++
		}
	}
	return shared
}
