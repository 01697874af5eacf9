// Package statecache keeps engine sequence states of prompt prefixes in files, so that a later prompt sharing a
// prefix — also after a restart — starts from the stored state instead of prefilling it (a disk prefix cache).
//
// An entry is one file named by the SHA-256 of the model identity and the prefix's token ids; it holds a header
// (magic, the identity, the token ids, the state's length and SHA-256) and the state. Reads check all of it: a
// truncated, corrupt or foreign file is ignored (and removed) with one warning. Writes happen in the background,
// into a temporary file renamed into place; the least recently used entries go once the directory holds more than
// its bound. A write that fails (a full or unwritable disk) turns the cache off with one warning: requests never
// fail because of it.
package statecache

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

const (
	magic  = "DFLSTATE1"
	suffix = ".state"
	// queue is how many states may wait for the writer; more are dropped (the cache is best effort).
	queue = 4
	// maxLengths bounds how many distinct prefix lengths a lookup tries.
	maxLengths = 64
)

// Cache is a directory of stored states for one model identity. Its methods are safe for concurrent use.
type Cache struct {
	dir      string
	id       []byte
	maxBytes int64
	warn     func(msg string, args ...any)

	mu      sync.Mutex
	entries map[string]*entry // by file key
	bytes   int64
	off     bool
	warned  map[string]bool

	writes chan write
	done   chan struct{}
}

type entry struct {
	key    string
	tokens int
	size   int64
	used   time.Time
}

type write struct {
	key    string
	prefix []int32
	state  []byte
}

// Open opens (creating it) the cache directory dir for the model identity id (bytes that change whenever a stored
// state would not fit: the model file, the cache types), bounded to maxBytes of files; warn receives the one-time
// warnings. It indexes the entries already there (headers only).
func Open(dir string, id []byte, maxBytes int64, warn func(msg string, args ...any)) (*Cache, error) {
	if maxBytes <= 0 {
		return nil, fmt.Errorf("state cache %s: size bound %d must be positive", dir, maxBytes)
	}
	sum := sha256.Sum256(id)
	dir = filepath.Join(dir, hex.EncodeToString(sum[:8]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("state cache: %w", err)
	}
	c := &Cache{dir: dir, id: sum[:], maxBytes: maxBytes, warn: warn, entries: map[string]*entry{}, warned: map[string]bool{},
		writes: make(chan write, queue), done: make(chan struct{})}
	if err := c.index(); err != nil {
		return nil, err
	}
	go c.writer()
	return c, nil
}

// Close waits for the queued writes.
func (c *Cache) Close() {
	close(c.writes)
	<-c.done
}

// Dir is the directory of this model's entries.
func (c *Cache) Dir() string { return c.dir }

func (c *Cache) index() error {
	des, err := os.ReadDir(c.dir)
	if err != nil {
		return fmt.Errorf("state cache: %w", err)
	}
	for _, de := range des {
		name := de.Name()
		if !strings.HasSuffix(name, suffix) {
			if strings.HasSuffix(name, ".tmp") { // an interrupted write
				_ = os.Remove(filepath.Join(c.dir, name))
			}
			continue
		}
		key := strings.TrimSuffix(name, suffix)
		f, err := os.Open(filepath.Join(c.dir, name))
		if err != nil {
			continue
		}
		h, herr := c.readHeader(f)
		st, serr := f.Stat()
		_ = f.Close()
		if herr != nil || serr != nil || st.Size() != h.fileSize() {
			c.drop(key, fmt.Errorf("%s: %w", name, errors.Join(herr, serr, sizeErr(st, h))))
			continue
		}
		c.entries[key] = &entry{key: key, tokens: len(h.tokens), size: st.Size(), used: st.ModTime()}
		c.bytes += st.Size()
	}
	return nil
}

func sizeErr(st os.FileInfo, h header) error {
	if st == nil || st.Size() == h.fileSize() {
		return nil
	}
	return fmt.Errorf("%d bytes, the header describes %d", st.Size(), h.fileSize())
}

// key names the entry of prefix.
func (c *Cache) key(prefix []int32) string {
	h := sha256.New()
	h.Write(c.id)
	var b [4]byte
	for _, t := range prefix {
		binary.LittleEndian.PutUint32(b[:], uint32(t))
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Lookup returns the longest stored prefix of prompt that leaves at least one prompt token to run, and its state;
// n = 0 when there is none.
func (c *Cache) Lookup(prompt []int32) (n int, state []byte) {
	c.mu.Lock()
	if c.off {
		c.mu.Unlock()
		return 0, nil
	}
	var lengths []int
	for _, e := range c.entries {
		if e.tokens < len(prompt) && !slices.Contains(lengths, e.tokens) {
			lengths = append(lengths, e.tokens)
		}
	}
	c.mu.Unlock()
	sort.Sort(sort.Reverse(sort.IntSlice(lengths)))
	for _, l := range lengths[:min(len(lengths), maxLengths)] {
		key := c.key(prompt[:l])
		c.mu.Lock()
		_, ok := c.entries[key]
		c.mu.Unlock()
		if !ok {
			continue
		}
		state, err := c.read(key, prompt[:l])
		if err != nil {
			c.drop(key, err)
			continue
		}
		now := time.Now()
		c.mu.Lock()
		if e := c.entries[key]; e != nil {
			e.used = now
		}
		c.mu.Unlock()
		_ = os.Chtimes(c.path(key), now, now) // the file's time is its last use across restarts
		return l, state
	}
	return 0, nil
}

// Store keeps state as the state after prefix, in the background; it does nothing when the prefix is stored
// already, the writer is behind, or the cache is off.
func (c *Cache) Store(prefix []int32, state []byte) {
	key := c.key(prefix)
	c.mu.Lock()
	if e, ok := c.entries[key]; ok || c.off {
		if ok {
			e.used = time.Now()
		}
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	select {
	case c.writes <- write{key: key, prefix: slices.Clone(prefix), state: state}:
	default:
	}
}

func (c *Cache) writer() {
	defer close(c.done)
	for w := range c.writes {
		c.mu.Lock()
		off := c.off
		c.mu.Unlock()
		if off {
			continue
		}
		size, err := c.writeFile(w)
		if err != nil {
			c.mu.Lock()
			c.off = true
			c.mu.Unlock()
			c.warn("disk prefix cache turned off: cannot write a state", "dir", c.dir, "error", err)
			continue
		}
		c.mu.Lock()
		c.entries[w.key] = &entry{key: w.key, tokens: len(w.prefix), size: size, used: time.Now()}
		c.bytes += size
		c.evictLocked()
		c.mu.Unlock()
	}
}

// evictLocked removes the least recently used entries until the directory is within its bound.
func (c *Cache) evictLocked() {
	for c.bytes > c.maxBytes && len(c.entries) > 0 {
		var old *entry
		for _, e := range c.entries {
			if old == nil || e.used.Before(old.used) {
				old = e
			}
		}
		delete(c.entries, old.key)
		c.bytes -= old.size
		_ = os.Remove(c.path(old.key))
	}
}

func (c *Cache) path(key string) string { return filepath.Join(c.dir, key+suffix) }

// drop forgets an unreadable entry and removes its file, warning once per entry.
func (c *Cache) drop(key string, err error) {
	c.mu.Lock()
	if e, ok := c.entries[key]; ok {
		c.bytes -= e.size
		delete(c.entries, key)
	}
	first := !c.warned[key]
	c.warned[key] = true
	c.mu.Unlock()
	_ = os.Remove(c.path(key))
	if first {
		c.warn("disk prefix cache: ignoring an unreadable entry", "file", c.path(key), "error", err)
	}
}

// header is what precedes a state in its file.
type header struct {
	tokens  []int32
	length  uint64
	sum     [32]byte
	hdrSize int64
}

func (h header) fileSize() int64 { return h.hdrSize + int64(h.length) }

func (c *Cache) writeFile(w write) (int64, error) {
	var b bytes.Buffer
	b.WriteString(magic)
	b.Write(c.id)
	_ = binary.Write(&b, binary.LittleEndian, uint32(len(w.prefix)))
	_ = binary.Write(&b, binary.LittleEndian, w.prefix)
	_ = binary.Write(&b, binary.LittleEndian, uint64(len(w.state)))
	sum := sha256.Sum256(w.state)
	b.Write(sum[:])
	tmp, err := os.CreateTemp(c.dir, "*.tmp")
	if err != nil {
		return 0, err
	}
	_, err = tmp.Write(b.Bytes())
	if err == nil {
		_, err = tmp.Write(w.state)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), c.path(w.key))
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return 0, err
	}
	return int64(b.Len() + len(w.state)), nil
}

func (c *Cache) readHeader(r io.Reader) (header, error) {
	var h header
	m := make([]byte, len(magic)+len(c.id))
	if _, err := io.ReadFull(r, m); err != nil {
		return h, fmt.Errorf("header: %w", err)
	}
	if string(m[:len(magic)]) != magic {
		return h, errors.New("not a state file")
	}
	if !bytes.Equal(m[len(magic):], c.id) {
		return h, errors.New("made for another model")
	}
	var n uint32
	if err := binary.Read(r, binary.LittleEndian, &n); err != nil {
		return h, fmt.Errorf("header: %w", err)
	}
	if n > 1<<24 {
		return h, fmt.Errorf("header: %d tokens", n)
	}
	h.tokens = make([]int32, n)
	if err := binary.Read(r, binary.LittleEndian, h.tokens); err != nil {
		return h, fmt.Errorf("header: %w", err)
	}
	if err := binary.Read(r, binary.LittleEndian, &h.length); err != nil {
		return h, fmt.Errorf("header: %w", err)
	}
	if _, err := io.ReadFull(r, h.sum[:]); err != nil {
		return h, fmt.Errorf("header: %w", err)
	}
	h.hdrSize = int64(len(m) + 4 + 4*int(n) + 8 + 32)
	return h, nil
}

// read returns the state of key after checking that it belongs to prefix and is whole.
func (c *Cache) read(key string, prefix []int32) ([]byte, error) {
	f, err := os.Open(c.path(key))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h, err := c.readHeader(f)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(h.tokens, prefix) {
		return nil, errors.New("stored for other tokens")
	}
	if h.length > 1<<40 {
		return nil, fmt.Errorf("state of %d bytes", h.length)
	}
	state := make([]byte, h.length)
	if _, err := io.ReadFull(f, state); err != nil {
		return nil, fmt.Errorf("state: %w", err)
	}
	if sha256.Sum256(state) != h.sum {
		return nil, errors.New("state does not match its checksum")
	}
	return state, nil
}
