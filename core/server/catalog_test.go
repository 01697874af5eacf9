package server

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/matryer/is"
)

// syncBuffer is a log sink safe for go-plugin's relay goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestCatalogReportsSkippedPlugins: an executable named like a backend
// plugin that is not one is skipped with a line naming the file and why
// (issue 14 item 4: only go-plugin's "plugin failed to exit gracefully"
// was printed).
func TestCatalogReportsSkippedPlugins(t *testing.T) {
	dir := t.TempDir()
	plugins := []struct{ name, script, reason string }{
		{"dflash-backend-hello", "#!/bin/sh\necho hello\n", "not a dflash plugin (no go-plugin handshake on stdout)"},
		{"dflash-backend-quits", "#!/bin/sh\nexit 0\n", "not a dflash plugin"},
	}
	for _, p := range plugins {
		if err := os.WriteFile(filepath.Join(dir, p.name), []byte(p.script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var log syncBuffer
	c := newCatalog(dir, hclog.New(&hclog.LoggerOptions{Output: &log, Level: hclog.Warn}))
	_ = c.Backends()
	for _, p := range plugins {
		t.Run(p.name, func(t *testing.T) {
			is := is.New(t)
			var line string
			for _, l := range strings.Split(log.String(), "\n") {
				if strings.Contains(l, "skipped plugin") && strings.Contains(l, filepath.Join(dir, p.name)) {
					line = l
				}
			}
			is.True(line != "")                       // one line names the skipped file
			is.True(strings.Contains(line, p.reason)) // and says why
		})
	}
}
