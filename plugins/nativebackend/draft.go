package nativebackend

import (
	"context"
	"fmt"

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
	if info.DFlash2 {
		return nil, fmt.Errorf("draft %s: a DFlash2 draft (dynamic convolutions and a candidate selector) is not served by this build yet; use a DFlash v1 draft", o.Path)
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
	return &draft{file: f, model: m, info: info, device: o.Device}, nil
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
	r, err := a.d.model.DraftForward(a.entries, min(k, native.MaxTopK))
	if err != nil {
		return engine.Candidates{}, kvErr(err)
	}
	return engine.Candidates{K: r.K, IDs: r.IDs, Logits: r.Logits, LSE: r.LSE}, nil
}
