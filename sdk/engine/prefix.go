package engine

import (
	"context"
	"errors"
	"slices"
)

// Rewinder is the optional part of a Model the prefix cache needs: going
// back to a shorter length of a sequence.
type Rewinder interface {
	// Recurrent reports whether the model keeps recurrent state, so that a
	// sequence can go back only to its snapshot, not to any length.
	Recurrent() bool
	// Truncate cuts a sequence to tokens (models without recurrent state).
	Truncate(seq SeqID, tokens int) error
	// Snapshot saves the sequence's length and state; Rollback restores it.
	Snapshot(seq SeqID) error
	Rollback(seq SeqID) error
}

// minPrefixReuse is the shortest shared prefix worth giving up a cache
// entry for.
const minPrefixReuse = 16

// cacheEntry is a retired sequence kept with its KV so a later prompt that
// starts the same way can continue from it instead of prefilling again.
// An entry is used by one request (it is adopted, not shared).
type cacheEntry struct {
	id      SeqID
	tokens  []int32  // the tokens in its KV
	snapLen int      // length of its snapshot (the prompt's end), 0 if none
	held    int      // KV blocks it holds
	draft   *specSeq // its draft sequence (context up to len(tokens)), when it speculated
}

// snapshotAt is the prompt position where s takes its snapshot for the
// prefix cache; 0 when it takes none (no cache, or no recurrent state).
func (e *Engine) snapshotAt(s *sequence) int {
	if (e.rew == nil || !e.rew.Recurrent()) && e.store == nil {
		return 0
	}
	if at := s.req.SnapshotAt; at > 0 && at <= len(s.req.Prompt) {
		return at
	}
	return len(s.req.Prompt)
}

// reuseLen is how much of prompt a request can take over from entry: the
// shared prefix, at least one prompt token left to prefill; for recurrent
// models only the whole entry or its snapshot.
func (e *Engine) reuseLen(entry *cacheEntry, prompt []int32) int {
	n := 0
	for n < len(entry.tokens) && n < len(prompt)-1 && entry.tokens[n] == prompt[n] {
		n++
	}
	if e.rew.Recurrent() && n < len(entry.tokens) {
		if entry.snapLen > 0 && n >= entry.snapLen {
			return entry.snapLen
		}
		return 0
	}
	return n
}

// bestEntryLocked picks the cache entry sharing the longest usable prefix
// with prompt; e.mu must be held.
func (e *Engine) bestEntryLocked(prompt []int32) (*cacheEntry, int) {
	var best *cacheEntry
	bestLen := 0
	for _, c := range e.cache {
		if n := e.reuseLen(c, prompt); n > bestLen {
			best, bestLen = c, n
		}
	}
	if bestLen < minPrefixReuse {
		return nil, 0
	}
	return best, bestLen
}

// reclaimableLocked is the blocks held by cache entries other than keep.
func (e *Engine) reclaimableLocked(keep *cacheEntry) int {
	n := 0
	for _, c := range e.cache {
		if c != keep {
			n += c.held
		}
	}
	return n
}

// evictLocked drops cache entries, oldest first, until free has at least
// want blocks or none is left; their sequences are freed by the loop
// (reap) before it reserves anything.
func (e *Engine) evictLocked(want int) {
	for e.freeBlocks < want && len(e.cache) > 0 {
		c := e.cache[0]
		e.cache = e.cache[1:]
		e.freeBlocks += c.held
		e.evicted = append(e.evicted, c)
	}
}

// reap frees the model sequences of evicted cache entries; loop only.
func (e *Engine) reap() {
	e.mu.Lock()
	ev := e.evicted
	e.evicted = nil
	e.mu.Unlock()
	for _, c := range ev {
		e.freeEntry(c) // already out of the ledger; nothing to undo
	}
}

// adopt continues s from its cache entry: the entry's sequence is cut back
// to the reused prefix. On failure the entry's sequence is freed and s
// starts empty (its ledger holding already covers a full prefill).
func (e *Engine) adopt(s *sequence) bool {
	c := s.reuse
	s.reuse = nil
	err := error(nil)
	switch {
	case s.cached == len(c.tokens):
	case e.rew.Recurrent():
		if s.cached != c.snapLen {
			err = errors.New("recurrent state can only go back to its snapshot")
		} else {
			err = e.rew.Rollback(c.id)
		}
	default:
		err = e.rew.Truncate(c.id, s.cached)
	}
	if err != nil {
		e.freeEntry(c)
		s.cached = 0
		return false
	}
	s.id, s.hasID, s.nPast = c.id, true, s.cached
	e.adoptSpec(s, c)
	if c.snapLen <= s.cached {
		s.snapLen = c.snapLen // still the model's snapshot of this sequence
	}
	return true
}

// keep puts a retiring sequence into the cache instead of freeing it, when
// the cache is on; it reports whether it did. Loop only.
func (e *Engine) keep(s *sequence, err error) bool {
	if e.cfg.PrefixCacheSlots <= 0 || !s.hasID || s.nPast < minPrefixReuse || (err != nil && !isCancel(err)) {
		return false
	}
	if !e.settleSpec(s) {
		return false
	}
	tokens := slices.Clone(s.req.Prompt[:min(s.nPast, len(s.req.Prompt))])
	if s.nPast > len(s.req.Prompt) {
		tokens = append(tokens, s.generated[:s.nPast-len(s.req.Prompt)]...)
	}
	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		return false
	}
	c := &cacheEntry{id: s.id, tokens: tokens, snapLen: s.snapLen, held: s.held, draft: s.spec}
	s.held = 0 // the entry holds them now
	s.spec = nil
	e.cache = append(e.cache, c)
	var drop *cacheEntry
	if len(e.cache) > e.cfg.PrefixCacheSlots {
		drop = e.cache[0]
		e.cache = e.cache[1:]
		e.freeBlocks += drop.held
	}
	e.mu.Unlock()
	if drop != nil {
		e.freeEntry(drop)
	}
	return true
}

// dropCache frees every cache entry (on Close); loop only.
func (e *Engine) dropCache() {
	e.mu.Lock()
	e.evicted = append(e.evicted, e.cache...)
	for _, c := range e.cache {
		e.freeBlocks += c.held
	}
	e.cache = nil
	e.mu.Unlock()
	e.reap()
}

func isCancel(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// StateModel is a Model whose sequences' whole state (KV and recurrent state) can be copied out and back in.
type StateModel interface {
	// Export is the state of a sequence at its current length.
	Export(seq SeqID) ([]byte, error)
	// Import gives an empty sequence (holding KV for the state's length) the exported state.
	Import(seq SeqID, state []byte) error
}

// StateStore keeps sequence states of prompt prefixes beyond the engine (a disk prefix cache: sdk/statecache).
type StateStore interface {
	// Lookup returns the longest stored prefix of prompt that leaves a prompt token to run, and its state (n = 0:
	// none).
	Lookup(prompt []int32) (n int, state []byte)
	// Store keeps state as the state after prefix; it may drop it.
	Store(prefix []int32, state []byte)
}

// lookupStored finds, in the request's own goroutine (reading a state may take a while), the longest prefix of its
// prompt the store holds, for a sequence the in-memory prefix cache does not serve better.
func (e *Engine) lookupStored(s *sequence) {
	if e.store == nil || s.cached >= len(s.req.Prompt)-1 {
		return
	}
	if n, st := e.store.Lookup(s.req.Prompt); n >= minPrefixReuse && n > s.cached {
		s.stored, s.storedState = n, st
	}
}

// importStored starts a new sequence from the stored state its admission found; on failure it prefills as usual.
func (e *Engine) importStored(s *sequence) {
	st := s.storedState
	s.storedState = nil
	if st == nil || s.nPast > 0 {
		return
	}
	if err := e.states.Import(s.id, st); err != nil {
		return
	}
	s.nPast, s.cached, s.storedDone = s.stored, s.stored, true
	if at := e.snapshotAt(s); at == s.nPast {
		e.atSnapshot(s)
	}
}

// atSnapshot runs when a sequence reaches its prompt's snapshot point: the in-memory prefix cache of a recurrent
// model snapshots it, and the state store gets its state (once per request).
func (e *Engine) atSnapshot(s *sequence) {
	if e.rew != nil && e.rew.Recurrent() && s.snapLen != s.nPast && e.rew.Snapshot(s.id) == nil {
		s.snapLen = s.nPast
	}
	if e.store != nil && !s.storedDone {
		s.storedDone = true
		if st, err := e.states.Export(s.id); err == nil {
			e.store.Store(s.req.Prompt[:s.nPast], st)
		}
	}
}
