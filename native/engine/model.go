package engine

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"

	"github.com/dflash/dflash_server/sdk/gguf"
)

// CacheType is a KV cache element type: "f32", "f16", "bf16" or "q8_0" (the --cache-type-k/v values). "" means f16.
type CacheType string

// KV cache element types.
const (
	CacheF32  CacheType = "f32"
	CacheF16  CacheType = "f16"
	CacheBF16 CacheType = "bf16"
	CacheQ8_0 CacheType = "q8_0"
)

// ParseCacheType validates a --cache-type-k/v value.
func ParseCacheType(s string) (CacheType, error) {
	c := CacheType(s)
	if _, err := c.id(); err != nil {
		return "", err
	}
	return c, nil
}

func (c CacheType) id() (uint32, error) {
	switch c {
	case CacheF32:
		return uint32(gguf.F32), nil
	case CacheF16, "":
		return uint32(gguf.F16), nil
	case CacheBF16:
		return uint32(gguf.BF16), nil
	case CacheQ8_0:
		return uint32(gguf.Q8_0), nil
	}
	return 0, fmt.Errorf("unknown KV cache type %q (want f32, f16, bf16 or q8_0)", string(c))
}

func cacheName(id uint32) CacheType {
	switch gguf.Type(id) {
	case gguf.F32:
		return CacheF32
	case gguf.F16:
		return CacheF16
	case gguf.BF16:
		return CacheBF16
	case gguf.Q8_0:
		return CacheQ8_0
	}
	return CacheType(fmt.Sprintf("type%d", id))
}

// Options size the engine-side resources of a model.
type Options struct {
	// KVPoolTokens is the KV capacity shared by all sequences (--kv-pool-tokens). Required for models with attention.
	KVPoolTokens int
	// BlockSize is the number of tokens per KV block; 0 means 16.
	BlockSize int
	// MaxSeqs is the number of sequence slots; 0 means 1.
	MaxSeqs int
	// CacheK and CacheV are the KV element types; "" means f16.
	CacheK, CacheV CacheType
	// Threads is the CPU worker count; 0 means every core.
	Threads int
	// CopyWeights makes the engine copy tensor data at load, so the caller may release it afterwards.
	CopyWeights bool
}

func (o Options) withDefaults() Options {
	if o.BlockSize <= 0 {
		o.BlockSize = 16
	}
	if o.MaxSeqs <= 0 {
		o.MaxSeqs = 1
	}
	return o
}

// Tensor is one tensor of the model: its GGUF name, ggml type, ggml-order dims (Dims[0] contiguous) and bytes.
type Tensor struct {
	Name string
	Type gguf.Type
	Dims []uint64
	Data []byte
}

// ModelSpec is everything the engine needs to build a model.
type ModelSpec struct {
	// Arch is general.architecture ("qwen3", "qwen35", "deepseek4", or "dflash" for a DFlash draft run through
	// DraftForward).
	Arch string
	// Meta holds the hyperparameters under their GGUF keys ("qwen3.block_count", ...). Values may be Go integers,
	// floats, bools, strings, or integer/float slices. Keys the architecture does not use are ignored.
	Meta map[string]any
	// Tensors are referenced in place until Model.Close unless Options.CopyWeights is set: their Data must stay valid
	// and unchanged (a gguf.File mapping must stay open).
	Tensors []Tensor
	Options
}

// Info describes a loaded model as the engine sees it.
type Info struct {
	Arch                                           string
	Layers, Embd, Vocab, CtxTrain                  int
	Heads, HeadsKV, HeadDim, FF                    int
	AttnLayers, RecurrentLayers                    int
	BlockSize, Blocks, MaxSeqs                     int
	CacheK, CacheV                                 CacheType
	Threads                                        int
	KVBytesPerToken, StateBytesPerSeq, WeightBytes uint64
	RMSEps, RopeTheta                              float32
	RopeDim                                        int
	// DraftFeatures is the float count of one context row of DraftForward (a "dflash" draft's fc input); 0 otherwise.
	DraftFeatures int
	// SelectorTopK > 0 marks a DFlash2 draft (dynamic convolutions and a candidate selector): the candidates per
	// block row its selector is trained on (dflash.selector_top_k). DraftForward then also returns Result.Trans.
	SelectorTopK int
}

// DFlash2 reports whether the model is a DFlash2 draft.
func (i Info) DFlash2() bool { return i.SelectorTopK > 0 }

// KVStats is the current occupancy of the KV pool and sequence slots.
type KVStats struct {
	BlockSize   int
	BlocksTotal int
	BlocksFree  int // held by no sequence (neither used nor reserved)
	SeqsTotal   int
	SeqsFree    int
}

// TokensFree is the KV capacity, in tokens, that no sequence holds.
func (s KVStats) TokensFree() int { return s.BlocksFree * s.BlockSize }

// BlocksFor is the number of blocks a sequence of n tokens holds.
func (s KVStats) BlocksFor(n int) int { return (n + s.BlockSize - 1) / s.BlockSize }

// Seq identifies a sequence slot of a model.
type Seq int32

// LogitsMode says which positions of a batch entry return logits.
type LogitsMode uint32

// Logits modes.
const (
	LogitsNone LogitsMode = iota
	LogitsLast            // one row: the entry's last token
	LogitsAll             // one row per token
)

// Entry is the tokens one sequence contributes to a forward; they are appended after the sequence's current length.
type Entry struct {
	Seq    Seq
	Tokens []int32
	// Positions are RoPE positions; nil means the cache positions (sequence length + i).
	Positions []int32
	Logits    LogitsMode
	// Record keeps the recurrent state after every token so that Truncate may later cut the sequence anywhere inside
	// this forward (speculative decoding).
	Record bool
	// Parents, when not nil, makes the tokens a tree (DDTree verification): Parents[i] is the index of token i's
	// parent within the entry, -1 for token 0 (the root) only, Parents[i] < i otherwise; at most 64 tokens. Token i
	// sits at position length + depth(i) (unless Positions are given), sees the cache and its ancestors, and
	// continues the recurrent state of its parent; all tokens are recorded. Until AcceptPath (or Truncate to the
	// length before, or Rollback) the sequence cannot be forwarded again.
	Parents []int32
}

// Batch is one forward over several sequences (a sequence appears at most once).
type Batch struct {
	Entries []Entry
	// Capture lists layers whose outputs (after the FFN residual) are returned for every token.
	Capture []int
	// CaptureInPlace makes Result.Capture the library's own memory, valid until this model's next forward or Close,
	// instead of a fresh copy: a 16-token verify of a 27B target with five captured layers is 1.6 MB that would be
	// allocated and copied each step. A library without the captures entry gives a copy.
	CaptureInPlace bool
	// TopK (1..64), when set, returns each logits row as its TopK best candidates and the row's log-sum-exp
	// (Result.Candidates) instead of the whole row: on a GPU only those cross to the host.
	TopK int
}

// Result holds a forward's outputs.
type Result struct {
	Vocab  int
	Logits []float32 // [rows][Vocab], rows in entry order; [rows][K] candidate logits with Batch.TopK
	Embd   int
	// With Batch.TopK: K candidates per row (ids [rows][K], larger logit first, lower id on ties; id -1 pads a row
	// with fewer finite logits) and each row's log-sum-exp.
	K   int
	IDs []int32
	LSE []float32
	// Capture is [tokens][len(Batch.Capture)][Embd], tokens in entry order (see Batch.CaptureInPlace).
	Capture []float32
	// Trans (DraftForward of a DFlash2 draft) is [rows][K][K]: the candidate selector's transition score from
	// candidate i of the row before (of block position 1: the root token, the same for every i) to candidate j of
	// this row; see Transitions.
	Trans []float32

	rowStart []int // first logits row of each entry, -1 if none
	rowCount []int
	tokStart []int
	nCapture int
}

// Row returns the i-th logits row of entry e (for LogitsLast, i = 0 is the last token); nil if there is none.
func (r *Result) Row(e, i int) []float32 {
	if e < 0 || e >= len(r.rowStart) || r.rowStart[e] < 0 || i < 0 || i >= r.rowCount[e] {
		return nil
	}
	if r.K > 0 {
		return nil
	}
	off := (r.rowStart[e] + i) * r.Vocab
	return r.Logits[off : off+r.Vocab : off+r.Vocab]
}

// Candidates returns the i-th row of entry e of a Batch.TopK forward: its candidate ids and logits and the row's
// log-sum-exp (a candidate's log-probability is its logit minus lse). ok is false when there is no such row.
func (r *Result) Candidates(e, i int) (ids []int32, logits []float32, lse float32, ok bool) {
	if r.K == 0 || e < 0 || e >= len(r.rowStart) || r.rowStart[e] < 0 || i < 0 || i >= r.rowCount[e] {
		return nil, nil, 0, false
	}
	row := r.rowStart[e] + i
	off := row * r.K
	return r.IDs[off : off+r.K : off+r.K], r.Logits[off : off+r.K : off+r.K], r.LSE[row], true
}

// Transitions returns, for row i of entry e of a DFlash2 DraftForward, the K×K transition scores ([prev][cur],
// row-major); nil when there are none.
func (r *Result) Transitions(e, i int) []float32 {
	if len(r.Trans) == 0 || e < 0 || e >= len(r.rowStart) || r.rowStart[e] < 0 || i < 0 || i >= r.rowCount[e] {
		return nil
	}
	off := (r.rowStart[e] + i) * r.K * r.K
	return r.Trans[off : off+r.K*r.K : off+r.K*r.K]
}

// Hidden returns the captured output of Batch.Capture[c] for token i of entry e; nil if there is none.
func (r *Result) Hidden(e, i, c int) []float32 {
	if e < 0 || e >= len(r.tokStart) || c < 0 || c >= r.nCapture || len(r.Capture) == 0 || i < 0 {
		return nil
	}
	if e+1 < len(r.tokStart) && r.tokStart[e]+i >= r.tokStart[e+1] {
		return nil
	}
	off := ((r.tokStart[e]+i)*r.nCapture + c) * r.Embd
	if off+r.Embd > len(r.Capture) {
		return nil
	}
	return r.Capture[off : off+r.Embd : off+r.Embd]
}

// SamplingParams are the sampler settings. The zero value is greedy. Order: penalties, temperature, top-k, top-p,
// min-p, then a seeded draw.
type SamplingParams struct {
	Temperature float32 // <= 0: greedy (lowest id on ties)
	TopK        int     // <= 0: off
	TopP        float32 // <= 0 or >= 1: off
	MinP        float32 // <= 0: off
	// RepeatPenalty (<= 0 or 1: off) divides positive and multiplies negative logits of tokens in the history;
	// PresencePenalty is subtracted once per seen token, FrequencyPenalty once per occurrence.
	RepeatPenalty, PresencePenalty, FrequencyPenalty float32
	// PenaltyLastN limits the penalties to the last N history tokens; <= 0 means the whole history given.
	PenaltyLastN int
}

// Model is a model loaded into an engine library. Its methods serialize on an internal lock.
type Model struct {
	lib    *Lib
	mu     sync.Mutex
	m      *cmodel
	pin    runtime.Pinner
	info   Info
	closer io.Closer
}

var errClosed = errors.New("engine model is closed")

// LoadModel builds a model from spec.
func (l *Lib) LoadModel(spec ModelSpec) (*Model, error) {
	md := &Model{lib: l}
	cm, err := l.api.load(&spec, l.device, &md.pin)
	if err != nil {
		md.pin.Unpin()
		return nil, fmt.Errorf("load %s model: %w", spec.Arch, err)
	}
	if spec.CopyWeights {
		md.pin.Unpin()
	}
	md.m = cm
	if md.info, err = l.api.info(cm); err != nil {
		l.api.free(cm)
		md.pin.Unpin()
		return nil, fmt.Errorf("load %s model: %w", spec.Arch, err)
	}
	return md, nil
}

// MaxTopK is the most candidates per row a Batch.TopK forward returns.
const MaxTopK = 64

// Estimate is what a model would take on its device (Lib.Estimate), to size the KV pool from free memory.
type Estimate struct {
	WeightBytes      uint64 // weights uploaded to the device (on the CPU: mapped from the file, not copied)
	KVBytesPerToken  uint64 // K+V of one token over all attention layers, in the options' cache types
	StateBytesPerSeq uint64 // recurrent + conv state of one sequence slot
	ScratchBytes     uint64 // activations of a 512-token forward
	// What a sequence's speculative records take (qwen35 targets; 0 elsewhere, and from libraries that predate them):
	// RecordBytesFixed, then per row of its widest verify (at least 16 rows) RecordBytesPerRow for a chain or
	// TreeRecordBytesPerRow for a tree; a tree also TreeRecordBytesFixed (the states its schedule sets aside).
	RecordBytesFixed, RecordBytesPerRow, TreeRecordBytesPerRow, TreeRecordBytesFixed uint64
}

// RecordBytes is what one sequence's records take once it verifies rows tokens at a time (a tree when tree): the
// library's figures (it keeps at least 16 rows' room), or, from a library that predates them, the recurrent state
// after every row and the one before them (the convolution windows are smaller than as many conv states). 0 without
// recurrent layers.
func (e Estimate) RecordBytes(rows int, tree bool) uint64 {
	if rows <= 0 {
		return 0
	}
	per, fixed := e.RecordBytesPerRow, e.RecordBytesFixed
	if tree {
		per, fixed = e.TreeRecordBytesPerRow, fixed+e.TreeRecordBytesFixed
	}
	if per == 0 {
		return uint64(max(rows, 16)+1) * e.StateBytesPerSeq
	}
	return fixed + uint64(max(rows, 16))*per
}

// Estimate reports what spec would take on the library's device, without loading it.
func (l *Lib) Estimate(spec ModelSpec) (Estimate, error) {
	e, err := l.api.estimate(&spec)
	if err != nil {
		return Estimate{}, fmt.Errorf("estimate %s model: %w", spec.Arch, err)
	}
	return e, nil
}

// Memory reports the free and total bytes of the library's device (system memory for cpu).
func (l *Lib) Memory() (free, total uint64, err error) {
	free, total, err = l.api.memory(l.device)
	if err != nil {
		return 0, 0, fmt.Errorf("%s:%d memory: %w", l.kind, l.device, err)
	}
	return free, total, nil
}

// LoadGGUF opens a GGUF file and loads it; the model keeps the file mapped until Close.
func (l *Lib) LoadGGUF(path string, opt Options) (*Model, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	spec, err := SpecFromGGUF(f)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	spec.Options = opt
	md, err := l.LoadModel(spec)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if opt.CopyWeights {
		_ = f.Close()
	} else {
		md.closer = f
		if l.kind == "cpu" {
			evictPackedWeights(f)
		}
	}
	return md, nil
}

// evictPackedWeights drops the file pages of the matrices the CPU engine repacks at load (q4_0, q8_0, q4_K, q6_K with
// the AVX-512 VNNI kernels; CpuDevice::prepare_weight): packing read every page once, after which the products read
// only the packed copy, so the file's pages would otherwise keep the weights resident twice. What is still read from
// the file (embedding rows, also where the head shares the embedding matrix; the matrices of a machine without
// AVX-512 VNNI, which has no packed copy) faults back in from the page cache as it is touched.
func evictPackedWeights(f *gguf.File) {
	for _, t := range f.Tensors() {
		switch t.Type {
		case gguf.Q4_0, gguf.Q8_0, gguf.Q4_K, gguf.Q6_K:
			if len(t.Dims) >= 2 {
				_ = f.EvictTensorData(t.Name) // advice only: on failure the pages just stay
			}
		}
	}
}

// SpecFromGGUF lists f's tensors (zero-copy views of the mapping) and its architecture's hyperparameters
// ("<arch>.*" scalars and numeric arrays). Options are left zero.
func SpecFromGGUF(f *gguf.File) (ModelSpec, error) {
	arch := f.Arch()
	if arch == "" {
		return ModelSpec{}, fmt.Errorf("gguf has no %s", gguf.KeyArchitecture)
	}
	spec := ModelSpec{Arch: arch, Meta: map[string]any{}}
	prefix := arch + "."
	for _, kv := range f.KVs() {
		if len(kv.Key) <= len(prefix) || kv.Key[:len(prefix)] != prefix {
			continue
		}
		v, ok := f.Meta(kv.Key)
		if !ok {
			continue
		}
		switch v.(type) {
		case []string, []bool:
			continue // not hyperparameters the engine reads
		}
		spec.Meta[kv.Key] = v
	}
	for _, t := range f.Tensors() {
		data, err := f.TensorData(t.Name)
		if err != nil {
			return ModelSpec{}, err
		}
		spec.Tensors = append(spec.Tensors, Tensor{Name: t.Name, Type: t.Type, Dims: t.Dims, Data: data})
	}
	return spec, nil
}

// Info describes the model.
func (m *Model) Info() Info { return m.info }

// Close frees the model (and the GGUF mapping LoadGGUF opened). Sequences die with it.
func (m *Model) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		return nil
	}
	m.lib.api.free(m.m)
	m.m = nil
	m.pin.Unpin()
	if m.closer != nil {
		return m.closer.Close()
	}
	return nil
}

func (m *Model) locked(fn func() error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		return errClosed
	}
	return fn()
}

// KVStats reports the KV pool and slot occupancy.
func (m *Model) KVStats() (KVStats, error) {
	var s KVStats
	err := m.locked(func() (err error) { s, err = m.lib.api.kvStats(m.m); return })
	return s, err
}

// NewSeq allocates an empty sequence (ErrNoSeq when every slot is taken).
func (m *Model) NewSeq() (Seq, error) {
	s := Seq(-1)
	err := m.locked(func() (err error) { s, err = m.lib.api.seqAlloc(m.m); return })
	return s, err
}

// FreeSeq releases a sequence, its KV blocks and state slot.
func (m *Model) FreeSeq(s Seq) error {
	return m.locked(func() error { return m.lib.api.seqOp(m.m, opFree, s, 0) })
}

// Reserve makes the sequence hold KV blocks for n tokens in total, so forwards up to that length cannot fail with
// ErrNoKV (ErrNoKV now if the pool cannot hold them; nothing changes then).
func (m *Model) Reserve(s Seq, n int) error {
	if n < 0 {
		return fmt.Errorf("reserve %d tokens: negative", n)
	}
	return m.locked(func() error { return m.lib.api.seqOp(m.m, opReserve, s, uint32(n)) })
}

// SeqLen is the number of tokens the sequence holds.
func (m *Model) SeqLen(s Seq) (int, error) {
	n := 0
	err := m.locked(func() (err error) { n, err = m.lib.api.seqLength(m.m, s); return })
	return n, err
}

// Truncate cuts the sequence to n tokens. With recurrent layers this works only inside the last forward made with
// Entry.Record (ErrState otherwise).
func (m *Model) Truncate(s Seq, n int) error {
	if n < 0 {
		return fmt.Errorf("truncate to %d tokens: negative", n)
	}
	return m.locked(func() error { return m.lib.api.seqOp(m.m, opTruncate, s, uint32(n)) })
}

// AcceptPath keeps the root-to-node path (flat token indices of the last forward of s, which was a tree: path[0] = 0,
// each the child of the one before) and drops the rest of the tree: the sequence becomes its length before that
// forward + len(path) tokens long, with the K/V and recurrent state of the path. ErrState when the last forward was
// not a tree or path is not a path of it.
func (m *Model) AcceptPath(s Seq, path []int32) error {
	return m.locked(func() error { return m.lib.api.acceptPath(m.m, s, path) })
}

// Export returns the sequence's whole state at its current length (K/V rows of every attention layer, recurrent and
// conv state) as one blob in the library's own format, for a disk prefix cache: store it as is and give it to Import
// of a model of the same shape and cache types. ErrState while the sequence holds an unresolved tree forward;
// ErrUnsupported for a DFlash draft.
func (m *Model) Export(s Seq) ([]byte, error) {
	var blob []byte
	err := m.locked(func() (err error) { blob, err = m.lib.api.seqExport(m.m, s); return })
	return blob, err
}

// Import loads a blob of Export into an empty sequence, which becomes that long with that state. It takes the KV
// blocks it needs (those Reserve holds, then free ones: ErrNoKV otherwise); ErrState when s is not empty; ErrInvalid
// naming the problem when the blob was made by another model shape or cache types, or is truncated or damaged. On
// error nothing changed.
func (m *Model) Import(s Seq, blob []byte) error {
	return m.locked(func() error { return m.lib.api.seqImport(m.m, s, blob) })
}

// Snapshot saves the sequence's length and recurrent state (one snapshot per sequence).
func (m *Model) Snapshot(s Seq) error {
	return m.locked(func() error { return m.lib.api.seqOp(m.m, opSnapshot, s, 0) })
}

// Rollback restores the last snapshot (ErrState if there is none).
func (m *Model) Rollback(s Seq) error {
	return m.locked(func() error { return m.lib.api.seqOp(m.m, opRollback, s, 0) })
}

// Forward runs the model on a batch and returns the requested logits and captured hidden states. On error no
// sequence changed length.
func (m *Model) Forward(b Batch) (*Result, error) {
	r := &Result{Vocab: m.info.Vocab, Embd: m.info.Embd, nCapture: len(b.Capture)}
	rows, toks := 0, 0
	for i, e := range b.Entries {
		if len(e.Tokens) == 0 {
			return nil, fmt.Errorf("forward: entry %d (sequence %d) has no tokens", i, e.Seq)
		}
		if e.Parents != nil && len(e.Parents) != len(e.Tokens) {
			return nil, fmt.Errorf("forward: entry %d (sequence %d) has %d parents for %d tokens", i, e.Seq,
				len(e.Parents), len(e.Tokens))
		}
		if e.Positions != nil && len(e.Positions) != len(e.Tokens) {
			return nil, fmt.Errorf("forward: entry %d (sequence %d) has %d positions for %d tokens", i, e.Seq,
				len(e.Positions), len(e.Tokens))
		}
		r.tokStart = append(r.tokStart, toks)
		toks += len(e.Tokens)
		n := 0
		switch e.Logits {
		case LogitsNone:
		case LogitsLast:
			n = 1
		case LogitsAll:
			n = len(e.Tokens)
		default:
			return nil, fmt.Errorf("forward: entry %d: bad logits mode %d", i, e.Logits)
		}
		start := -1
		if n > 0 {
			start = rows
		}
		r.rowStart = append(r.rowStart, start)
		r.rowCount = append(r.rowCount, n)
		rows += n
	}
	if b.TopK != 0 {
		if b.TopK < 1 || b.TopK > MaxTopK {
			return nil, fmt.Errorf("forward: top-k %d outside [1, %d]", b.TopK, MaxTopK)
		}
		r.K = b.TopK
		r.Logits, r.IDs, r.LSE = make([]float32, rows*r.K), make([]int32, rows*r.K), make([]float32, rows)
	} else {
		r.Logits = make([]float32, rows*r.Vocab)
	}
	nc := toks * len(b.Capture) * r.Embd
	inPlace := nc > 0 && b.CaptureInPlace && m.lib.api.hasCaptures()
	if len(b.Capture) > 0 && !inPlace {
		r.Capture = make([]float32, nc)
	}
	err := m.locked(func() error {
		if err := m.lib.api.runForward(m.m, &b, r); err != nil || !inPlace {
			return err
		}
		return m.lib.api.keptCaptures(m.m, r, nc)
	})
	if err != nil {
		return nil, err
	}
	return r, nil
}

// DraftEntry is one sequence's part of a draft step.
type DraftEntry struct {
	Seq Seq
	// Features are the new context rows ([n_ctx][Info.DraftFeatures]: the target's captured hidden states of the
	// positions after the draft sequence's length), appended to the draft's cache and kept.
	Features []float32
	// Block is the root token then mask tokens, at the positions after the context; not kept.
	Block []int32
}

// DraftForward runs a DFlash draft step; the result holds K candidates per row (IDs, Logits, LSE as forward with
// TopK), rows = per entry len(Block)-1 (none for 0 or 1), in entry order (Result.Candidates(e, i) is block position
// i+1 of entry e). For a DFlash2 draft (Info.DFlash2) it also holds the selector's transition scores between the K
// candidates of consecutive rows (Result.Trans; pass k = Info.SelectorTopK for the candidates the selector was
// trained on). Each sequence's length grows by its context rows; the caller should have reserved length + context +
// block tokens. On error no sequence changed length.
func (m *Model) DraftForward(entries []DraftEntry, k int) (*Result, error) {
	nf := m.info.DraftFeatures
	if nf <= 0 {
		return nil, fmt.Errorf("draft forward: %s model is not a DFlash draft", m.info.Arch)
	}
	if k < 1 || k > MaxTopK {
		return nil, fmt.Errorf("draft forward: top-k %d outside [1, %d]", k, MaxTopK)
	}
	r := &Result{Vocab: m.info.Vocab, Embd: m.info.Embd, K: k}
	rows := 0
	for i, e := range entries {
		if len(e.Features)%nf != 0 {
			return nil, fmt.Errorf("draft forward: entry %d (sequence %d) has %d feature floats, not a multiple of %d",
				i, e.Seq, len(e.Features), nf)
		}
		n := max(len(e.Block)-1, 0)
		start := -1
		if n > 0 {
			start = rows
		}
		r.rowStart = append(r.rowStart, start)
		r.rowCount = append(r.rowCount, n)
		rows += n
	}
	r.Logits, r.IDs, r.LSE = make([]float32, rows*k), make([]int32, rows*k), make([]float32, rows)
	if m.info.DFlash2() {
		r.Trans = make([]float32, rows*k*k)
	}
	if err := m.locked(func() error { return m.lib.api.runDraft(m.m, entries, nf, r) }); err != nil {
		return nil, err
	}
	return r, nil
}

// Sample picks a token from one row of logits. rng is the caller's per-sequence generator state: seed it once (any
// value, e.g. the request seed) and pass the same variable on every call. history holds the sequence's tokens for
// the penalties.
func (m *Model) Sample(logits []float32, p SamplingParams, history []int32, rng *uint64) (int32, error) {
	if rng == nil {
		return 0, errors.New("sample: rng state is nil")
	}
	return m.lib.api.runSample(logits, p, history, rng)
}

// SampleCandidates is Sample without history on a row given as a TopK forward's candidates (ids and logits, as
// Result.IDs and Result.Logits hold them per row) and the row's log-sum-exp: the token Sample would draw from the
// whole row with the same rng, or -1 (rng unchanged) where the candidates do not decide it (a temperature above 1,
// top-k or min-p set, or the draw may land outside them); the caller then samples the row from LogitsRow. suppressed
// (nil or one flag a candidate) marks candidates that are -Inf in the row Sample would see (end of generation not yet
// allowed). nVocab is the row's length.
func (m *Model) SampleCandidates(ids []int32, logits []float32, suppressed []bool, lse float32, nVocab int, p SamplingParams, rng *uint64) (int32, error) {
	if rng == nil {
		return 0, errors.New("sample candidates: rng state is nil")
	}
	return m.lib.api.runSampleCandidates(ids, logits, suppressed, lse, nVocab, p, rng)
}

// LogitsRow copies row `row` of the last forward's logits (a TopK forward's too) into dst (Info().Vocab floats),
// until the next forward; ErrState when that forward left no such row.
func (m *Model) LogitsRow(row int, dst []float32) error {
	if row < 0 || len(dst) < m.info.Vocab {
		return fmt.Errorf("logits row %d: room for %d of %d logits", row, len(dst), m.info.Vocab)
	}
	return m.locked(func() error { return m.lib.api.logitsRow(m.m, row, dst) })
}

// SampleDist writes the distribution Sample draws from for the same arguments into ids and probs (each with room for
// len(logits) entries): the tokens it can return, in no particular order, and their probabilities, summing to 1.
// It returns how many there are.
func (m *Model) SampleDist(logits []float32, p SamplingParams, history []int32, ids []int32, probs []float64) (int, error) {
	return m.lib.api.runSampleDist(logits, p, history, ids, probs)
}
