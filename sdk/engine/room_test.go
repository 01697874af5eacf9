package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/engine/enginetest"
)

// TestSpeculativeBlockWithoutRoom: two sequences over-commit a small pool; the one that runs out of KV runs out
// only when not one more token fits — a draft block that no longer fits falls back to the root alone, as plain
// decoding would go on — and what it produced until then is the target's own output.
func TestSpeculativeBlockWithoutRoom(t *testing.T) {
	is := is.New(t)
	m := enginetest.NewFakeModel(4, 16, 2) // 64 tokens
	d := enginetest.NewOracleDrafter(enginetest.Letters, 16, 2)
	e := newEngine(t, m, engine.Config{StepTokens: 64, MaxCtx: 64, DecodeHeadroom: 4, Drafter: d, DraftAlways: true})
	g := holdForwards(m)
	prompts := []string{"first prompt", "second one!!"}
	runs := make([]*async, len(prompts))
	for i, p := range prompts {
		runs[i] = start(context.Background(), e, request(p, 50))
		waitAdmitted(t, runs[i])
	}
	g.open()
	failed := 0
	for i, a := range runs {
		a.wait(t)
		got := a.c.result().tokens
		is.Equal(got, plainTokens(t, prompts[i], 50, false)[:len(got)]) // the target's own tokens, as far as it got
		if a.err != nil {
			failed++
			is.True(errors.Is(a.err, engine.ErrNoKV))
			is.True(strings.Contains(a.err.Error(), ", 0 tokens free")) // not while a token still fitted
		}
	}
	is.True(failed > 0) // the pool really ran out
}
