package engine

import (
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
)

func TestDecide(t *testing.T) {
	// 16-token blocks, 64 blocks (1024 tokens), context 512, headroom 32.
	base := capacity{slots: 4, blockSize: 16, totalBlocks: 64, freeBlocks: 64, maxCtx: 512, headroom: 32}
	for _, tc := range []struct {
		name           string
		c              func(capacity) capacity
		prompt, maxTok int
		outcome        sdk.Outcome
		promise        int
		needed, limit  int
	}{
		{name: "empty engine", prompt: 100, maxTok: 100, outcome: sdk.OutcomeAdmitted, promise: 9}, // 100+32 → 9 blocks
		{name: "headroom clamped to max tokens", prompt: 100, maxTok: 4, outcome: sdk.OutcomeAdmitted, promise: 7},
		{name: "exactly the context", prompt: 500, maxTok: 12, outcome: sdk.OutcomeAdmitted, promise: 32},
		{name: "over the context", prompt: 500, maxTok: 13, outcome: sdk.OutcomeNeverFits, needed: 513, limit: 512},
		{name: "over the pool", c: func(c capacity) capacity { c.maxCtx = 4096; return c },
			prompt: 1000, maxTok: 25, outcome: sdk.OutcomeNeverFits, needed: 1025, limit: 1024},
		{name: "pool exactly", c: func(c capacity) capacity { c.maxCtx = 4096; return c },
			prompt: 1000, maxTok: 24, outcome: sdk.OutcomeAdmitted, promise: 64},
		{name: "no free slot", c: func(c capacity) capacity { c.usedSlots = 4; return c },
			prompt: 10, maxTok: 10, outcome: sdk.OutcomeBusy},
		{name: "never fits wins over busy", c: func(c capacity) capacity { c.usedSlots = 4; return c },
			prompt: 600, maxTok: 10, outcome: sdk.OutcomeNeverFits, needed: 610, limit: 512},
		{name: "not enough free KV", c: func(c capacity) capacity { c.freeBlocks = 8; return c },
			prompt: 100, maxTok: 100, outcome: sdk.OutcomeBusy},
		{name: "free KV exactly", c: func(c capacity) capacity { c.freeBlocks = 9; return c },
			prompt: 100, maxTok: 100, outcome: sdk.OutcomeAdmitted, promise: 9},
		{name: "running headroom counts", c: func(c capacity) capacity { c.freeBlocks = 10; c.runningNeed = 2; return c },
			prompt: 100, maxTok: 100, outcome: sdk.OutcomeBusy},
		{name: "cache entry brings blocks", c: func(c capacity) capacity { c.freeBlocks = 2; c.have = 7; return c },
			prompt: 100, maxTok: 100, outcome: sdk.OutcomeAdmitted, promise: 9},
		{name: "reclaimable cache counts as free", c: func(c capacity) capacity { c.freeBlocks = 4; c.reclaimable = 5; return c },
			prompt: 100, maxTok: 100, outcome: sdk.OutcomeAdmitted, promise: 9},
		{name: "reclaimable not enough", c: func(c capacity) capacity { c.freeBlocks = 4; c.reclaimable = 4; return c },
			prompt: 100, maxTok: 100, outcome: sdk.OutcomeBusy},
		{name: "running headroom fits", c: func(c capacity) capacity { c.freeBlocks = 11; c.runningNeed = 2; return c },
			prompt: 100, maxTok: 100, outcome: sdk.OutcomeAdmitted, promise: 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			c := base
			if tc.c != nil {
				c = tc.c(c)
			}
			adm, promise := c.decide(tc.prompt, tc.maxTok)
			is.Equal(adm.Outcome, tc.outcome)
			is.Equal(promise, tc.promise)
			is.Equal(adm.PromptTokens, tc.prompt)
			is.Equal(adm.NeededTokens, tc.needed)
			is.Equal(adm.LimitTokens, tc.limit)
			is.True((adm.Reason == "") == (tc.outcome == sdk.OutcomeAdmitted))
		})
	}
}

func TestStopMatcher(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stops   []string
		pieces  []string
		emitted string
		matched string
		held    string
	}{
		{"no stops", nil, []string{"ab", "c"}, "abc", "", ""},
		{"inside one piece", []string{"XY"}, []string{"abXYcd"}, "ab", "XY", ""},
		{"across pieces", []string{"STOP"}, []string{"ok S", "T", "OP!"}, "ok ", "STOP", ""},
		{"prefix then mismatch", []string{"abc"}, []string{"ab", "ab", "d"}, "ababd", "", ""},
		{"held at end", []string{"abc"}, []string{"xab"}, "x", "", "ab"},
		{"longest partial kept", []string{"aab", "ab"}, []string{"xa", "a"}, "x", "", "aa"},
		{"earliest match", []string{"cd", "b"}, []string{"abcd"}, "a", "b", ""},
		{"same start longest", []string{"ab", "abc"}, []string{"xabc"}, "x", "abc", ""},
		{"multibyte", []string{"✓!"}, []string{"é✓", "!"}, "é", "✓!", ""},
		{"empty stop ignored", []string{""}, []string{"a"}, "a", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			m := newStopMatcher(tc.stops)
			var out, matched string
			for _, p := range tc.pieces {
				e, mt := m.push(p)
				out += e
				if mt != "" {
					matched = mt
					break
				}
			}
			is.Equal(out, tc.emitted)
			is.Equal(matched, tc.matched)
			is.Equal(m.flush(), tc.held)
		})
	}
}
