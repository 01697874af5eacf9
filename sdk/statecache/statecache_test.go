package statecache_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk/statecache"
)

// warnings collects a cache's warnings.
type warnings struct {
	mu  sync.Mutex
	msg []string
}

func (w *warnings) warn(msg string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msg = append(w.msg, fmt.Sprint(append([]any{msg}, args...)...))
}

func (w *warnings) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.msg...)
}

func toks(n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(i*7 + 3)
	}
	return out
}

func open(t *testing.T, dir string, id string, max int64, w *warnings) *statecache.Cache {
	t.Helper()
	c, err := statecache.Open(dir, []byte(id), max, w.warn)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestStoreLookupAndRestart(t *testing.T) {
	is := is.New(t)
	dir, w := t.TempDir(), &warnings{}
	c := open(t, dir, "model-a", 1<<20, w)
	prompt := toks(100)
	c.Store(prompt[:40], []byte("state after 40"))
	c.Store(prompt[:80], []byte("state after 80"))
	c.Close()
	for _, tc := range []struct {
		name   string
		prompt []int32
		n      int
		state  string
	}{
		{"longest stored prefix", prompt, 80, "state after 80"},
		{"a prompt that is the stored prefix leaves one token to run", prompt[:80], 40, "state after 40"},
		{"diverging after 50 tokens", append(toks(50), 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9), 40, "state after 40"},
		{"nothing shared", []int32{1, 2, 3}, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			c := open(t, dir, "model-a", 1<<20, w) // a restart: the entries are found on disk
			defer c.Close()
			n, state := c.Lookup(tc.prompt)
			is.Equal(n, tc.n)
			is.Equal(string(state), tc.state)
		})
	}
	other := open(t, dir, "model-b", 1<<20, w)
	defer other.Close()
	n, _ := other.Lookup(prompt)
	is.Equal(n, 0) // another model's identity sees none of them
	is.Equal(w.all(), nil)
}

func TestDamagedEntriesAreIgnoredWithOneWarning(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(path string) error
	}{
		{"truncated", func(p string) error { return os.Truncate(p, 30) }},
		{"state changed", func(p string) error {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			b[len(b)-1] ^= 0xff
			return os.WriteFile(p, b, 0o644)
		}},
		{"foreign file", func(p string) error { return os.WriteFile(p, bytes.Repeat([]byte("x"), 200), 0o644) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			dir, w := t.TempDir(), &warnings{}
			c := open(t, dir, "m", 1<<20, w)
			prompt := toks(64)
			c.Store(prompt[:32], []byte("a state worth keeping"))
			c.Close()
			files, _ := filepath.Glob(filepath.Join(c.Dir(), "*.state"))
			is.Equal(len(files), 1)
			is.NoErr(tc.damage(files[0]))
			c = open(t, dir, "m", 1<<20, w)
			defer c.Close()
			for range 2 {
				n, state := c.Lookup(prompt)
				is.Equal(n, 0)
				is.Equal(state, nil)
			}
			is.Equal(len(w.all()), 1) // one warning, naming the file
			is.True(strings.Contains(w.all()[0], files[0]))
			_, err := os.Stat(files[0])
			is.True(os.IsNotExist(err)) // and the file is gone
		})
	}
}

func TestLeastRecentlyUsedGoPastTheBound(t *testing.T) {
	is := is.New(t)
	dir, w := t.TempDir(), &warnings{}
	state := bytes.Repeat([]byte{7}, 1000)
	c := open(t, dir, "m", 4200, w) // room for three entries of 1.2–1.4 kB, not four
	prompt := toks(200)
	for _, n := range []int{20, 40, 60} {
		c.Store(prompt[:n], state)
		c.Close()
		c = open(t, dir, "m", 4200, w)
	}
	n, _ := c.Lookup(prompt[:41]) // uses the 40-token entry: now the 20-token one is the oldest
	is.Equal(n, 40)
	c.Store(prompt[:80], state)
	c.Close()
	c = open(t, dir, "m", 4200, w)
	defer c.Close()
	n, _ = c.Lookup(prompt[:21])
	is.Equal(n, 0) // evicted
	for _, want := range []int{40, 60, 80} {
		n, _ = c.Lookup(prompt[:want+1])
		is.Equal(n, want)
	}
}

// TestUnwritableDirectoryTurnsTheCacheOff: the cache's directory is replaced by a file after it opened (as a disk
// that went away would behave); the writes fail, the cache turns off with one warning, lookups find nothing.
func TestUnwritableDirectoryTurnsTheCacheOff(t *testing.T) {
	is := is.New(t)
	dir, w := t.TempDir(), &warnings{}
	c := open(t, dir, "m", 1<<20, w)
	is.NoErr(os.RemoveAll(c.Dir()))
	is.NoErr(os.WriteFile(c.Dir(), []byte("not a directory"), 0o644))
	prompt := toks(64)
	c.Store(prompt[:16], []byte("s"))
	c.Store(prompt[:32], []byte("s"))
	c.Close()
	is.Equal(len(w.all()), 1) // one warning
	is.True(strings.Contains(w.all()[0], "turned off"))
	n, _ := c.Lookup(prompt)
	is.Equal(n, 0)
}
