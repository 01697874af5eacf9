package pluginhost_test

import (
	"context"
	"strings"
	"testing"

	"github.com/dflash/dflash_server/core/pluginhost"
	"github.com/dflash/dflash_server/sdk"
)

// countingEmitter discards a Start stream, counting events.
type countingEmitter struct{ events int }

func (c *countingEmitter) Admit(sdk.Admission) error { return nil }
func (c *countingEmitter) Emit(sdk.Event) error      { c.events++; return nil }

func benchBackend(b *testing.B, reply string) *pluginhost.Backend {
	b.Helper()
	f := pluginhost.File{Kind: pluginhost.KindBackend, Name: "scripted", Path: pluginDir + "/dflash-backend-scripted"}
	be, err := pluginhost.LaunchBackend(context.Background(), f, pluginhost.Options{Logger: logger()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Shutdown(context.Background()) })
	model := b.TempDir() + "/m.gguf"
	if err := writeFile(model); err != nil {
		b.Fatal(err)
	}
	cfg := sdk.ModelConfig{Path: model, Name: "m", MaxCtx: 1 << 20, KVPoolTokens: 1 << 22,
		Options: map[string]string{"scripted-reply": reply}}
	if _, err := be.Load(context.Background(), cfg, nil); err != nil {
		b.Fatal(err)
	}
	return be
}

// BenchmarkStartRequest is the per-request cost of a Start stream through
// the real plugin process: request encoding, admission, one event, finish.
func BenchmarkStartRequest(b *testing.B) {
	be := benchBackend(b, "ok")
	req := chat("hi", 4)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := be.Start(context.Background(), req, &countingEmitter{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/request")
}

// BenchmarkStartToken is the per-token cost of streaming through the plugin
// boundary: one message per decode step, one token per step (the worst
// case; speculative steps carry several).
func BenchmarkStartToken(b *testing.B) {
	const tokens = 2000
	be := benchBackend(b, strings.Repeat("w ", tokens))
	req := chat("hi", tokens+10)
	b.ResetTimer()
	n := 0
	for i := 0; i < b.N; i++ {
		e := &countingEmitter{}
		if err := be.Start(context.Background(), req, e); err != nil {
			b.Fatal(err)
		}
		n += e.events
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/token")
}
