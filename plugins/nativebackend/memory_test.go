package nativebackend

import (
	"strings"
	"testing"

	native "github.com/dflash/dflash_server/native/engine"
	"github.com/matryer/is"
)

func TestFitPool(t *testing.T) {
	const gib = 1 << 30
	est := native.Estimate{WeightBytes: 8 * gib, ScratchBytes: gib, StateBytesPerSeq: 0, KVBytesPerToken: 147456} // qwen3-8b f16 KV
	free12 := uint64(12 * gib)
	shrunk := int((uint64(float64(free12)*(1-memoryHeadroom)) - 9*gib) / 147456) // what 12 GiB hold after 9 GiB fixed
	tests := []struct {
		name          string
		est           native.Estimate
		free          uint64
		seqs          int
		want, minimum int
		pool          int
		err           string
	}{
		{"everything fits", est, 80 * gib, 4, 4 * 8192, 8192, 4 * 8192, ""},
		{"pool shrinks to the memory", est, 12 * gib, 4, 4 * 8192, 8192, shrunk, ""},
		{"not even one context", est, 9 * gib, 4, 4 * 8192, 8192, 0, "bytes are free"},
		{"recurrent state counts", native.Estimate{WeightBytes: gib, StateBytesPerSeq: gib, KVBytesPerToken: 1024}, 4 * gib, 4, 1000, 100, 0, "recurrent state"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			n, err := fitPool(tc.est, tc.free, tc.seqs, tc.want, tc.minimum)
			if tc.err != "" {
				is.True(err != nil && strings.Contains(err.Error(), tc.err)) // names the shortfall
				return
			}
			is.NoErr(err)
			is.Equal(n, tc.pool)
		})
	}
}
