//go:build linux

package mmap

import (
	"os"
	"syscall"
)

// Evict drops the resident pages that lie wholly inside b, a part of a mapping made by File. The mapping is a
// read-only view of the file, so nothing is lost: a later read faults the pages back in from the page cache or the
// file. The pages at b's ends, which b may share with its neighbours, stay.
func Evict(b []byte) error {
	page := os.Getpagesize()
	if len(b) < page {
		return nil
	}
	start := (page - int(uintptrOf(b)%uintptr(page))) % page
	end := start + (len(b)-start)/page*page
	if end <= start {
		return nil
	}
	return syscall.Madvise(b[start:end], syscall.MADV_DONTNEED)
}
