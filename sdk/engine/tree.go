package engine

import (
	"container/heap"
	"fmt"
	"math"

	"github.com/dflash/dflash_server/sdk"
)

// Tree verification (DDTree): instead of the draft's top-1 chain, the target verifies a tree of the draft's likeliest
// continuations in one forward, and the sequence keeps the longest path the target's own samples walk down.

const (
	// treeK is how many candidates per block position the tree is built from.
	treeK = 8
	// maxTreeBudget keeps a tree (root included) within the 64 tokens a tree forward can relate.
	maxTreeBudget = 63
)

// treeCand is a node the best-first search may add next: candidate rank of depth (1-based block position) under
// parent, with its path's draft log-probability.
type treeCand struct {
	parent, depth, rank int
	score               float64
}

type candHeap []treeCand

func (h candHeap) Len() int           { return len(h) }
func (h candHeap) Less(i, j int) bool { return h[i].score > h[j].score }
func (h candHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *candHeap) Push(x any)        { *h = append(*h, x.(treeCand)) }
func (h *candHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// planTree turns the draft's candidates for s's block (rows row..row+n-1 of c, block positions 1..n) into the tree
// s verifies next: its top-1 chain first, then the best-scoring nodes (sum of the draft's log-probabilities along the
// path, positions taken as independent), within the tree budget and the tokens s may still commit. s.feed becomes
// the tree's tokens in insertion order (every parent before its children) and s.spec.parents their parents.
func (e *Engine) planTree(s *sequence, c Candidates, row, n int) {
	// tokens, root included: the budget, never a row that could not be committed (token budget, context end)
	limit := min(e.cfg.TreeBudget+1, s.req.MaxTokens-len(s.generated), e.cfg.MaxCtx-s.nPast)
	depths := min(n, limit-1)
	lp := func(depth, rank int) float64 { // log-probability of a candidate; -Inf when there is none
		i := (row+depth-1)*c.K + rank
		if rank >= c.K || c.IDs[i] < 0 {
			return math.Inf(-1)
		}
		return float64(c.Logits[i] - c.LSE[row+depth-1])
	}
	id := func(depth, rank int) int32 { return c.IDs[(row+depth-1)*c.K+rank] }
	parents := append(s.spec.parents[:0], -1)
	score := []float64{0}
	var h candHeap
	add := func(x treeCand) int {
		s.feed = append(s.feed, id(x.depth, x.rank))
		parents = append(parents, int32(x.parent))
		score = append(score, x.score)
		node := len(s.feed) - 1
		if next := x.rank + 1; !math.IsInf(lp(x.depth, next), -1) {
			heap.Push(&h, treeCand{parent: x.parent, depth: x.depth, rank: next, score: score[x.parent] + lp(x.depth, next)})
		}
		return node
	}
	// The top-1 chain first: with a quantized or unsure draft, best-first alone spends the budget on side branches
	// of the first positions while the chain is what is most often accepted.
	last := 0
	for d := 1; d <= depths && len(s.feed) < limit && !math.IsInf(lp(d, 0), -1); d++ {
		last = add(treeCand{parent: last, depth: d, rank: 0, score: score[last] + lp(d, 0)})
	}
	if dl := int(len(s.feed) - 1); dl < depths && dl > 0 && !math.IsInf(lp(dl+1, 0), -1) {
		heap.Push(&h, treeCand{parent: last, depth: dl + 1, rank: 0, score: score[last] + lp(dl+1, 0)})
	}
	for len(s.feed) < limit && h.Len() > 0 {
		x := heap.Pop(&h).(treeCand)
		node := add(x)
		if x.depth < depths && !math.IsInf(lp(x.depth+1, 0), -1) {
			heap.Push(&h, treeCand{parent: node, depth: x.depth + 1, rank: 0, score: score[node] + lp(x.depth+1, 0)})
		}
	}
	s.spec.parents = parents
	if len(s.feed) == 1 {
		s.spec.parents = parents[:0]
	}
}

// verifyTree takes the target's rows for a verified tree (rows(i) is the row of tree node i; tokens and parents as
// planTree made them): starting at the root it samples each node's row exactly as plain decoding would and moves to
// the child holding that sample, if there is one; the samples are committed as one event, the visited path is kept
// and its features wait for the draft, and the first sample without a child becomes the next root.
func (e *Engine) verifyTree(s *sequence, nBefore int, tokens, parents []int32, rows func(int) ([]float32, *candidateRow), feats []float32) int {
	sp := s.spec
	sp.inTree = true
	e.countVerify(s, len(tokens)-1)
	children := make([][]int32, len(tokens))
	for i := 1; i < len(tokens); i++ {
		children[parents[i]] = append(children[parents[i]], int32(i))
	}
	var ev sdk.Event
	path := []int32{0}
	for node := int32(0); ; {
		r, c := rows(int(node))
		tok, err := e.choose(s, r, c)
		if err != nil {
			e.retire(s, err)
			return len(path) - 1
		}
		s.nPast = nBefore + len(path)
		sp.pending = append(sp.pending, feats[int(node)*e.featSize:(int(node)+1)*e.featSize]...)
		next := int32(-1)
		for _, ch := range children[node] {
			if tokens[ch] == tok {
				next = ch
				break
			}
		}
		if next >= 0 {
			e.countAccepted(s)
		}
		if e.commit(s, &ev, tok, false, r, c) {
			return len(path)
		}
		if next < 0 || len(s.forced) > 0 {
			sp.accepted += acceptWeight * (float64(len(path)-1) - sp.accepted)
			if err := e.tree.AcceptPath(s.id, path); err != nil {
				e.retire(s, fmt.Errorf("keep the accepted path of the draft tree: %w", err))
				return len(path)
			}
			sp.inTree = false
			s.feed = append(s.feed[:0], tok)
			s.out.put(ev)
			return len(path)
		}
		path = append(path, next)
		node = next
	}
}
