package engine_test

import (
	"context"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/engine/enginetest"
)

func TestPrefixCacheReuse(t *testing.T) {
	const sys = "You are a helpful assistant. Answer briefly.\n"
	const n = 12 // generated tokens per request
	first := sys + "Q1?"
	for _, tc := range []struct {
		name      string
		recurrent bool
		second    func(out string) string
		cached    int
	}{
		{name: "shared system prompt", second: func(string) string { return sys + "Q2, a longer one?" }, cached: len(sys) + 1},
		{name: "whole conversation", second: func(out string) string { return first + out + " next" }, cached: len(first) + n - 1},
		{name: "recurrent: shared system prompt is not reusable", recurrent: true,
			second: func(string) string { return sys + "Q2, a longer one?" }, cached: 0},
		{name: "recurrent: back to the prompt's snapshot", recurrent: true,
			second: func(string) string { return first + " and more" }, cached: len(first)},
		{name: "recurrent: whole conversation", recurrent: true,
			second: func(out string) string { return first + out + " next" }, cached: len(first) + n - 1},
		{name: "unrelated", second: func(string) string { return strings.Repeat("z", 50) }, cached: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			m := enginetest.NewFakeModel(4, 256, 3)
			m.RecurrentState = tc.recurrent
			e := newEngine(t, m, engine.Config{MaxConcurrency: 1, PrefixCacheSlots: 2})
			c, err := run(e, request(first, n))
			is.NoErr(err)
			out := c.result().text
			is.Equal(m.LiveSeqs(), 1) // kept for later

			prompt := tc.second(out)
			c, err = run(e, request(prompt, n))
			is.NoErr(err)
			r := c.result()
			is.Equal(r.finish.Usage.CachedTokens, tc.cached)

			// The cache changed nothing in what the model generated.
			fresh := enginetest.NewFakeModel(4, 256, 1)
			fresh.RecurrentState = tc.recurrent
			alone, err := run(newEngine(t, fresh, engine.Config{}), request(prompt, n))
			is.NoErr(err)
			is.Equal(r.tokens, alone.result().tokens)
			if tc.cached > 0 {
				is.Equal(m.LiveSeqs(), 1) // the entry was adopted, then kept again
			} else {
				is.Equal(m.LiveSeqs(), 2)
			}
			is.Equal(e.Stats().ActiveSequences, 0)
		})
	}
}

func TestPrefixCacheSnapshotAtGenerationPrompt(t *testing.T) {
	is := is.New(t)
	const turn1 = "<sys>You are a helpful assistant.</sys><user>Q1?</user>"
	const gen = "<assistant>"
	m := enginetest.NewFakeModel(4, 256, 2)
	m.RecurrentState = true
	e := newEngine(t, m, engine.Config{MaxConcurrency: 1, PrefixCacheSlots: 1})
	req := request(turn1+gen, 8)
	req.SnapshotAt = len(turn1)
	c, err := run(e, req)
	is.NoErr(err)
	out := c.result().text

	// The next turn renders the answer its own way, after turn1.
	next := turn1 + "<asst>" + out + "</asst><user>Q2?</user>" + gen
	c, err = run(e, request(next, 8))
	is.NoErr(err)
	r := c.result()
	is.Equal(r.finish.Usage.CachedTokens, len(turn1))
	fresh := enginetest.NewFakeModel(4, 256, 1)
	fresh.RecurrentState = true
	alone, err := run(newEngine(t, fresh, engine.Config{}), request(next, 8))
	is.NoErr(err)
	is.Equal(r.tokens, alone.result().tokens)
}

func TestPrefixCacheSlotsAndEviction(t *testing.T) {
	is := is.New(t)
	// 16 blocks of 4 tokens; 2 running slots, 1 cache slot.
	m := enginetest.NewFakeModel(4, 16, 3)
	e := newEngine(t, m, engine.Config{MaxCtx: 64, DecodeHeadroom: 4, PrefixCacheSlots: 1})
	is.Equal(e.Limits().MaxConcurrency, 2)
	for _, p := range []string{strings.Repeat("a", 20), strings.Repeat("b", 20)} {
		_, err := run(e, request(p, 8))
		is.NoErr(err)
	}
	is.Equal(m.LiveSeqs(), 1)      // one cache slot: the older entry was freed
	is.Equal(m.FreeBlocks(), 16-7) // the kept entry holds 20 + 8 tokens

	// A request needing most of the pool evicts the entry instead of
	// being turned away.
	c, err := run(e, request(strings.Repeat("c", 40), 16))
	is.NoErr(err)
	is.Equal(c.admission().Outcome, sdk.OutcomeAdmitted)
	is.Equal(c.result().finish.Reason, sdk.FinishLength)
	is.Equal(m.LiveSeqs(), 1) // only its own entry now

	is.NoErr(e.Close(context.Background()))
	is.Equal(m.LiveSeqs(), 0) // closing frees the cache
	is.Equal(m.FreeBlocks(), 16)
}

func TestPrefixCacheNeedsRewinder(t *testing.T) {
	is := is.New(t)
	_, err := engine.New(engine.Config{Model: noRewind{enginetest.NewFakeModel(4, 8, 2)}, Vocab: enginetest.ByteVocab{}, MaxCtx: 32, PrefixCacheSlots: 1})
	is.True(err != nil)
	_, err = engine.New(engine.Config{Model: enginetest.NewFakeModel(4, 8, 2), Vocab: enginetest.ByteVocab{}, MaxCtx: 32, PrefixCacheSlots: 2})
	is.True(strings.Contains(err.Error(), "leave none"))
}

// noRewind hides the fake's Rewinder methods.
type noRewind struct{ engine.Model }
