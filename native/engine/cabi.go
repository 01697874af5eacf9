package engine

/*
#cgo CFLAGS: -I${SRCDIR}/../include
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include "dflash.h"

// The shims below call through the library's function table. Each copies last_error() within the same C call, so the
// message belongs to the failing call whatever OS thread the goroutine runs on next.

static char *dup_error(const dfl_api *a) { return strdup(a->last_error()); }

static const dfl_api *open_engine(const char *path, void **handle, char **err) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) { *err = strdup(dlerror()); return NULL; }
	dfl_get_api_fn get = (dfl_get_api_fn)dlsym(h, "dfl_get_api");
	if (!get) { *err = strdup("symbol dfl_get_api not found"); dlclose(h); return NULL; }
	const dfl_api *a = get(DFL_API_VERSION);
	if (!a) { *err = strdup("the library does not implement this ABI version"); dlclose(h); return NULL; }
	*handle = h;
	return a;
}

static int32_t w_device_count(const dfl_api *a) { return a->device_count(); }

static dfl_status w_model_load(const dfl_api *a, const dfl_model_params *p, dfl_model **out, char **err) {
	dfl_status rc = a->model_load(p, out);
	if (rc) *err = dup_error(a);
	return rc;
}
static void w_model_free(const dfl_api *a, dfl_model *m) { a->model_free(m); }
static dfl_status w_model_info(const dfl_api *a, const dfl_model *m, dfl_model_info *out, char **err) {
	out->struct_size = sizeof *out;
	dfl_status rc = a->model_info(m, out);
	if (rc) *err = dup_error(a);
	return rc;
}
static dfl_status w_kv_stats(const dfl_api *a, const dfl_model *m, dfl_kv_stats *out, char **err) {
	dfl_status rc = a->kv_stats(m, out);
	if (rc) *err = dup_error(a);
	return rc;
}
static dfl_status w_seq_alloc(const dfl_api *a, dfl_model *m, int32_t *out, char **err) {
	dfl_status rc = a->seq_alloc(m, out);
	if (rc) *err = dup_error(a);
	return rc;
}
// op: 0 free, 1 reserve, 2 truncate, 3 snapshot, 4 rollback
static dfl_status w_seq_op(const dfl_api *a, dfl_model *m, int op, int32_t s, uint32_t n, char **err) {
	dfl_status rc;
	switch (op) {
	case 0: rc = a->seq_free(m, s); break;
	case 1: rc = a->seq_reserve(m, s, n); break;
	case 2: rc = a->seq_truncate(m, s, n); break;
	case 3: rc = a->seq_snapshot(m, s); break;
	default: rc = a->seq_rollback(m, s); break;
	}
	if (rc) *err = dup_error(a);
	return rc;
}
static dfl_status w_seq_length(const dfl_api *a, const dfl_model *m, int32_t s, uint32_t *out, char **err) {
	dfl_status rc = a->seq_length(m, s, out);
	if (rc) *err = dup_error(a);
	return rc;
}
static dfl_status w_forward(const dfl_api *a, dfl_model *m, const dfl_batch *b, char **err) {
	dfl_status rc = a->forward(m, b);
	if (rc) *err = dup_error(a);
	return rc;
}
static dfl_status w_sample(const dfl_api *a, const float *logits, uint32_t n_vocab, const dfl_sampling *p,
                           const int32_t *hist, uint32_t n_hist, uint64_t *rng, int32_t *out, char **err) {
	dfl_status rc = a->sample(logits, n_vocab, p, hist, n_hist, rng, out);
	if (rc) *err = dup_error(a);
	return rc;
}
// Entries appended to the table after its first release exist only when the library's struct_size covers them.
static int has_memory_api(const dfl_api *a) {
	return a->struct_size >= offsetof(dfl_api, model_estimate) + sizeof(a->model_estimate);
}
static dfl_status w_device_memory(const dfl_api *a, int32_t index, uint64_t *free_b, uint64_t *total_b, char **err) {
	dfl_status rc = a->device_memory(index, free_b, total_b);
	if (rc) *err = dup_error(a);
	return rc;
}
static dfl_status w_model_estimate(const dfl_api *a, const dfl_model_params *p, dfl_model_estimate *out, char **err) {
	out->struct_size = sizeof *out;
	dfl_status rc = a->model_estimate(p, out);
	if (rc) *err = dup_error(a);
	return rc;
}
static int has_topk_api(const dfl_api *a) {
	return a->struct_size >= offsetof(dfl_api, forward_topk) + sizeof(a->forward_topk);
}
static dfl_status w_forward_topk(const dfl_api *a, dfl_model *m, const dfl_batch *b, uint32_t k, int32_t *ids,
                                 float *logits, float *lse, char **err) {
	dfl_status rc = a->forward_topk(m, b, k, ids, logits, lse);
	if (rc) *err = dup_error(a);
	return rc;
}
static int has_tree_api(const dfl_api *a) {
	return a->struct_size >= offsetof(dfl_api, seq_accept_path) + sizeof(a->seq_accept_path);
}
static dfl_status w_forward_tree(const dfl_api *a, dfl_model *m, const dfl_batch *b, const int32_t *const *parents,
                                 uint32_t k, int32_t *ids, float *logits, float *lse, char **err) {
	dfl_status rc = a->forward_tree(m, b, parents, k, ids, logits, lse);
	if (rc) *err = dup_error(a);
	return rc;
}
static dfl_status w_seq_accept_path(const dfl_api *a, dfl_model *m, int32_t s, const int32_t *path, uint32_t n,
                                    char **err) {
	dfl_status rc = a->seq_accept_path(m, s, path, n);
	if (rc) *err = dup_error(a);
	return rc;
}
static int has_draft2_api(const dfl_api *a) {
	return a->struct_size >= offsetof(dfl_api, draft_forward2) + sizeof(a->draft_forward2);
}
static dfl_status w_draft_forward2(const dfl_api *a, dfl_model *m, uint32_t n, const dfl_draft_entry *es, uint32_t k,
                                   int32_t *ids, float *logits, float *lse, float *trans, char **err) {
	dfl_status rc = a->draft_forward2(m, n, es, k, ids, logits, lse, trans);
	if (rc) *err = dup_error(a);
	return rc;
}
static int has_draft_api(const dfl_api *a) {
	return a->struct_size >= offsetof(dfl_api, draft_forward) + sizeof(a->draft_forward);
}
static dfl_status w_draft_forward(const dfl_api *a, dfl_model *m, uint32_t n, const dfl_draft_entry *es, uint32_t k,
                                  int32_t *ids, float *logits, float *lse, char **err) {
	dfl_status rc = a->draft_forward(m, n, es, k, ids, logits, lse);
	if (rc) *err = dup_error(a);
	return rc;
}
static int has_state_api(const dfl_api *a) {
	return a->struct_size >= offsetof(dfl_api, seq_import) + sizeof(a->seq_import);
}
static dfl_status w_seq_export(const dfl_api *a, const dfl_model *m, int32_t s, void *buf, uint64_t size,
                               uint64_t *needed, char **err) {
	dfl_status rc = a->seq_export(m, s, buf, size, needed);
	if (rc) *err = dup_error(a);
	return rc;
}
static dfl_status w_seq_import(const dfl_api *a, dfl_model *m, int32_t s, const void *buf, uint64_t size, char **err) {
	dfl_status rc = a->seq_import(m, s, buf, size);
	if (rc) *err = dup_error(a);
	return rc;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sort"
	"unsafe"
)

// ABIVersion is the C ABI version this package was built against (DFL_API_VERSION).
const ABIVersion = C.DFL_API_VERSION

// capi is a library's function table; cmodel an engine model.
type (
	capi   struct{ t *C.dfl_api }
	cmodel = C.dfl_model
)

// Error is a failure reported by the engine library.
type Error struct {
	Code int    // the C status (DFL_ERR_*)
	Msg  string // the library's message, naming the culprit
}

func (e *Error) Error() string { return e.Msg }

// Is lets errors.Is match the sentinel errors by code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Msg == "" && t.Code == e.Code
}

// Sentinels for errors.Is; the engine's own errors carry a message as well.
var (
	ErrInvalid     = &Error{Code: C.DFL_ERR_INVALID}
	ErrUnsupported = &Error{Code: C.DFL_ERR_UNSUPPORTED}
	ErrNoMemory    = &Error{Code: C.DFL_ERR_NO_MEMORY}
	ErrNoKV        = &Error{Code: C.DFL_ERR_NO_KV}    // the KV pool is full; nothing changed
	ErrNoSeq       = &Error{Code: C.DFL_ERR_NO_SEQ}   // every sequence slot is in use
	ErrState       = &Error{Code: C.DFL_ERR_STATE}    // e.g. rollback without a snapshot
	ErrInternal    = &Error{Code: C.DFL_ERR_INTERNAL} // a bug in the engine
)

// status turns a C status and its copied message into an error, freeing the message.
func status(rc C.dfl_status, msg *C.char) error {
	if rc == C.DFL_OK {
		return nil
	}
	text := fmt.Sprintf("engine error %d", int(rc))
	if msg != nil {
		text = C.GoString(msg)
		C.free(unsafe.Pointer(msg))
	}
	return &Error{Code: int(rc), Msg: text}
}

func openAPI(path string) (*capi, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var handle unsafe.Pointer
	var msg *C.char
	api := C.open_engine(cpath, &handle, &msg)
	if api == nil {
		text := "unknown error"
		if msg != nil {
			text = C.GoString(msg)
			C.free(unsafe.Pointer(msg))
		}
		return nil, errors.New(text)
	}
	return &capi{t: api}, nil
}

func (a *capi) kind() string     { return C.GoString(a.t.device_kind) }
func (a *capi) deviceCount() int { return int(C.w_device_count(a.t)) }

// cArena collects C allocations of one call.
type cArena []unsafe.Pointer

func (ar *cArena) str(s string) *C.char {
	p := C.CString(s)
	*ar = append(*ar, unsafe.Pointer(p))
	return p
}

func (ar *cArena) alloc(n, size int) unsafe.Pointer {
	if n == 0 {
		return nil
	}
	p := C.calloc(C.size_t(n), C.size_t(size))
	if p == nil {
		panic("engine: C allocation failed")
	}
	*ar = append(*ar, p)
	return p
}

func (ar *cArena) free() {
	for _, p := range *ar {
		C.free(p)
	}
	*ar = nil
}

func cMeta(ar *cArena, key string, v any) (C.dfl_meta, error) {
	m := C.dfl_meta{key: ar.str(key)}
	setInt := func(x int64) { m.kind, m.i = C.DFL_META_INT, C.int64_t(x) }
	setInts := func(xs []int64) {
		m.kind, m.n = C.DFL_META_INT_ARRAY, C.uint32_t(len(xs))
		p := unsafe.Slice((*C.int64_t)(ar.alloc(len(xs), 8)), len(xs))
		for i, x := range xs {
			p[i] = C.int64_t(x)
		}
		if len(xs) > 0 {
			m.ia = &p[0]
		}
	}
	setFloats := func(xs []float64) {
		m.kind, m.n = C.DFL_META_FLOAT_ARRAY, C.uint32_t(len(xs))
		p := unsafe.Slice((*C.double)(ar.alloc(len(xs), 8)), len(xs))
		for i, x := range xs {
			p[i] = C.double(x)
		}
		if len(xs) > 0 {
			m.fa = &p[0]
		}
	}
	switch x := v.(type) {
	case bool:
		if x {
			setInt(1)
		} else {
			setInt(0)
		}
	case int:
		setInt(int64(x))
	case int8:
		setInt(int64(x))
	case int16:
		setInt(int64(x))
	case int32:
		setInt(int64(x))
	case int64:
		setInt(x)
	case uint8:
		setInt(int64(x))
	case uint16:
		setInt(int64(x))
	case uint32:
		setInt(int64(x))
	case uint64:
		if x > 1<<62 {
			return m, fmt.Errorf("metadata %s: value %d is too large", key, x)
		}
		setInt(int64(x))
	case float32:
		m.kind, m.f = C.DFL_META_FLOAT, C.double(x)
	case float64:
		m.kind, m.f = C.DFL_META_FLOAT, C.double(x)
	case string:
		m.kind, m.s = C.DFL_META_STRING, ar.str(x)
	case []int32:
		setInts(widen(x))
	case []uint32:
		setInts(widen(x))
	case []int64:
		setInts(x)
	case []uint64:
		setInts(widen(x))
	case []int:
		setInts(widen(x))
	case []float32:
		fs := make([]float64, len(x))
		for i, f := range x {
			fs[i] = float64(f)
		}
		setFloats(fs)
	case []float64:
		setFloats(x)
	default:
		return m, fmt.Errorf("metadata %s: unsupported value type %T", key, v)
	}
	return m, nil
}

func widen[T int | int32 | uint32 | uint64](xs []T) []int64 {
	out := make([]int64, len(xs))
	for i, x := range xs {
		out[i] = int64(x)
	}
	return out
}

// load builds the C parameter block and loads the model. pin keeps the tensor data in place for as long as the engine
// references it.
func (a *capi) load(spec *ModelSpec, device int, pin *runtime.Pinner) (*cmodel, error) {
	var ar cArena
	defer ar.free()
	p, err := cParams(&ar, spec, device, pin)
	if err != nil {
		return nil, err
	}
	var out *C.dfl_model
	var msg *C.char
	if err := status(C.w_model_load(a.t, &p, &out, &msg), msg); err != nil {
		return nil, err
	}
	return out, nil
}

var errNoMemoryAPI = errors.New("the engine library predates device_memory/model_estimate: rebuild it")

// memory reports free and total bytes of a device.
func (a *capi) memory(device int) (free, total uint64, err error) {
	if C.has_memory_api(a.t) == 0 {
		return 0, 0, errNoMemoryAPI
	}
	var f, t C.uint64_t
	var msg *C.char
	if err := status(C.w_device_memory(a.t, C.int32_t(device), &f, &t, &msg), msg); err != nil {
		return 0, 0, err
	}
	return uint64(f), uint64(t), nil
}

// estimate asks the library what spec would take on its device.
func (a *capi) estimate(spec *ModelSpec) (Estimate, error) {
	if C.has_memory_api(a.t) == 0 {
		return Estimate{}, errNoMemoryAPI
	}
	var ar cArena
	defer ar.free()
	var pin runtime.Pinner
	defer pin.Unpin()
	p, err := cParams(&ar, spec, 0, &pin)
	if err != nil {
		return Estimate{}, err
	}
	var e C.dfl_model_estimate
	var msg *C.char
	if err := status(C.w_model_estimate(a.t, &p, &e, &msg), msg); err != nil {
		return Estimate{}, err
	}
	return Estimate{
		WeightBytes:      uint64(e.weight_bytes),
		KVBytesPerToken:  uint64(e.kv_bytes_per_token),
		StateBytesPerSeq: uint64(e.state_bytes_per_seq),
		ScratchBytes:     uint64(e.scratch_bytes),
		// (zero where the library's struct is shorter: w_model_estimate passes a zeroed one)
		RecordBytesFixed:      uint64(e.record_bytes_fixed),
		RecordBytesPerRow:     uint64(e.record_bytes_per_row),
		TreeRecordBytesPerRow: uint64(e.tree_record_bytes_per_row),
	}, nil
}

// cParams builds the C parameter block: names, metadata and the tensor table in C memory (freed with ar), tensor data
// pinned in place.
func cParams(ar *cArena, spec *ModelSpec, device int, pin *runtime.Pinner) (C.dfl_model_params, error) {
	opt := spec.Options.withDefaults()
	ck, err := opt.CacheK.id()
	if err != nil {
		return C.dfl_model_params{}, fmt.Errorf("cache type k: %w", err)
	}
	cv, err := opt.CacheV.id()
	if err != nil {
		return C.dfl_model_params{}, fmt.Errorf("cache type v: %w", err)
	}

	nt := len(spec.Tensors)
	tens := unsafe.Slice((*C.dfl_tensor)(ar.alloc(nt, C.sizeof_dfl_tensor)), nt)
	for i := range spec.Tensors {
		t := &spec.Tensors[i]
		if len(t.Dims) < 1 || len(t.Dims) > 4 {
			return C.dfl_model_params{}, fmt.Errorf("tensor %q: %d dimensions (want 1..4)", t.Name, len(t.Dims))
		}
		ct := &tens[i]
		ct.name = ar.str(t.Name)
		ct._type = C.uint32_t(t.Type)
		ct.n_dims = C.uint32_t(len(t.Dims))
		for d := 0; d < 4; d++ {
			ct.dims[d] = 1
			if d < len(t.Dims) {
				ct.dims[d] = C.uint64_t(t.Dims[d])
			}
		}
		ct.size = C.uint64_t(len(t.Data))
		if len(t.Data) > 0 {
			pin.Pin(&t.Data[0])
			ct.data = unsafe.Pointer(&t.Data[0])
		}
	}

	keys := make([]string, 0, len(spec.Meta))
	for k := range spec.Meta {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	meta := unsafe.Slice((*C.dfl_meta)(ar.alloc(len(keys), C.sizeof_dfl_meta)), len(keys))
	for i, k := range keys {
		m, err := cMeta(ar, k, spec.Meta[k])
		if err != nil {
			return C.dfl_model_params{}, err
		}
		meta[i] = m
	}

	p := C.dfl_model_params{
		struct_size:    C.sizeof_dfl_model_params,
		arch:           ar.str(spec.Arch),
		n_meta:         C.uint32_t(len(keys)),
		n_tensors:      C.uint32_t(nt),
		kv_pool_tokens: C.uint32_t(opt.KVPoolTokens),
		kv_block_size:  C.uint32_t(opt.BlockSize),
		max_seqs:       C.uint32_t(opt.MaxSeqs),
		cache_type_k:   C.uint32_t(ck),
		cache_type_v:   C.uint32_t(cv),
		n_threads:      C.uint32_t(opt.Threads),
		device:         C.int32_t(device),
	}
	if len(keys) > 0 {
		p.meta = &meta[0]
	}
	if nt > 0 {
		p.tensors = &tens[0]
	}
	if opt.CopyWeights {
		p.flags |= C.DFL_LOAD_COPY_WEIGHTS
	}
	return p, nil
}

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
	var hist *C.int32_t
	if len(history) > 0 {
		hist = (*C.int32_t)(unsafe.Pointer(&history[0]))
	}
	var tok C.int32_t
	var msg *C.char
	err := status(C.w_sample(a.t, (*C.float)(unsafe.Pointer(&logits[0])), C.uint32_t(len(logits)), &cp, hist,
		C.uint32_t(len(history)), (*C.uint64_t)(unsafe.Pointer(rng)), &tok, &msg), msg)
	return int32(tok), err
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
