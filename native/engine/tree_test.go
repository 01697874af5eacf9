package engine

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/matryer/is"
)

// randomTree returns parents of an n-node tree (node 0 the root) that mixes a spine with branches.
func randomTree(rng *rand.Rand, n int) []int32 {
	p := make([]int32, n)
	p[0] = -1
	for i := 1; i < n; i++ {
		if rng.IntN(3) == 0 {
			p[i] = int32(i - 1)
		} else {
			p[i] = int32(rng.IntN(i))
		}
	}
	return p
}

// pathTo is the flat indices from the root to node i.
func pathTo(parents []int32, i int) []int32 {
	var rev []int32
	for j := int32(i); j >= 0; j = parents[j] {
		rev = append(rev, j)
	}
	out := make([]int32, len(rev))
	for k := range rev {
		out[k] = rev[len(rev)-1-k]
	}
	return out
}

func tokensOf(tokens []int32, path []int32) []int32 {
	out := make([]int32, len(path))
	for k, j := range path {
		out[k] = tokens[j]
	}
	return out
}

// deepest returns a node of greatest depth (the last one found), so accept paths are long and usually branch.
func deepest(parents []int32) int {
	best, bd := 0, 0
	for i := range parents {
		if d := len(pathTo(parents, i)); d >= bd {
			best, bd = i, d
		}
	}
	return best
}

// chainRow is the last logits row of prefix + toks on a fresh sequence.
func chainRow(t *testing.T, m *Model, prefix, toks []int32) []float32 {
	t.Helper()
	s, err := m.NewSeq()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.FreeSeq(s) }()
	r, err := m.Forward(one(s, append(append([]int32{}, prefix...), toks...), LogitsLast))
	if err != nil {
		t.Fatal(err)
	}
	return append([]float32(nil), r.Row(0, 0)...)
}

func treeConfigs() []config { return []config{tinyQwen3(), tinyQwen35()} }

// Every node's logits row of a tree forward equals the last row of the chain prefix + its root-to-node tokens; top-k
// of a tree forward agrees.
func TestTreeLogitsEqualChainLogits(t *testing.T) {
	lib := openCPU(t)
	for _, c := range treeConfigs() {
		t.Run(c.arch, func(t *testing.T) {
			is := is.New(t)
			m := loadRandom(t, lib, c, Options{KVPoolTokens: 1024, MaxSeqs: 3, CacheK: CacheF32, CacheV: CacheF32, Threads: 2})
			rng := rand.New(rand.NewPCG(11, 3))
			// a full binary tree of 63 nodes: the most states a tree's schedule sets aside at once (five)
			binary := make([]int32, 63)
			for i := range binary {
				binary[i] = int32((i - 1) / 2)
			}
			binary[0] = -1
			// 57 prefix tokens: the tree's cache rows straddle the CPU kernel's 64-position tiles
			for _, tc := range []struct {
				plen    int
				parents []int32
			}{{57, randomTree(rng, 13)}, {5, randomTree(rng, 13)}, {5, binary}} {
				plen, parents := tc.plen, tc.parents
				prefix := randomTokens(rng, plen, c.vocab)
				toks := randomTokens(rng, len(parents), c.vocab)
				s, _ := m.NewSeq()
				_, err := m.Forward(one(s, prefix, LogitsNone))
				is.NoErr(err)
				r, err := m.Forward(Batch{Entries: []Entry{{Seq: s, Tokens: toks, Parents: parents, Logits: LogitsAll}}})
				is.NoErr(err)
				n, _ := m.SeqLen(s)
				is.Equal(n, plen+len(parents))
				for i := range toks {
					want := chainRow(t, m, prefix, tokensOf(toks, pathTo(parents, i)))
					if e := relErr(r.Row(0, i), want); e > 1e-4 {
						t.Fatalf("prefix %d, node %d (path %v): rel err %g", plen, i, pathTo(parents, i), e)
					}
				}
				// the same tree with top-k
				is.NoErr(m.Truncate(s, plen))
				rk, err := m.Forward(Batch{Entries: []Entry{{Seq: s, Tokens: toks, Parents: parents, Logits: LogitsAll}}, TopK: 4})
				is.NoErr(err)
				for i := range toks {
					ids, _, _, ok := rk.Candidates(0, i)
					is.True(ok)
					is.Equal(ids[0], argmax(r.Row(0, i)))
				}
				is.NoErr(m.FreeSeq(s))
			}
		})
	}
}

// After AcceptPath the sequence continues exactly like one that decoded prefix + the path's tokens one by one.
func TestTreeAcceptPathThenDecode(t *testing.T) {
	lib := openCPU(t)
	for _, c := range treeConfigs() {
		t.Run(c.arch, func(t *testing.T) {
			is := is.New(t)
			m := loadRandom(t, lib, c, Options{KVPoolTokens: 1024, MaxSeqs: 3, CacheK: CacheF32, CacheV: CacheF32, Threads: 2})
			rng := rand.New(rand.NewPCG(12, 4))
			for trial := 0; trial < 5; trial++ {
				prefix := randomTokens(rng, 9+trial*7, c.vocab)
				size := 12
				if trial == 4 { // a tree of 60 tokens: more states set aside than a small tree's
					size = 60
				}
				parents := randomTree(rng, size)
				toks := randomTokens(rng, size, c.vocab)
				next := randomTokens(rng, 3, c.vocab)
				var path []int32
				switch trial {
				case 0, 4:
					path = pathTo(parents, deepest(parents))
				case 1:
					path = []int32{0} // root only
				default:
					path = pathTo(parents, rng.IntN(size))
				}

				// reference: one token at a time
				ref, _ := m.NewSeq()
				_, err := m.Forward(one(ref, prefix, LogitsNone))
				is.NoErr(err)
				for _, tok := range tokensOf(toks, path) {
					_, err = m.Forward(one(ref, []int32{tok}, LogitsNone))
					is.NoErr(err)
				}
				var want [][]float32
				for _, tok := range next {
					r, err := m.Forward(one(ref, []int32{tok}, LogitsLast))
					is.NoErr(err)
					want = append(want, append([]float32(nil), r.Row(0, 0)...))
				}
				is.NoErr(m.FreeSeq(ref))

				s, _ := m.NewSeq()
				_, err = m.Forward(one(s, prefix, LogitsNone))
				is.NoErr(err)
				_, err = m.Forward(Batch{Entries: []Entry{{Seq: s, Tokens: toks, Parents: parents, Logits: LogitsAll}}})
				is.NoErr(err)
				// the tree must be resolved before the sequence goes on
				_, err = m.Forward(one(s, next, LogitsAll))
				is.True(errors.Is(err, ErrState))
				is.NoErr(m.AcceptPath(s, path))
				n, _ := m.SeqLen(s)
				is.Equal(n, len(prefix)+len(path))
				got, err := m.Forward(one(s, next, LogitsAll))
				is.NoErr(err)
				for i := range next {
					if e := relErr(got.Row(0, i), want[i]); e > 1e-4 {
						t.Fatalf("trial %d, path %v, next token %d: rel err %g", trial, path, i, e)
					}
				}
				is.NoErr(m.FreeSeq(s))
			}
		})
	}
}

// AcceptPath moves whole cache rows: 16-bit caches too.
func TestTreeAcceptPath16BitCache(t *testing.T) {
	lib := openCPU(t)
	for _, c := range treeConfigs() {
		t.Run(c.arch, func(t *testing.T) {
			is := is.New(t)
			m := loadRandom(t, lib, c, Options{KVPoolTokens: 512, MaxSeqs: 2, CacheK: CacheF16, CacheV: CacheBF16, Threads: 2})
			rng := rand.New(rand.NewPCG(16, 8))
			prefix, toks, next := randomTokens(rng, 20, c.vocab), randomTokens(rng, 12, c.vocab), randomTokens(rng, 2, c.vocab)
			parents := randomTree(rng, 12)
			path := pathTo(parents, deepest(parents))
			want := chainRow(t, m, prefix, append(tokensOf(toks, path), next...))
			s, _ := m.NewSeq()
			_, err := m.Forward(one(s, prefix, LogitsNone))
			is.NoErr(err)
			_, err = m.Forward(Batch{Entries: []Entry{{Seq: s, Tokens: toks, Parents: parents}}})
			is.NoErr(err)
			is.NoErr(m.AcceptPath(s, path))
			got, err := m.Forward(one(s, next, LogitsLast))
			is.NoErr(err)
			if e := relErr(got.Row(0, 0), want); e > 1e-4 {
				t.Fatalf("path %v: rel err %g", path, e)
			}
		})
	}
}

// Truncating a tree to a chain prefix of its flat order works like AcceptPath; other lengths are refused.
func TestTreeTruncate(t *testing.T) {
	lib := openCPU(t)
	for _, c := range treeConfigs() {
		t.Run(c.arch, func(t *testing.T) {
			is := is.New(t)
			m := loadRandom(t, lib, c, Options{KVPoolTokens: 512, MaxSeqs: 2, CacheK: CacheF32, CacheV: CacheF32, Threads: 2})
			rng := rand.New(rand.NewPCG(13, 5))
			prefix, toks, next := randomTokens(rng, 10, c.vocab), randomTokens(rng, 6, c.vocab), randomTokens(rng, 2, c.vocab)
			parents := []int32{-1, 0, 1, 0, 3, 2} // spine 0-1-2, then branches
			want := chainRow(t, m, prefix, append(append([]int32{}, toks[:3]...), next...))
			s, _ := m.NewSeq()
			_, err := m.Forward(one(s, prefix, LogitsNone))
			is.NoErr(err)
			_, err = m.Forward(Batch{Entries: []Entry{{Seq: s, Tokens: toks, Parents: parents, Logits: LogitsNone}}})
			is.NoErr(err)
			err = m.Truncate(s, 14) // tokens 0..3 are not a chain
			is.True(errors.Is(err, ErrState))
			is.NoErr(m.Truncate(s, 13))
			got, err := m.Forward(one(s, next, LogitsLast))
			is.NoErr(err)
			is.True(relErr(got.Row(0, 0), want) < 1e-4)
		})
	}
}

// Two tree entries and an ordinary one in one forward give what each gives alone.
func TestTreeBatchedEqualsAlone(t *testing.T) {
	lib := openCPU(t)
	for _, c := range treeConfigs() {
		t.Run(c.arch, func(t *testing.T) {
			is := is.New(t)
			m := loadRandom(t, lib, c, Options{KVPoolTokens: 1024, MaxSeqs: 3, CacheK: CacheF32, CacheV: CacheF32, Threads: 2})
			rng := rand.New(rand.NewPCG(14, 6))
			prefixes := [][]int32{randomTokens(rng, 12, c.vocab), randomTokens(rng, 30, c.vocab), randomTokens(rng, 7, c.vocab)}
			entries := []Entry{
				{Tokens: randomTokens(rng, 10, c.vocab), Parents: randomTree(rng, 10), Logits: LogitsAll},
				{Tokens: randomTokens(rng, 5, c.vocab), Logits: LogitsAll},
				{Tokens: randomTokens(rng, 14, c.vocab), Parents: randomTree(rng, 14), Logits: LogitsAll},
			}
			seqs := make([]Seq, 3)
			prefill := func() {
				for i := range seqs {
					seqs[i], _ = m.NewSeq()
					_, err := m.Forward(one(seqs[i], prefixes[i], LogitsNone))
					is.NoErr(err)
					entries[i].Seq = seqs[i]
				}
			}
			free := func() {
				for _, s := range seqs {
					is.NoErr(m.FreeSeq(s))
				}
			}
			prefill()
			var alone [][][]float32
			for i := range entries {
				r, err := m.Forward(Batch{Entries: []Entry{entries[i]}})
				is.NoErr(err)
				var rows [][]float32
				for j := range entries[i].Tokens {
					rows = append(rows, append([]float32(nil), r.Row(0, j)...))
				}
				alone = append(alone, rows)
			}
			free()
			prefill()
			r, err := m.Forward(Batch{Entries: entries})
			is.NoErr(err)
			for i := range entries {
				for j := range entries[i].Tokens {
					if e := relErr(r.Row(i, j), alone[i][j]); e > 1e-5 {
						t.Fatalf("entry %d row %d: rel err %g", i, j, e)
					}
				}
			}
			free()
		})
	}
}

func TestTreeErrors(t *testing.T) {
	lib := openCPU(t)
	for _, c := range treeConfigs() {
		t.Run(c.arch, func(t *testing.T) {
			is := is.New(t)
			m := loadRandom(t, lib, c, Options{KVPoolTokens: 512, MaxSeqs: 2, CacheK: CacheF32, CacheV: CacheF32, Threads: 2})
			rng := rand.New(rand.NewPCG(15, 7))
			s, _ := m.NewSeq()
			_, err := m.Forward(one(s, randomTokens(rng, 8, c.vocab), LogitsNone))
			is.NoErr(err)
			toks := randomTokens(rng, 4, c.vocab)
			tree := func(p []int32) error {
				_, err := m.Forward(Batch{Entries: []Entry{{Seq: s, Tokens: toks, Parents: p, Logits: LogitsAll}}})
				return err
			}
			expect := func(err, kind error, words string) {
				t.Helper()
				if !errors.Is(err, kind) || !strings.Contains(err.Error(), words) {
					t.Fatalf("got %v, want %v naming %q", err, kind, words)
				}
			}
			expect(tree([]int32{-1, 0, 2, 1}), ErrInvalid, "parents[2] = 2")
			expect(tree([]int32{-1, 0, -1, 1}), ErrInvalid, "second root")
			expect(tree([]int32{0, 0, 1, 1}), ErrInvalid, "root")
			long := randomTokens(rng, 65, c.vocab)
			_, err = m.Forward(Batch{Entries: []Entry{{Seq: s, Tokens: long, Parents: randomTree(rng, 65)}}})
			expect(err, ErrInvalid, "at most 64")
			n, _ := m.SeqLen(s)
			is.Equal(n, 8) // nothing changed

			// accept after an ordinary forward
			expect(m.AcceptPath(s, []int32{0}), ErrState, "not a tree forward")
			is.NoErr(tree([]int32{-1, 0, 0, 2}))
			expect(m.AcceptPath(s, []int32{0, 1, 3}), ErrState, "not a child")
			expect(m.AcceptPath(s, []int32{1}), ErrState, "not the root")
			expect(m.AcceptPath(s, []int32{0, 7}), ErrState, "not a node")
			_, err = m.Forward(one(s, toks, LogitsNone))
			expect(err, ErrState, "unresolved tree")
			is.NoErr(m.AcceptPath(s, []int32{0, 2, 3}))
			n, _ = m.SeqLen(s)
			is.Equal(n, 11)
			expect(m.AcceptPath(s, []int32{0}), ErrState, "not a tree forward") // resolved already
		})
	}
}
