//go:build !unix

package mmap

import (
	"io"
	"os"
)

// File reads the file into memory where mmap is not available.
func File(f *os.File, size int64) ([]byte, func() error, error) {
	b := make([]byte, size)
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, nil, err
	}
	return b, func() error { return nil }, nil
}
