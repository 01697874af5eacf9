package engine

/*
#cgo CFLAGS: -I${SRCDIR}/../include
#cgo LDFLAGS: -ldl
#include "cabi.h"
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
		TreeRecordBytesFixed:  uint64(e.tree_record_bytes_fixed),
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
