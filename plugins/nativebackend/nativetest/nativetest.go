package nativetest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/dflash/dflash_server/sdk/sdktest"
)

// LibDir finds libdflash_cpu.so: $DFLASH_LIB_DIR, else bin/lib. It fails
// the test, saying how to build the library, when it is missing.
func LibDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("DFLASH_LIB_DIR")
	if dir == "" {
		dir = filepath.Join(sdktest.Root(t), "bin", "lib")
	}
	if _, err := os.Stat(filepath.Join(dir, "libdflash_cpu.so")); err != nil {
		t.Fatalf("libdflash_cpu.so not found in %s: build it first (make, or make -C native OUT=../bin/lib), or set DFLASH_LIB_DIR", dir)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// ModelTool finds the dflash-model binary: $DFLASH_BIN_DIR, else bin/. It
// fails the test, saying how to build it, when it is missing.
func ModelTool(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("DFLASH_BIN_DIR")
	if dir == "" {
		dir = filepath.Join(sdktest.Root(t), "bin")
	}
	p := filepath.Join(dir, "dflash-model")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("dflash-model not found in %s: build it first (make, or go build -o bin/ ./cmd/dflash-model), or set DFLASH_BIN_DIR", dir)
	}
	return p
}
