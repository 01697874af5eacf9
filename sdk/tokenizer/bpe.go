package tokenizer

import (
	"container/heap"
	"math"
)

// mergeTable maps a pair of adjacent token ids to the rank of their merge
// and the id of the merged token: an open-addressing hash table, since this
// lookup is the inner loop of encoding.
type mergeTable struct {
	keys  []uint64 // left<<32 | right; emptyKey marks a free slot
	vals  []uint64 // rank<<32 | result
	shift uint
}

const emptyKey = math.MaxUint64

func newMergeTable(n int) *mergeTable {
	size, shift := 16, uint(60)
	for size < n*2 {
		size *= 2
		shift--
	}
	t := &mergeTable{keys: make([]uint64, size), vals: make([]uint64, size), shift: shift}
	for i := range t.keys {
		t.keys[i] = emptyKey
	}
	return t
}

func pairKey(left, right int32) uint64 { return uint64(uint32(left))<<32 | uint64(uint32(right)) }

func (t *mergeTable) slot(key uint64) uint64 { return (key * 0x9e3779b97f4a7c15) >> t.shift }

// add records a merge unless the pair already has one (the lower rank,
// added first, wins).
func (t *mergeTable) add(left, right, rank, result int32) {
	key := pairKey(left, right)
	mask := uint64(len(t.keys) - 1)
	for i := t.slot(key); ; i = (i + 1) & mask {
		switch t.keys[i] {
		case key:
			return
		case emptyKey:
			t.keys[i] = key
			t.vals[i] = uint64(uint32(rank))<<32 | uint64(uint32(result))
			return
		}
	}
}

// lookup returns the rank and result of merging left and right, or rank
// noMerge.
func (t *mergeTable) lookup(left, right int32) (rank, result int32) {
	key := pairKey(left, right)
	mask := uint64(len(t.keys) - 1)
	for i := t.slot(key); ; i = (i + 1) & mask {
		switch t.keys[i] {
		case key:
			v := t.vals[i]
			return int32(v >> 32), int32(uint32(v))
		case emptyKey:
			return noMerge, -1
		}
	}
}

const noMerge = math.MaxInt32

// bpeScratch holds buffers reused across the pieces of one Encode call.
type bpeScratch struct {
	syms    []int32
	ranks   []int32
	results []int32
	nodes   []bpeNode
	queue   mergeQueue
}

// bpe appends the ids of the byte-level BPE encoding of piece to out:
// start from one token per byte and repeatedly apply the lowest-ranked
// merge among adjacent pairs, the leftmost on ties.
func (t *Tokenizer) bpe(piece string, out []int32, sc *bpeScratch) []int32 {
	if len(piece) > 64 {
		return t.bpeLong(piece, out, sc)
	}
	syms := sc.syms[:0]
	for i := 0; i < len(piece); i++ {
		syms = append(syms, t.byteID[piece[i]])
	}
	ranks, results := sc.ranks[:0], sc.results[:0]
	for k := 0; k+1 < len(syms); k++ {
		r, res := t.merges.lookup(syms[k], syms[k+1])
		ranks = append(ranks, r)
		results = append(results, res)
	}
	for len(ranks) > 0 {
		best, bi := int32(noMerge), -1
		for k, r := range ranks {
			if r < best {
				best, bi = r, k
			}
		}
		if bi < 0 {
			break
		}
		syms[bi] = results[bi]
		syms = append(syms[:bi+1], syms[bi+2:]...)
		ranks = append(ranks[:bi], ranks[bi+1:]...)
		results = append(results[:bi], results[bi+1:]...)
		if bi < len(ranks) {
			ranks[bi], results[bi] = t.merges.lookup(syms[bi], syms[bi+1])
		}
		if bi > 0 {
			ranks[bi-1], results[bi-1] = t.merges.lookup(syms[bi-1], syms[bi])
		}
	}
	sc.syms, sc.ranks, sc.results = syms, ranks, results
	return append(out, syms...)
}

type bpeNode struct {
	id         int32
	prev, next int32 // indices into nodes; -1 at the ends
}

type mergeCand struct {
	rank, pos   int32
	left, right int32 // ids expected at pos and pos.next when the candidate was made
}

type mergeQueue []mergeCand

func (q mergeQueue) Len() int { return len(q) }
func (q mergeQueue) Less(i, j int) bool {
	if q[i].rank != q[j].rank {
		return q[i].rank < q[j].rank
	}
	return q[i].pos < q[j].pos
}
func (q mergeQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *mergeQueue) Push(x any)   { *q = append(*q, x.(mergeCand)) }
func (q *mergeQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// bpeLong is bpe for long pieces (whitespace or punctuation runs), in
// O(n log n) with a priority queue instead of rescanning all pairs.
func (t *Tokenizer) bpeLong(piece string, out []int32, sc *bpeScratch) []int32 {
	nodes := sc.nodes[:0]
	for i := 0; i < len(piece); i++ {
		nodes = append(nodes, bpeNode{id: t.byteID[piece[i]], prev: int32(i - 1), next: int32(i + 1)})
	}
	nodes[len(nodes)-1].next = -1
	q := sc.queue[:0]
	push := func(pos int32) {
		n := nodes[pos]
		if n.next < 0 {
			return
		}
		right := nodes[n.next].id
		if r, _ := t.merges.lookup(n.id, right); r != noMerge {
			heap.Push(&q, mergeCand{rank: r, pos: pos, left: n.id, right: right})
		}
	}
	for i := range nodes {
		push(int32(i))
	}
	for q.Len() > 0 {
		c := heap.Pop(&q).(mergeCand)
		n := &nodes[c.pos]
		if n.id != c.left || n.next < 0 || nodes[n.next].id != c.right {
			continue // stale: one side has merged since
		}
		_, res := t.merges.lookup(c.left, c.right)
		gone := n.next
		n.id = res
		n.next = nodes[gone].next
		nodes[gone].id = -1
		if n.next >= 0 {
			nodes[n.next].prev = c.pos
		}
		if n.prev >= 0 {
			push(n.prev)
		}
		push(c.pos)
	}
	for i := int32(0); i >= 0; i = nodes[i].next {
		out = append(out, nodes[i].id)
	}
	sc.nodes, sc.queue = nodes, q
	return out
}
