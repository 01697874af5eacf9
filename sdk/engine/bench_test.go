package engine_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/engine/enginetest"
)

// BenchmarkLoopOverhead measures the engine's own cost per generated token
// (scheduling, sampling call, detokenizing, parsing, stop matching, outbox
// hand-off) on the fake model, whose forward is nearly free.
func BenchmarkLoopOverhead(b *testing.B) {
	for _, conc := range []int{1, 16} {
		b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
			m := enginetest.NewFakeModel(16, 4096, conc)
			e, err := engine.New(engine.Config{Model: m, Vocab: enginetest.ByteVocab{}, MaxCtx: 1024})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close(context.Background())
			const tokens = 256
			for b.Loop() {
				var wg sync.WaitGroup
				for range conc {
					wg.Add(1)
					go func() {
						defer wg.Done()
						req := &engine.Request{Prompt: enginetest.Encode("a prompt of some length"), MaxTokens: tokens,
							Detokenizer: &enginetest.Detokenizer{}, Stop: []string{"zzzz"}}
						if err := e.Run(context.Background(), req, discard{}); err != nil {
							b.Error(err)
						}
					}()
				}
				wg.Wait()
			}
			b.ReportMetric(float64(b.N*conc*tokens)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}
