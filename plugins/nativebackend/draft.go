package nativebackend

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/hashicorp/go-multierror"

	native "github.com/dflash/dflash_server/native/engine"
	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/gguf"
)

// DraftOptions name a block's DFlash draft (--draft, --draft-device, --draft-block-size).
type DraftOptions struct {
	// Path is the draft GGUF ("" = no draft).
	Path string
	// Device is the draft's device ("" = the target's).
	Device string
	// Block is how many block tokens (root and proposals) a sequence verifies at most (0 = the draft's block size;
	// never above it).
	Block int
	// Always drafts on every step instead of only while drafting pays (engine.Config.DraftAlways).
	Always bool
	// TreeBudget verifies a tree of up to this many draft tokens instead of the chain (0: chain).
	TreeBudget int
	// SampledDrafts draws sampled requests' proposals from the draft's distribution (engine.Config.SampledDrafts).
	SampledDrafts bool
}

// draft is a loaded draft model: the native model, its file and what the engine needs to know of it.
type draft struct {
	file   *gguf.File
	model  *native.Model
	info   native.DraftInfo
	device string
}

// loadDraft loads the draft of o for the target file target on device, with room for seqs sequences of maxCtx
// tokens each (plus one block). The draft borrows the target's embedding and LM head.
func loadDraft(o DraftOptions, target *gguf.File, libDir, device string, seqs, maxCtx int, eo EngineOptions) (d *draft, err error) {
	if o.Device == "" {
		o.Device = device
	}
	lib, err := native.Open(libDir, o.Device)
	if err != nil {
		return nil, fmt.Errorf("draft %s: %w", o.Path, err)
	}
	f, err := gguf.Open(o.Path)
	if err != nil {
		return nil, fmt.Errorf("draft %s: %w", o.Path, err)
	}
	defer func() {
		if err != nil {
			if cerr := f.Close(); cerr != nil {
				err = multierror.Append(err, cerr)
			}
		}
	}()
	spec, info, err := native.DraftSpecFromGGUF(f)
	if err != nil {
		return nil, fmt.Errorf("draft %s: %w", o.Path, err)
	}
	if err := spec.AttachTarget(target, info); err != nil {
		return nil, fmt.Errorf("draft %s: %w", o.Path, err)
	}
	if info.CaptureLayers == nil { // placed by AttachTarget from the target's depth
		for _, l := range spec.Meta["dflash.capture_layers"].([]int64) {
			info.CaptureLayers = append(info.CaptureLayers, int(l))
		}
	}
	if info.MaskToken < 0 {
		return nil, fmt.Errorf("draft %s: the file names no mask token (tokenizer.ggml.mask_token_id)", o.Path)
	}
	if o.Block > info.BlockSize {
		return nil, fmt.Errorf("--draft-block-size %d is larger than the draft's block of %d tokens", o.Block, info.BlockSize)
	}
	spec.Options = native.Options{
		KVPoolTokens: seqs * (maxCtx + info.BlockSize), BlockSize: eo.KVBlockSize, MaxSeqs: seqs,
		CacheK: eo.CacheK, CacheV: eo.CacheV, Threads: eo.Threads,
	}
	m, err := lib.LoadModel(spec)
	if err != nil {
		return nil, fmt.Errorf("draft %s: %w", o.Path, err)
	}
	if info.DFlash2 && !m.Info().DFlash2() {
		_ = m.Close()
		return nil, fmt.Errorf("draft %s: a DFlash2 draft, but the engine library loaded it without its selector: rebuild the library", o.Path)
	}
	return &draft{file: f, model: m, info: info, device: o.Device}, nil
}

// verifyRows is the most tokens a sequence verifies in one step with this draft (0 without one): the block
// (--draft-block-size, else the draft's), or the tree's root and budget.
func (d *draft) verifyRows(o DraftOptions) int {
	if d == nil {
		return 0
	}
	rows := d.info.BlockSize
	if o.Block > 0 {
		rows = o.Block
	}
	if o.TreeBudget > 0 {
		rows = max(rows, o.TreeBudget+1)
	}
	return rows
}

// close frees the draft's weights and mapping.
func (d *draft) close() error {
	var errs *multierror.Error
	errs = multierror.Append(errs, d.model.Close())
	errs = multierror.Append(errs, d.file.Close())
	return errs.ErrorOrNil()
}

// drafter adapts a loaded draft to engine.Drafter.
type drafter struct {
	d       *draft
	entries []native.DraftEntry
}

var _ engine.Drafter = (*drafter)(nil)

func (a *drafter) BlockSize() int       { return a.d.info.BlockSize }
func (a *drafter) MaskToken() int32     { return a.d.info.MaskToken }
func (a *drafter) CaptureLayers() []int { return a.d.info.CaptureLayers }
func (a *drafter) FeatureSize() int     { return a.d.info.FeatureSize }

func (a *drafter) NewSeq() (engine.SeqID, error) {
	s, err := a.d.model.NewSeq()
	return engine.SeqID(s), err
}

func (a *drafter) FreeSeq(s engine.SeqID) error { return a.d.model.FreeSeq(native.Seq(s)) }

func (a *drafter) Reserve(s engine.SeqID, tokens int) error {
	return kvErr(a.d.model.Reserve(native.Seq(s), tokens))
}

func (a *drafter) Truncate(s engine.SeqID, tokens int) error {
	return a.d.model.Truncate(native.Seq(s), tokens)
}

func (a *drafter) Draft(_ context.Context, in []engine.DraftInput, k int) (engine.Candidates, error) {
	a.entries = a.entries[:0]
	for _, x := range in {
		a.entries = append(a.entries, native.DraftEntry{Seq: native.Seq(x.Seq), Features: x.Features, Block: x.Block})
	}
	k = min(k, native.MaxTopK)
	info := a.d.model.Info()
	if info.DFlash2() {
		// the selector walks the candidates it was trained on, whatever k the engine asks for
		r, err := a.d.model.DraftForward(a.entries, info.SelectorTopK)
		if err != nil {
			return engine.Candidates{}, kvErr(err)
		}
		return walkCandidates(r, in, k), nil
	}
	r, err := a.d.model.DraftForward(a.entries, k)
	if err != nil {
		return engine.Candidates{}, kvErr(err)
	}
	if !anySampled(in) {
		return engine.Candidates{K: r.K, IDs: r.IDs, Logits: r.Logits, LSE: r.LSE}, nil // best first already
	}
	return walkCandidates(r, in, k), nil
}

// anySampled reports whether an input asks for drawn proposals (DraftInput.Sample).
func anySampled(in []engine.DraftInput) bool {
	return slices.ContainsFunc(in, func(x engine.DraftInput) bool { return x.Sample != nil })
}

// walkCandidates picks each block row's proposal among its candidates, left to right, and puts it first. A DFlash2
// draft's selector (spec §5.1 (b), as llama.cpp's common/speculative.cpp) scores candidate j of a row by
// score_j = logit_j + trans[prev][j] (prev: the index picked in the row before; the root row's scores do not depend
// on it); a DFlash v1 draft's rows are independent, score_j = logit_j. A greedy entry picks the best score (the lower
// index, i.e. the larger logit, on ties); an entry with DraftInput.Sample draws from softmax(score / temperature)
// (engine.DrawCandidate) and the result's Probs hold that distribution. Each row of the result holds the pick
// first, then the row's other candidates by falling score, k per row (padded with id -1 when k exceeds the
// forward's); Logits are the candidates' draft logits.
func walkCandidates(r *native.Result, in []engine.DraftInput, k int) engine.Candidates {
	K := r.K
	rows := len(r.LSE)
	out := engine.Candidates{K: k, IDs: make([]int32, rows*k), Logits: make([]float32, rows*k), LSE: r.LSE}
	if anySampled(in) {
		out.Probs = make([]float32, rows*k)
	}
	score := make([]float64, K)
	order := make([]int, K)
	probs := make([]float32, K)
	row := 0
	for e, x := range in {
		prev := 0
		for i := 0; ; i++ {
			ids, logits, _, ok := r.Candidates(e, i)
			if !ok {
				break
			}
			trans := r.Transitions(e, i)
			for j := range K {
				order[j] = j
				score[j] = math.Inf(-1)
				if ids[j] >= 0 {
					score[j] = float64(logits[j])
					if trans != nil {
						score[j] += float64(trans[prev*K+j])
					}
				}
			}
			sort.SliceStable(order, func(a, b int) bool { return score[order[a]] > score[order[b]] })
			if x.Sample != nil {
				if j := engine.DrawCandidate(score, x.Sample.Temperature, x.Sample.Rng, probs); j >= 0 {
					at := slices.Index(order, j)
					copy(order[1:at+1], order[:at])
					order[0] = j
				}
			}
			prev = order[0]
			for j := range k {
				at := row*k + j
				out.IDs[at], out.Logits[at] = -1, float32(math.Inf(-1))
				if j < K && ids[order[j]] >= 0 {
					out.IDs[at], out.Logits[at] = ids[order[j]], logits[order[j]]
					if x.Sample != nil {
						out.Probs[at] = probs[order[j]]
					}
				}
			}
			row++
		}
	}
	return out
}
