package mmap

import "unsafe"

// uintptrOf is the address of b's first byte (b is not empty).
func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
