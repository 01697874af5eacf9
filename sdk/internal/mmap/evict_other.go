//go:build !linux

package mmap

// Evict does nothing where the mapping's pages cannot be dropped (or File read the file into memory).
func Evict(b []byte) error { return nil }
