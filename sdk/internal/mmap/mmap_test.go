package mmap

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/matryer/is"
)

func TestFile(t *testing.T) {
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"bytes", []byte("GGUF\x03\x00\x00\x00")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			path := filepath.Join(t.TempDir(), "f")
			is.NoErr(os.WriteFile(path, tc.data, 0o600))
			f, err := os.Open(path)
			is.NoErr(err)
			b, unmap, err := File(f, int64(len(tc.data)))
			is.NoErr(err)
			is.NoErr(f.Close()) // the mapping outlives the file
			is.Equal(string(b), string(tc.data))
			is.NoErr(unmap())
		})
	}
}
