package engine_test

import (
	"context"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/engine/enginetest"
)

// TestTreeVerification: with tree verification the output is still the target's own, and where the draft's best
// candidate is wrong but its second is right, the tree keeps going where the chain stops.
func TestTreeVerification(t *testing.T) {
	every := func(n int) func(int) bool { return func(pos int) bool { return pos%n == 0 } }
	cases := []struct {
		name      string
		budget    int
		wrong     func(int) bool
		recurrent bool
		// tree and chain acceptance lengths
		check func(tree, chain float64) bool
	}{
		{"second candidates recover", 22, every(3), false, func(tree, chain float64) bool { return tree > 1.8*chain }},
		{"recurrent target", 22, every(4), true, func(tree, chain float64) bool { return tree > 1.5*chain }},
		{"small budget stays a chain", 3, every(3), false, func(tree, chain float64) bool { return tree >= 1.5 }},
		{"all right", 22, nil, false, func(tree, chain float64) bool { return tree > 6 && tree >= chain }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			al := func(budget int, prompt string) (float64, []int32) {
				m := enginetest.NewFakeModel(4, 128, 2)
				m.RecurrentState = tc.recurrent
				d := enginetest.NewOracleDrafter(enginetest.Letters, 8, 2)
				d.Wrong = tc.wrong
				e := newEngine(t, m, engine.Config{StepTokens: 64, Drafter: d, DraftAlways: true, TreeBudget: budget})
				c, err := run(e, request(prompt, 60))
				is.NoErr(err)
				is.Equal(d.Errs, nil) // the draft got exactly the context of the kept paths
				tm := c.result().finish.Timings
				is.True(tm.DraftSteps > 0)
				is.Equal(m.LiveSeqs(), 0)
				return float64(tm.DraftAccepted+tm.DraftSteps) / float64(tm.DraftSteps), c.result().tokens
			}
			for _, prompt := range []string{"the cat sat", "trees verify many continuations at once"} {
				tree, got := al(tc.budget, prompt)
				chain, _ := al(0, prompt)
				is.Equal(got, plainTokens(t, prompt, 60, tc.recurrent)) // a tree never changes greedy output
				t.Logf("%q: tree AL %.2f, chain AL %.2f", prompt, tree, chain)
				is.True(tc.check(tree, chain))
			}
		})
	}
}

// TestTreeBatchedAndPrefixCache: tree entries share a forward with other sequences' trees and prefill chunks, and a
// sequence that ends inside a tree is not cached with tree-ordered rows (the next request still gets the target's
// output).
func TestTreeBatchedAndPrefixCache(t *testing.T) {
	is := is.New(t)
	prompts := []string{"the cat", "a much longer prompt that takes several chunks", "x", "hello there"}
	m := enginetest.NewFakeModel(4, 512, 6)
	d := enginetest.NewOracleDrafter(enginetest.Letters, 8, 6)
	d.Wrong = func(pos int) bool { return pos%3 == 1 }
	e := newEngine(t, m, engine.Config{StepTokens: 64, Drafter: d, DraftAlways: true, TreeBudget: 16, PrefixCacheSlots: 2})
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
	is.True(sharedVerifies(m) > 0) // several sequences' trees in one forward
	// A follow-up prompt extending a finished one reuses its cache entry when it was kept, and is right either way.
	next := prompts[1] + " and more"
	c, err := run(e, request(next, 20))
	is.NoErr(err)
	is.Equal(c.result().tokens, plainTokens(t, next, 20, false))
	is.Equal(d.Errs, nil)
}

func TestTreeConfigErrors(t *testing.T) {
	is := is.New(t)
	m := enginetest.NewFakeModel(4, 16, 1)
	_, err := engine.New(engine.Config{Model: m, Vocab: enginetest.ByteVocab{}, MaxCtx: 32,
		Drafter: enginetest.NewOracleDrafter(enginetest.Letters, 8, 1), TreeBudget: 64})
	is.True(err != nil) // beyond what a tree forward relates
}
