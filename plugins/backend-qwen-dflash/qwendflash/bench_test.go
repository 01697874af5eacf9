package qwendflash

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/dflash/dflash_server/sdk"
)

// BenchmarkGenerate measures end-to-end generation through the plugin's
// gRPC boundary: conc concurrent requests of 64 tokens each on a small
// qwen3 shape (4 layers, hidden 256, q8_0) on the CPU engine.
func BenchmarkGenerate(b *testing.B) {
	path := benchModel(b)
	for _, conc := range []int{1, 4} {
		b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
			cfg := blockConfig(b, path)
			cfg.MaxConcurrency, cfg.KVPoolTokens = conc, conc*256
			cfg.Options = map[string]string{"threads": "1"} // the VM has 2 shared cores
			_, c, _ := load(b, cfg)
			const tokens = 64
			b.ResetTimer()
			for b.Loop() {
				var wg sync.WaitGroup
				for i := range conc {
					wg.Add(1)
					go func() {
						defer wg.Done()
						s := newStream()
						req := chatReq(fmt.Sprintf("request %d: write a story.", i), tokens)
						if err := c.Start(context.Background(), req, s); err != nil || s.admission().Outcome != sdk.OutcomeAdmitted {
							b.Errorf("start: %v, %v", err, s.admission())
						}
					}()
				}
				wg.Wait()
			}
			b.ReportMetric(float64(b.N*conc*tokens)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}
