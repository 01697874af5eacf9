package engine_test

import (
	"context"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/engine/enginetest"
)

// specEngine is an engine over a fake target and an oracle drafter of the given block.
func specEngine(t *testing.T, m *enginetest.FakeModel, d *enginetest.OracleDrafter, cfg engine.Config) *engine.Engine {
	t.Helper()
	cfg.Drafter = d
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
	blocks := 0
	for _, step := range m.Steps() {
		n := 0
		for _, ent := range step {
			if ent.Logits == engine.LogitsAll {
				n++
			}
		}
		if n > 1 {
			blocks++
		}
	}
	is.True(blocks > 0) // several sequences verified their blocks in one forward
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
