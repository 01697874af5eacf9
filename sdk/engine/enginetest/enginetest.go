// Package enginetest provides test doubles for package engine: FakeModel, a
// model whose logits are a deterministic function of each sequence's token
// history (so any scheduling mistake — a token fed twice, a chunk skipped,
// sequences mixed up — changes the output), and ByteVocab, a vocabulary of
// the 256 bytes plus end-of-generation and <think>/</think> tokens (vocab.go, with
// its detokenizer and a <think> parser), and OracleDrafter, a drafter whose
// acceptance the test controls (drafter.go).
package enginetest

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"

	"github.com/dflash/dflash_server/sdk/engine"
)

// Token ids of ByteVocab beyond the 256 bytes.
const (
	EOG        int32 = 256
	ThinkOpen  int32 = 257
	ThinkClose int32 = 258
	// VocabSize is the number of logits per row of FakeModel.
	VocabSize = 259
)

// Entry is one sequence's part of a recorded forward.
type Entry struct {
	Seq    engine.SeqID
	Tokens int
	Logits engine.LogitsMode
}

// FakeModel is a fake engine.Model with deterministic logits: the favoured
// next token after a history (every token fed to the sequence so far) is
// Next(history). It keeps a real block pool and fails like the native
// engine: ErrNoKV when a forward or reservation needs blocks the pool does
// not have, errors for unknown sequences. It samples greedily.
type FakeModel struct {
	// Next picks the favoured token after history; nil uses Letters.
	Next func(history []int32) int32
	// BeforeForward, when set, runs at the start of every forward (tests
	// use it to hold the loop or count steps).
	BeforeForward func(batch []engine.SeqInput)
	// RecurrentState makes the model behave like one with recurrent
	// layers: Truncate fails, only Rollback to a Snapshot goes back.
	RecurrentState bool
	// Dist, when set, gives the whole logits row after a history instead of Next's favourite; Sample then draws
	// from softmax(row / temperature) when the request samples.
	Dist func(history []int32) []float32

	mu        sync.Mutex
	blockSize int
	blocks    int
	slots     int
	free      int
	seqs      map[engine.SeqID]*fakeSeq
	steps     [][]Entry
	logits    []float32
	imports   int
	feats     []float32 // ForwardCapture's features, overwritten by the next call
}

type fakeSeq struct {
	history []int32
	blocks  int
	snap    []int32
	hasSnap bool
	recFrom int // length before the last Record forward, -1 without one
	// tree is the last forward's tree (tokens and parents) when it was one, until AcceptPath; treeBase the
	// history length before it.
	tree, treeParents []int32
	treeBase          int
}

var (
	_ engine.Model        = (*FakeModel)(nil)
	_ engine.Rewinder     = (*FakeModel)(nil)
	_ engine.Verifier     = (*FakeModel)(nil)
	_ engine.TreeVerifier = (*FakeModel)(nil)
	_ engine.StateModel   = (*FakeModel)(nil)
)

// NewFakeModel returns a fake model with a pool of blocks KV blocks of
// blockSize tokens and slots sequence slots.
func NewFakeModel(blockSize, blocks, slots int) *FakeModel {
	return &FakeModel{blockSize: blockSize, blocks: blocks, slots: slots, free: blocks, seqs: map[engine.SeqID]*fakeSeq{}}
}

// Letters is the default Next: a lowercase letter or space chosen by a hash
// of the whole history; it never ends generation.
func Letters(history []int32) int32 {
	h := fnv.New64a()
	var b [4]byte
	for _, t := range history {
		b[0], b[1], b[2], b[3] = byte(t), byte(t>>8), byte(t>>16), byte(t>>24)
		h.Write(b[:])
	}
	const alphabet = "abcdefghijklmnopqrstuvwxyz "
	return int32(alphabet[h.Sum64()%uint64(len(alphabet))])
}

// Reply makes a Next that answers every prompt of promptLen tokens with
// reply, then EOG.
func Reply(promptLen int, reply []int32) func([]int32) int32 {
	return func(history []int32) int32 {
		if i := len(history) - promptLen; i >= 0 && i < len(reply) {
			return reply[i]
		}
		return EOG
	}
}

func (m *FakeModel) VocabSize() int   { return VocabSize }
func (m *FakeModel) KVBlockSize() int { return m.blockSize }
func (m *FakeModel) KVBlocks() int    { return m.blocks }
func (m *FakeModel) MaxSeqs() int     { return m.slots }

func (m *FakeModel) NewSeq() (engine.SeqID, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id := engine.SeqID(0); int(id) < m.slots; id++ {
		if _, used := m.seqs[id]; !used {
			m.seqs[id] = &fakeSeq{recFrom: -1}
			return id, nil
		}
	}
	return 0, fmt.Errorf("every one of %d sequence slots is in use", m.slots)
}

func (m *FakeModel) FreeSeq(id engine.SeqID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.seqs[id]
	if !ok {
		return fmt.Errorf("free unknown sequence %d", id)
	}
	m.free += s.blocks
	delete(m.seqs, id)
	return nil
}

func (m *FakeModel) Reserve(id engine.SeqID, tokens int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.seqs[id]
	if !ok {
		return fmt.Errorf("reserve for unknown sequence %d", id)
	}
	return m.holdLocked(s, tokens)
}

func (m *FakeModel) holdLocked(s *fakeSeq, tokens int) error {
	need := (tokens+m.blockSize-1)/m.blockSize - s.blocks
	if need <= 0 {
		return nil
	}
	if need > m.free {
		return fmt.Errorf("%w: %d blocks needed, %d free", engine.ErrNoKV, need, m.free)
	}
	m.free -= need
	s.blocks += need
	return nil
}

func (m *FakeModel) Forward(ctx context.Context, batch []engine.SeqInput) ([]float32, error) {
	if m.BeforeForward != nil {
		m.BeforeForward(batch)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	next := m.Next
	if next == nil {
		next = Letters
	}
	step := make([]Entry, 0, len(batch))
	rows := 0
	seen := map[engine.SeqID]bool{}
	for _, in := range batch {
		s, ok := m.seqs[in.Seq]
		if !ok {
			return nil, fmt.Errorf("forward on unknown sequence %d", in.Seq)
		}
		if seen[in.Seq] {
			return nil, fmt.Errorf("sequence %d appears twice in one batch", in.Seq)
		}
		seen[in.Seq] = true
		if len(in.Tokens) == 0 {
			return nil, fmt.Errorf("sequence %d: empty entry", in.Seq)
		}
		if err := m.holdLocked(s, len(s.history)+len(in.Tokens)); err != nil {
			return nil, err
		}
		switch in.Logits {
		case engine.LogitsLast:
			rows++
		case engine.LogitsAll:
			rows += len(in.Tokens)
		}
		step = append(step, Entry{Seq: in.Seq, Tokens: len(in.Tokens), Logits: in.Logits})
	}
	m.steps = append(m.steps, step)
	if cap(m.logits) < rows*VocabSize {
		m.logits = make([]float32, rows*VocabSize)
	}
	out := m.logits[:rows*VocabSize]
	clear(out)
	r := 0
	for _, in := range batch {
		s := m.seqs[in.Seq]
		s.recFrom = -1
		if in.Record {
			s.recFrom = len(s.history)
		}
		s.tree, s.treeParents = nil, nil
		if in.Parents != nil {
			rows, err := m.treeRows(s, in, out[r*VocabSize:], next)
			if err != nil {
				return nil, err
			}
			r += rows
			continue
		}
		for i, t := range in.Tokens {
			s.history = append(s.history, t)
			if in.Logits == engine.LogitsAll || (in.Logits == engine.LogitsLast && i == len(in.Tokens)-1) {
				row := out[r*VocabSize : (r+1)*VocabSize]
				if m.Dist != nil {
					copy(row, m.Dist(s.history))
				} else {
					fav := next(s.history)
					row[fav] = 10
					row[runnerUp(fav)] = 5 // picked when fav is suppressed
				}
				r++
			}
		}
	}
	return out, nil
}

// treeRows runs a tree entry: each token's row comes from the history along its path from the root; the tokens
// land in the history in tree order (as a real model writes their KV), to be sorted out by AcceptPath.
func (m *FakeModel) treeRows(s *fakeSeq, in engine.SeqInput, out []float32, next func([]int32) int32) (int, error) {
	if len(in.Parents) != len(in.Tokens) || in.Parents[0] != -1 {
		return 0, fmt.Errorf("sequence %d: tree of %d tokens with %d parents (root %v)", in.Seq, len(in.Tokens), len(in.Parents), in.Parents)
	}
	base := len(s.history)
	rows := 0
	for i := range in.Tokens {
		if i > 0 && (in.Parents[i] < 0 || int(in.Parents[i]) >= i) {
			return 0, fmt.Errorf("sequence %d: tree token %d has parent %d", in.Seq, i, in.Parents[i])
		}
		var path []int32
		for j := int32(i); j >= 0; j = in.Parents[j] {
			path = append([]int32{in.Tokens[j]}, path...)
			if j == 0 {
				break
			}
		}
		if in.Logits == engine.LogitsAll {
			row := out[rows*VocabSize : (rows+1)*VocabSize]
			h := append(append([]int32(nil), s.history[:base]...), path...)
			fav := next(h)
			row[fav] = 10
			row[runnerUp(fav)] = 5
			rows++
		}
	}
	s.history = append(s.history, in.Tokens...)
	s.tree, s.treeParents, s.treeBase = append([]int32(nil), in.Tokens...), append([]int32(nil), in.Parents...), base
	return rows, nil
}

// AcceptPath keeps a root-to-node path of the sequence's last tree forward.
func (m *FakeModel) AcceptPath(id engine.SeqID, path []int32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.seqs[id]
	if !ok || s.tree == nil {
		return fmt.Errorf("sequence %d: no tree forward to keep a path of", id)
	}
	if len(path) == 0 || path[0] != 0 {
		return fmt.Errorf("sequence %d: path %v does not start at the root", id, path)
	}
	for i := 1; i < len(path); i++ {
		if int(path[i]) >= len(s.tree) || s.treeParents[path[i]] != path[i-1] {
			return fmt.Errorf("sequence %d: path %v is not a path of the tree %v", id, path, s.treeParents)
		}
	}
	s.history = s.history[:s.treeBase]
	for _, n := range path {
		s.history = append(s.history, s.tree[n])
	}
	s.tree, s.treeParents = nil, nil
	return nil
}

func runnerUp(fav int32) int32 {
	if fav == '.' {
		return ','
	}
	return '.'
}

func (m *FakeModel) Recurrent() bool { return m.RecurrentState }

func (m *FakeModel) Truncate(id engine.SeqID, tokens int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.seqs[id]
	switch {
	case !ok:
		return fmt.Errorf("truncate unknown sequence %d", id)
	case s.tree != nil:
		return fmt.Errorf("sequence %d: truncate after a tree forward (its rows are in tree order; keep a path)", id)
	case m.RecurrentState && (s.recFrom < 0 || tokens < s.recFrom):
		return fmt.Errorf("sequence %d: recurrent state cannot be truncated to %d outside its last recorded forward", id, tokens)
	case tokens < 0 || tokens > len(s.history):
		return fmt.Errorf("sequence %d: truncate to %d of %d tokens", id, tokens, len(s.history))
	}
	s.history = s.history[:tokens]
	if len(s.snap) > tokens {
		s.hasSnap = false
	}
	return nil
}

func (m *FakeModel) Snapshot(id engine.SeqID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.seqs[id]
	if !ok {
		return fmt.Errorf("snapshot unknown sequence %d", id)
	}
	s.snap, s.hasSnap = append(s.snap[:0], s.history...), true
	return nil
}

func (m *FakeModel) Rollback(id engine.SeqID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.seqs[id]
	if !ok || !s.hasSnap {
		return fmt.Errorf("sequence %d has no snapshot", id)
	}
	s.history = append(s.history[:0], s.snap...)
	return nil
}

// Sample is greedy (the highest logit, lowest id on ties), or with Dist set and a positive temperature a draw from
// softmax(logits / temperature) with the request's generator.
func (m *FakeModel) Sample(logits []float32, p *engine.Sampling, _ []int32, rng *uint64) (int32, error) {
	if m.Dist != nil && p.Temperature > 0 {
		return drawSoftmax(logits, p.Temperature, rng), nil
	}
	best := 0
	for i, v := range logits {
		if v > logits[best] {
			best = i
		}
	}
	return int32(best), nil
}

// SampleDist is the distribution Sample draws from: softmax(logits / temperature) over the finite logits with Dist
// set and a positive temperature, else the greedy pick alone.
func (m *FakeModel) SampleDist(logits []float32, p *engine.Sampling, history []int32, ids []int32, probs []float64) (int, error) {
	if m.Dist == nil || p.Temperature <= 0 {
		tok, err := m.Sample(logits, p, history, nil)
		ids[0], probs[0] = tok, 1
		return 1, err
	}
	w, sum := softmaxWeights(logits, p.Temperature)
	n := 0
	for i, v := range w {
		if v > 0 {
			ids[n], probs[n] = int32(i), v/sum
			n++
		}
	}
	return n, nil
}

// Export is the sequence's history, four bytes a token.
func (m *FakeModel) Export(id engine.SeqID) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.seqs[id]
	if !ok {
		return nil, fmt.Errorf("export unknown sequence %d", id)
	}
	out := make([]byte, 0, 4*len(s.history))
	for _, t := range s.history {
		out = append(out, byte(t), byte(t>>8), byte(t>>16), byte(t>>24))
	}
	return out, nil
}

// Import gives an empty sequence an exported history; it must hold the KV blocks for it.
func (m *FakeModel) Import(id engine.SeqID, state []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.seqs[id]
	switch {
	case !ok:
		return fmt.Errorf("import into unknown sequence %d", id)
	case len(s.history) > 0:
		return fmt.Errorf("import into sequence %d of %d tokens", id, len(s.history))
	case len(state)%4 != 0:
		return fmt.Errorf("import a state of %d bytes", len(state))
	case s.blocks*m.blockSize < len(state)/4:
		return fmt.Errorf("%w: import of %d tokens into %d reserved", engine.ErrNoKV, len(state)/4, s.blocks*m.blockSize)
	}
	for i := 0; i < len(state); i += 4 {
		s.history = append(s.history, int32(uint32(state[i])|uint32(state[i+1])<<8|uint32(state[i+2])<<16|uint32(state[i+3])<<24))
	}
	m.imports++
	return nil
}

// Imports is how many sequences started from an imported state.
func (m *FakeModel) Imports() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.imports
}

// Steps returns the recorded forwards.
func (m *FakeModel) Steps() [][]Entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([][]Entry(nil), m.steps...)
}

// LiveSeqs is the number of allocated sequences; FreeBlocks the pool's
// blocks not held by any.
func (m *FakeModel) LiveSeqs() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.seqs)
}

// FreeBlocks is the number of KV blocks no sequence holds.
func (m *FakeModel) FreeBlocks() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.free
}

// FeatureSize is the floats of one token's FakeModel features: the token id and its position.
const FeatureSize = 2

// ForwardCapture is Forward that also returns features for every token fed: its id and its position in the
// sequence, so a drafter can tell exactly which context it was given. FakeModel has no candidates path (k is
// ignored; the engine only asks a CandidateModel for candidates). The features live in one buffer that the next
// call overwrites, as the native backend's in-place captures do (engine.Verifier allows it): a caller that kept the
// last call's would see -1s.
func (m *FakeModel) ForwardCapture(ctx context.Context, batch []engine.SeqInput, _ []int, _ int) ([]float32, engine.Candidates, []float32, error) {
	m.mu.Lock()
	for i := range m.feats {
		m.feats[i] = -1
	}
	feats := m.feats[:0]
	for _, in := range batch {
		n := 0
		if s, ok := m.seqs[in.Seq]; ok {
			n = len(s.history)
		}
		for i, t := range in.Tokens {
			pos := n + i
			if in.Parents != nil { // a tree token sits at its depth
				pos = n
				for j := i; j > 0; j = int(in.Parents[j]) {
					pos++
				}
			}
			feats = append(feats, float32(t), float32(pos))
		}
	}
	m.feats = feats
	m.mu.Unlock()
	logits, err := m.Forward(ctx, batch)
	return logits, engine.Candidates{}, feats, err
}
