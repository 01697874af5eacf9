package jsonprefix_test

import (
	"testing"

	"github.com/dflash/dflash_server/sdk/jsonprefix"
)

// BenchmarkAccepts is the cost of checking one candidate token of a few
// bytes against a state inside a nested object.
func BenchmarkAccepts(b *testing.B) {
	var s jsonprefix.State
	s.Feed([]byte(`{"name": "Ada", "langs": [{"id": 1, "tags": ["x", "y"]}, {"id": `))
	tok := []byte(`12}, `)
	b.ReportAllocs()
	for b.Loop() {
		if !s.Accepts(tok) {
			b.Fatal("refused")
		}
	}
}
