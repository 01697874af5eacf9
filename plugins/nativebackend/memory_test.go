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
	shrunkRec := int((uint64(float64(free12)*(1-memoryHeadroom)) - 9*gib - gib/2) / 147456)
	tests := []struct {
		name          string
		est           native.Estimate
		free          uint64
		seqs          int
		records       uint64
		want, minimum int
		pool          int
		err           string
	}{
		{"everything fits", est, 80 * gib, 4, 0, 4 * 8192, 8192, 4 * 8192, ""},
		{"pool shrinks to the memory", est, 12 * gib, 4, 0, 4 * 8192, 8192, shrunk, ""},
		{"verify records shrink it further", est, 12 * gib, 4, gib / 2, 4 * 8192, 8192, shrunkRec, ""},
		{"not even one context", est, 9 * gib, 4, 0, 4 * 8192, 8192, 0, "bytes are free"},
		{"recurrent state counts", native.Estimate{WeightBytes: gib, StateBytesPerSeq: gib, KVBytesPerToken: 1024}, 4 * gib, 4, 0, 1000, 100, 0, "recurrent state"},
		{"verify records count", native.Estimate{WeightBytes: gib, KVBytesPerToken: 1024}, 4 * gib, 4, 3 * gib, 1000, 100, 0, "verify records 3221225472"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			n, err := fitPool(tc.est, tc.free, tc.seqs, tc.records, tc.want, tc.minimum)
			if tc.err != "" {
				is.True(err != nil && strings.Contains(err.Error(), tc.err)) // names the shortfall
				return
			}
			is.NoErr(err)
			is.Equal(n, tc.pool)
		})
	}
}

func TestRecordBytes(t *testing.T) {
	old := native.Estimate{StateBytesPerSeq: 1000} // a library that predates the record figures
	est := native.Estimate{StateBytesPerSeq: 1000, RecordBytesFixed: 300, RecordBytesPerRow: 20, TreeRecordBytesPerRow: 20,
		TreeRecordBytesFixed: 1250}
	before := native.Estimate{StateBytesPerSeq: 1000, RecordBytesFixed: 300, RecordBytesPerRow: 20, TreeRecordBytesPerRow: 900}
	tests := []struct {
		name        string
		est         native.Estimate
		slots, rows int
		tree        bool
		want        uint64
	}{
		{"no draft", est, 8, 0, false, 0},
		{"a DFlash2 block of 8 keeps room for 16", est, 8, 8, false, 8 * (300 + 16*20)},
		{"a chain of 23", est, 2, 23, false, 2 * (300 + 23*20)},
		{"a tree of budget 22: its inputs, and the states its schedule sets aside", est, 2, 23, true, 2 * (300 + 1250 + 23*20)},
		{"a library that kept a state a tree row", before, 2, 23, true, 2 * (300 + 23*900)},
		{"old library: a state a row and one before", old, 8, 8, false, 8 * 17 * 1000},
		{"old library, tree", old, 2, 23, true, 2 * 24 * 1000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			is.Equal(recordBytes(tc.est, tc.slots, tc.rows, tc.tree), tc.want)
		})
	}
	is.New(t).Equal(recordBytes(native.Estimate{KVBytesPerToken: 1}, 8, 16, false), uint64(0)) // no recurrent layers
}
