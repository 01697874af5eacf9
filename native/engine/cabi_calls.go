package engine

// The per-model calls into the engine library: model info, the sequence table, forwards, drafts and sampling.

/*
#include "cabi.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"
)

func (a *capi) free(m *cmodel) { C.w_model_free(a.t, m) }

func (a *capi) info(m *cmodel) (Info, error) {
	var ci C.dfl_model_info
	var msg *C.char
	if err := status(C.w_model_info(a.t, m, &ci, &msg), msg); err != nil {
		return Info{}, err
	}
	return Info{
		Arch:             C.GoString(&ci.arch[0]),
		Layers:           int(ci.n_layer),
		Embd:             int(ci.n_embd),
		Vocab:            int(ci.n_vocab),
		CtxTrain:         int(ci.n_ctx_train),
		Heads:            int(ci.n_head),
		HeadsKV:          int(ci.n_head_kv),
		HeadDim:          int(ci.head_dim),
		FF:               int(ci.n_ff),
		AttnLayers:       int(ci.n_attn_layers),
		RecurrentLayers:  int(ci.n_recurrent_layers),
		BlockSize:        int(ci.kv_block_size),
		Blocks:           int(ci.kv_blocks_total),
		MaxSeqs:          int(ci.max_seqs),
		CacheK:           cacheName(uint32(ci.cache_type_k)),
		CacheV:           cacheName(uint32(ci.cache_type_v)),
		Threads:          int(ci.n_threads),
		KVBytesPerToken:  uint64(ci.kv_bytes_per_token),
		StateBytesPerSeq: uint64(ci.state_bytes_per_seq),
		WeightBytes:      uint64(ci.weight_bytes),
		RMSEps:           float32(ci.rms_eps),
		RopeTheta:        float32(ci.rope_theta),
		RopeDim:          int(ci.rope_dim),
		DraftFeatures:    int(ci.n_feat),
		SelectorTopK:     int(ci.selector_top_k),
	}, nil
}

func (a *capi) kvStats(m *cmodel) (KVStats, error) {
	var s C.dfl_kv_stats
	var msg *C.char
	if err := status(C.w_kv_stats(a.t, m, &s, &msg), msg); err != nil {
		return KVStats{}, err
	}
	return KVStats{
		BlockSize:   int(s.block_size),
		BlocksTotal: int(s.blocks_total),
		BlocksFree:  int(s.blocks_free),
		SeqsTotal:   int(s.seqs_total),
		SeqsFree:    int(s.seqs_free),
	}, nil
}

func (a *capi) seqAlloc(m *cmodel) (Seq, error) {
	var s C.int32_t
	var msg *C.char
	if err := status(C.w_seq_alloc(a.t, m, &s, &msg), msg); err != nil {
		return -1, err
	}
	return Seq(s), nil
}

const (
	opFree = iota
	opReserve
	opTruncate
	opSnapshot
	opRollback
)

func (a *capi) seqOp(m *cmodel, op int, s Seq, n uint32) error {
	var msg *C.char
	return status(C.w_seq_op(a.t, m, C.int(op), C.int32_t(s), C.uint32_t(n), &msg), msg)
}

func (a *capi) seqLength(m *cmodel, s Seq) (int, error) {
	var n C.uint32_t
	var msg *C.char
	if err := status(C.w_seq_length(a.t, m, C.int32_t(s), &n, &msg), msg); err != nil {
		return 0, err
	}
	return int(n), nil
}

// forward runs one batch. Token, position and output slices are pinned for the call so the C batch (Go memory) may
// point at them.
func (a *capi) runForward(m *cmodel, b *Batch, r *Result) error {
	var pin runtime.Pinner
	defer pin.Unpin()
	seqs := make([]C.dfl_seq_batch, len(b.Entries))
	var parents []*C.int32_t // per entry, when any entry is a tree
	for i := range b.Entries {
		e := &b.Entries[i]
		cs := &seqs[i]
		if e.Parents != nil {
			if parents == nil {
				parents = make([]*C.int32_t, len(b.Entries))
			}
			if len(e.Parents) > 0 {
				pin.Pin(&e.Parents[0])
				parents[i] = (*C.int32_t)(unsafe.Pointer(&e.Parents[0]))
			}
		}
		cs.seq = C.int32_t(e.Seq)
		cs.n_tokens = C.uint32_t(len(e.Tokens))
		if len(e.Tokens) > 0 {
			pin.Pin(&e.Tokens[0])
			cs.tokens = (*C.int32_t)(unsafe.Pointer(&e.Tokens[0]))
		}
		if len(e.Positions) > 0 {
			pin.Pin(&e.Positions[0])
			cs.positions = (*C.int32_t)(unsafe.Pointer(&e.Positions[0]))
		}
		cs.logits = C.uint32_t(e.Logits)
		if e.Record {
			cs.flags |= C.DFL_SEQ_RECORD
		}
	}
	cb := C.dfl_batch{n_seqs: C.uint32_t(len(seqs))}
	if len(seqs) > 0 {
		pin.Pin(&seqs[0])
		cb.seqs = &seqs[0]
	}
	if len(r.Logits) > 0 && r.K == 0 {
		pin.Pin(&r.Logits[0])
		cb.logits = (*C.float)(unsafe.Pointer(&r.Logits[0]))
	}
	if len(b.Capture) > 0 {
		layers := make([]C.int32_t, len(b.Capture))
		for i, l := range b.Capture {
			layers[i] = C.int32_t(l)
		}
		pin.Pin(&layers[0])
		cb.n_capture = C.uint32_t(len(layers))
		cb.capture_layers = &layers[0]
		if len(r.Capture) > 0 {
			pin.Pin(&r.Capture[0])
			cb.capture = (*C.float)(unsafe.Pointer(&r.Capture[0]))
		}
	}
	var msg *C.char
	if parents != nil {
		if C.has_tree_api(a.t) == 0 {
			return errors.New("forward: the engine library predates forward_tree (tree verification): rebuild it")
		}
		pin.Pin(&parents[0])
		var ids *C.int32_t
		var vals, lse *C.float
		if r.K > 0 {
			ids, vals, lse = r.candidateBuffers(&pin)
		}
		return status(C.w_forward_tree(a.t, m, &cb, &parents[0], C.uint32_t(r.K), ids, vals, lse, &msg), msg)
	}
	if r.K > 0 {
		if C.has_topk_api(a.t) == 0 {
			return errors.New("forward: the engine library predates forward_topk: rebuild it")
		}
		ids, vals, lse := r.candidateBuffers(&pin)
		return status(C.w_forward_topk(a.t, m, &cb, C.uint32_t(r.K), ids, vals, lse, &msg), msg)
	}
	return status(C.w_forward(a.t, m, &cb, &msg), msg)
}

// hasCaptures reports whether the library can keep a forward's captures for the caller to read in place.
func (a *capi) hasCaptures() bool { return C.has_captures_api(a.t) != 0 }

// keptCaptures points r.Capture at the want floats of captures the forward kept in the library
// (Batch.CaptureInPlace: the batch's capture buffer was null).
func (a *capi) keptCaptures(m *cmodel, r *Result, want int) error {
	var p *C.float
	var n C.uint64_t
	var msg *C.char
	if err := status(C.w_captures(a.t, m, &p, &n, &msg), msg); err != nil {
		return fmt.Errorf("forward: captures: %w", err)
	}
	if int(n) != want || p == nil {
		return fmt.Errorf("forward: the library kept %d floats of captures, want %d", n, want)
	}
	r.Capture = unsafe.Slice((*float32)(unsafe.Pointer(p)), int(n))
	return nil
}

// acceptPath keeps one root-to-node path of the sequence's last tree forward.
func (a *capi) acceptPath(m *cmodel, s Seq, path []int32) error {
	if C.has_tree_api(a.t) == 0 {
		return errors.New("accept path: the engine library predates seq_accept_path (tree verification): rebuild it")
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	var p *C.int32_t
	if len(path) > 0 {
		pin.Pin(&path[0])
		p = (*C.int32_t)(unsafe.Pointer(&path[0]))
	}
	var msg *C.char
	return status(C.w_seq_accept_path(a.t, m, C.int32_t(s), p, C.uint32_t(len(path)), &msg), msg)
}

// seqExport returns the sequence's state blob: one call for its size, one to fill it.
func (a *capi) seqExport(m *cmodel, s Seq) ([]byte, error) {
	if C.has_state_api(a.t) == 0 {
		return nil, errors.New("export sequence: the engine library predates seq_export: rebuild it")
	}
	var need C.uint64_t
	var msg *C.char
	if err := status(C.w_seq_export(a.t, m, C.int32_t(s), nil, 0, &need, &msg), msg); err != nil {
		return nil, err
	}
	buf := make([]byte, int(need))
	if len(buf) == 0 {
		return nil, fmt.Errorf("export sequence %d: the engine reported an empty blob", int(s))
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(&buf[0])
	got := need
	if err := status(C.w_seq_export(a.t, m, C.int32_t(s), unsafe.Pointer(&buf[0]), C.uint64_t(len(buf)), &got, &msg), msg); err != nil {
		return nil, err
	}
	if got != need {
		return nil, fmt.Errorf("export sequence %d: the blob took %d bytes, %d were reported", int(s), uint64(got), uint64(need))
	}
	return buf, nil
}

// seqImport loads a blob of seqExport into an empty sequence.
func (a *capi) seqImport(m *cmodel, s Seq, blob []byte) error {
	if C.has_state_api(a.t) == 0 {
		return errors.New("import sequence: the engine library predates seq_import: rebuild it")
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	var p unsafe.Pointer
	if len(blob) > 0 {
		pin.Pin(&blob[0])
		p = unsafe.Pointer(&blob[0])
	}
	var msg *C.char
	return status(C.w_seq_import(a.t, m, C.int32_t(s), p, C.uint64_t(len(blob)), &msg), msg)
}

// runDraft runs one draft step; feature and block slices are pinned for the call so the C entries may point at them.
func (a *capi) runDraft(m *cmodel, entries []DraftEntry, nFeat int, r *Result) error {
	if C.has_draft_api(a.t) == 0 {
		return errors.New("draft forward: the engine library predates draft_forward: rebuild it")
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	ces := make([]C.dfl_draft_entry, len(entries))
	for i := range entries {
		e := &entries[i]
		ce := &ces[i]
		ce.seq = C.int32_t(e.Seq)
		if len(e.Features) > 0 {
			pin.Pin(&e.Features[0])
			ce.n_ctx = C.uint32_t(len(e.Features) / nFeat)
			ce.features = (*C.float)(unsafe.Pointer(&e.Features[0]))
		}
		if len(e.Block) > 0 {
			pin.Pin(&e.Block[0])
			ce.n_block = C.uint32_t(len(e.Block))
			ce.block = (*C.int32_t)(unsafe.Pointer(&e.Block[0]))
		}
	}
	var cs *C.dfl_draft_entry
	if len(ces) > 0 {
		pin.Pin(&ces[0])
		cs = &ces[0]
	}
	ids, vals, lse := r.candidateBuffers(&pin)
	var msg *C.char
	if r.Trans != nil {
		if C.has_draft2_api(a.t) == 0 {
			return errors.New("draft forward: the engine library predates draft_forward2 (DFlash2 drafts): rebuild it")
		}
		var trans *C.float
		if len(r.Trans) > 0 {
			pin.Pin(&r.Trans[0])
			trans = (*C.float)(unsafe.Pointer(&r.Trans[0]))
		}
		return status(C.w_draft_forward2(a.t, m, C.uint32_t(len(ces)), cs, C.uint32_t(r.K), ids, vals, lse, trans, &msg), msg)
	}
	return status(C.w_draft_forward(a.t, m, C.uint32_t(len(ces)), cs, C.uint32_t(r.K), ids, vals, lse, &msg), msg)
}

func (a *capi) runSample(logits []float32, p SamplingParams, history []int32, rng *uint64) (int32, error) {
	if len(logits) == 0 {
		return 0, fmt.Errorf("sample: empty logits")
	}
	cp := p.c()
	hist := historyPtr(history)
	var tok C.int32_t
	var msg *C.char
	err := status(C.w_sample(a.t, (*C.float)(unsafe.Pointer(&logits[0])), C.uint32_t(len(logits)), &cp, hist,
		C.uint32_t(len(history)), (*C.uint64_t)(unsafe.Pointer(rng)), &tok, &msg), msg)
	return int32(tok), err
}

func (a *capi) runSampleDist(logits []float32, p SamplingParams, history []int32, ids []int32, probs []float64) (int, error) {
	switch {
	case len(logits) == 0:
		return 0, fmt.Errorf("sample distribution: empty logits")
	case len(ids) < len(logits) || len(probs) < len(logits):
		return 0, fmt.Errorf("sample distribution: room for %d / %d entries, %d logits", len(ids), len(probs), len(logits))
	case C.has_sample_dist_api(a.t) == 0:
		return 0, errors.New("sample distribution: the engine library predates sample_dist: rebuild it")
	}
	cp := p.c()
	hist := historyPtr(history)
	var n C.uint32_t
	var msg *C.char
	err := status(C.w_sample_dist(a.t, (*C.float)(unsafe.Pointer(&logits[0])), C.uint32_t(len(logits)), &cp, hist,
		C.uint32_t(len(history)), (*C.int32_t)(unsafe.Pointer(&ids[0])), (*C.double)(unsafe.Pointer(&probs[0])), &n, &msg), msg)
	return int(n), err
}

func (a *capi) runSampleCandidates(ids []int32, logits []float32, suppressed []bool, lse float32, nVocab int, p SamplingParams, rng *uint64) (int32, error) {
	switch {
	case len(ids) == 0 || len(ids) != len(logits) || (suppressed != nil && len(suppressed) != len(ids)):
		return 0, fmt.Errorf("sample candidates: %d ids, %d logits, %d suppression flags", len(ids), len(logits), len(suppressed))
	case C.has_candidate_sampling_api(a.t) == 0:
		return -1, nil // a library before sample_candidates: the whole row, as before
	}
	cp := p.c()
	var sup *C.uint8_t
	if suppressed != nil {
		sup = (*C.uint8_t)(unsafe.Pointer(&suppressed[0])) // (a Go bool is one byte, 0 or 1)
	}
	var tok C.int32_t
	var msg *C.char
	err := status(C.w_sample_candidates(a.t, (*C.int32_t)(unsafe.Pointer(&ids[0])), (*C.float)(unsafe.Pointer(&logits[0])),
		sup, C.uint32_t(len(ids)), C.float(lse), C.uint32_t(nVocab), &cp, (*C.uint64_t)(unsafe.Pointer(rng)), &tok, &msg), msg)
	return int32(tok), err
}

func (a *capi) logitsRow(m *cmodel, row int, dst []float32) error {
	if C.has_candidate_sampling_api(a.t) == 0 {
		return errors.New("logits row: the engine library predates logits_row: rebuild it")
	}
	var msg *C.char
	return status(C.w_logits_row(a.t, m, C.uint32_t(row), (*C.float)(unsafe.Pointer(&dst[0])), &msg), msg)
}

// historyPtr is the C view of a sampler's history (nil when empty).
func historyPtr(history []int32) *C.int32_t {
	if len(history) == 0 {
		return nil
	}
	return (*C.int32_t)(unsafe.Pointer(&history[0]))
}

func (p SamplingParams) c() C.dfl_sampling {
	cp := C.dfl_sampling{
		temperature:       C.float(p.Temperature),
		top_k:             C.int32_t(p.TopK),
		top_p:             C.float(p.TopP),
		min_p:             C.float(p.MinP),
		repeat_penalty:    C.float(p.RepeatPenalty),
		presence_penalty:  C.float(p.PresencePenalty),
		frequency_penalty: C.float(p.FrequencyPenalty),
		penalty_last_n:    C.int32_t(p.PenaltyLastN),
	}
	if p.TopP <= 0 || p.TopP > 1 {
		cp.top_p = 1
	}
	if p.RepeatPenalty <= 0 {
		cp.repeat_penalty = 1
	}
	if p.PenaltyLastN <= 0 {
		cp.penalty_last_n = -1
	}
	return cp
}

// candidateBuffers pins r's candidate arrays (ids, logits, log-sum-exps) for a call and returns them as C pointers;
// nil pointers when there are no rows.
func (r *Result) candidateBuffers(pin *runtime.Pinner) (*C.int32_t, *C.float, *C.float) {
	if len(r.IDs) == 0 {
		return nil, nil, nil
	}
	pin.Pin(&r.IDs[0])
	pin.Pin(&r.Logits[0])
	pin.Pin(&r.LSE[0])
	return (*C.int32_t)(unsafe.Pointer(&r.IDs[0])), (*C.float)(unsafe.Pointer(&r.Logits[0])), (*C.float)(unsafe.Pointer(&r.LSE[0]))
}
