package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"

	"github.com/dflash/dflash_server/sdk/internal/mmap"
)

// Magic is the first four bytes of every GGUF file.
const Magic = "GGUF"

// DefaultAlignment is the data alignment when general.alignment is absent.
const DefaultAlignment = 32

// KeyArchitecture is the metadata key naming the model architecture.
const KeyArchitecture = "general.architecture"

// KeyAlignment is the metadata key overriding DefaultAlignment.
const KeyAlignment = "general.alignment"

// Limits that keep a hostile header from asking for absurd work; they match
// ggml's GGUF_MAX_STRING_LENGTH and GGUF_MAX_ARRAY_ELEMENTS.
const (
	maxStringLen = 1 << 30
	maxArrayLen  = 1 << 30
	headerSize   = 24
	// Smallest possible records: a 1-byte key, its type and a 1-byte value;
	// a 1-byte tensor name, n_dims = 0, type and offset.
	minKVSize     = 8 + 1 + 4 + 1
	minTensorSize = 8 + 1 + 4 + 4 + 8
)

// TensorInfo describes one tensor of a file.
type TensorInfo struct {
	Name string
	Type Type
	// Dims are in ggml order: Dims[0] (ne0) is the contiguous dimension.
	Dims []uint64
	// Offset is the absolute position of the tensor's first byte in the file
	// (the data section start plus the record's relative offset).
	Offset uint64
	// Size is the tensor's length in bytes, without alignment padding.
	Size uint64
}

// Elements is the number of elements of the tensor.
func (t TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// KV describes one metadata record (its value comes from File.Meta).
type KV struct {
	Key  string
	Type ValueType
	// ElemType and Len describe arrays; both are zero for scalars.
	ElemType ValueType
	Len      uint64
}

type kvEntry struct {
	KV
	val any    // decoded scalar; nil for arrays
	off uint64 // arrays: offset of the first element in the file
}

// File is an open GGUF file. Its methods are safe for concurrent use until
// Close; after Close, array metadata and tensor data are gone.
type File struct {
	version   uint32
	alignment uint64
	dataStart uint64
	kvs       []kvEntry
	kvIndex   map[string]int
	tensors   []TensorInfo
	tIndex    map[string]int
	data      []byte
	unmap     func() error
}

// Open memory-maps path and parses its header.
func Open(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open gguf: %w", err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("open gguf %s: %w", path, err)
	}
	data, unmap, err := mmap.File(fd, st.Size())
	if err != nil {
		return nil, fmt.Errorf("open gguf %s: %w", path, err)
	}
	f, err := parse(data, false)
	if err != nil {
		_ = unmap()
		return nil, fmt.Errorf("open gguf %s: %w", path, err)
	}
	f.unmap = unmap
	return f, nil
}

// EvictTensorData drops the resident pages of the named tensor's data from a file opened by Open (for a File from
// Parse it does nothing). The data stay readable: the mapping is a read-only view of the file, so a later read faults
// the pages back in. For a caller that no longer reads the tensor (an engine that copied it into a layout of its own),
// so that the file's copy stops counting as the process's memory.
func (f *File) EvictTensorData(name string) error {
	if f.unmap == nil {
		return nil
	}
	b, err := f.TensorData(name)
	if err != nil {
		return err
	}
	return mmap.Evict(b)
}

// Parse parses a whole GGUF file held in memory. The File refers to b.
func Parse(b []byte) (*File, error) {
	f, err := parse(b, false)
	if err != nil {
		return nil, fmt.Errorf("parse gguf: %w", err)
	}
	return f, nil
}

// ReadArch returns general.architecture, reading no further into the file
// than the metadata record that holds it.
func ReadArch(path string) (string, error) {
	arch, err := readArch(path)
	if err != nil {
		return "", fmt.Errorf("failed to detect architecture from %s: %w", path, err)
	}
	return arch, nil
}

func readArch(path string) (string, error) {
	fd, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return "", err
	}
	data, unmap, err := mmap.File(fd, st.Size())
	if err != nil {
		return "", err
	}
	defer unmap()
	f, err := parse(data, true)
	if err != nil {
		return "", err
	}
	return f.String(KeyArchitecture)
}

// Close releases the mapping. Slices from TensorData must not be used after.
func (f *File) Close() error {
	f.data = nil
	if f.unmap == nil {
		return nil
	}
	u := f.unmap
	f.unmap = nil
	if err := u(); err != nil {
		return fmt.Errorf("close gguf: %w", err)
	}
	return nil
}

// Version is the file's GGUF version (2 or 3).
func (f *File) Version() uint32 { return f.version }

// Alignment is the file's data alignment in bytes.
func (f *File) Alignment() uint64 { return f.alignment }

// DataStart is the absolute offset of the tensor data section.
func (f *File) DataStart() uint64 { return f.dataStart }

// Arch returns general.architecture, or "" when it is missing.
func (f *File) Arch() string {
	s, _ := f.String(KeyArchitecture)
	return s
}

// KVs lists the metadata records in file order.
func (f *File) KVs() []KV {
	out := make([]KV, len(f.kvs))
	for i, e := range f.kvs {
		out[i] = e.KV
	}
	return out
}

// Tensors lists the tensors in file order. The slice is shared: do not
// modify it.
func (f *File) Tensors() []TensorInfo { return f.tensors }

// Tensor returns the named tensor's info.
func (f *File) Tensor(name string) (TensorInfo, bool) {
	i, ok := f.tIndex[name]
	if !ok {
		return TensorInfo{}, false
	}
	return f.tensors[i], true
}

// TensorData returns the named tensor's bytes as a slice of the mapping (no
// copy). It is valid until Close and must not be written to.
func (f *File) TensorData(name string) ([]byte, error) {
	i, ok := f.tIndex[name]
	if !ok {
		return nil, fmt.Errorf("tensor %q not found", name)
	}
	if f.data == nil && f.tensors[i].Size > 0 {
		return nil, fmt.Errorf("tensor %q: file is closed", name)
	}
	t := f.tensors[i]
	return f.data[t.Offset : t.Offset+t.Size : t.Offset+t.Size], nil
}

// Meta returns the value of a metadata key as a Go value: string, bool,
// uint8, int8, uint16, int16, uint32, int32, uint64, int64, float32 or
// float64 for scalars, and a slice of the same element type for arrays
// ([]string, []int32, ...). Arrays are decoded afresh on every call.
func (f *File) Meta(key string) (any, bool) {
	i, ok := f.kvIndex[key]
	if !ok {
		return nil, false
	}
	e := &f.kvs[i]
	if e.Type != ValueArray {
		return e.val, true
	}
	if f.data == nil {
		return nil, false
	}
	return decodeArray(f.data, e.off, e.ElemType, e.Len), true
}

// decodeArray decodes an array whose bounds parse already checked.
func decodeArray(b []byte, off uint64, et ValueType, n uint64) any {
	le := binary.LittleEndian
	switch et {
	case ValueUint8:
		out := make([]uint8, n)
		copy(out, b[off:])
		return out
	case ValueInt8:
		out := make([]int8, n)
		for i := range out {
			out[i] = int8(b[off+uint64(i)])
		}
		return out
	case ValueBool:
		out := make([]bool, n)
		for i := range out {
			out[i] = b[off+uint64(i)] != 0
		}
		return out
	case ValueUint16:
		out := make([]uint16, n)
		for i := range out {
			out[i] = le.Uint16(b[off+2*uint64(i):])
		}
		return out
	case ValueInt16:
		out := make([]int16, n)
		for i := range out {
			out[i] = int16(le.Uint16(b[off+2*uint64(i):]))
		}
		return out
	case ValueUint32:
		out := make([]uint32, n)
		for i := range out {
			out[i] = le.Uint32(b[off+4*uint64(i):])
		}
		return out
	case ValueInt32:
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(le.Uint32(b[off+4*uint64(i):]))
		}
		return out
	case ValueFloat32:
		out := make([]float32, n)
		for i := range out {
			out[i] = math.Float32frombits(le.Uint32(b[off+4*uint64(i):]))
		}
		return out
	case ValueUint64:
		out := make([]uint64, n)
		for i := range out {
			out[i] = le.Uint64(b[off+8*uint64(i):])
		}
		return out
	case ValueInt64:
		out := make([]int64, n)
		for i := range out {
			out[i] = int64(le.Uint64(b[off+8*uint64(i):]))
		}
		return out
	case ValueFloat64:
		out := make([]float64, n)
		for i := range out {
			out[i] = math.Float64frombits(le.Uint64(b[off+8*uint64(i):]))
		}
		return out
	case ValueString:
		// One allocation for all the text; the strings are slices of it.
		total, p := 0, off
		for i := uint64(0); i < n; i++ {
			l := le.Uint64(b[p:])
			total += int(l)
			p += 8 + l
		}
		var sb strings.Builder
		sb.Grow(total)
		bounds := make([]int, n+1)
		for i := uint64(0); i < n; i++ {
			l := le.Uint64(b[off:])
			sb.Write(b[off+8 : off+8+l])
			bounds[i+1] = sb.Len()
			off += 8 + l
		}
		all := sb.String()
		out := make([]string, n)
		for i := range out {
			out[i] = all[bounds[i]:bounds[i+1]]
		}
		return out
	}
	return nil
}

// decoder reads little-endian fields from b, bounds-checking every read.
type decoder struct {
	b   []byte
	off uint64
}

var errTruncated = errors.New("truncated file")

func (d *decoder) left() uint64 { return uint64(len(d.b)) - d.off }

func (d *decoder) take(n uint64, what string) ([]byte, error) {
	if n > d.left() {
		return nil, fmt.Errorf("%w: %s needs %d bytes at offset %d, %d left", errTruncated, what, n, d.off, d.left())
	}
	s := d.b[d.off : d.off+n]
	d.off += n
	return s, nil
}

func (d *decoder) u32(what string) (uint32, error) {
	s, err := d.take(4, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(s), nil
}

func (d *decoder) u64(what string) (uint64, error) {
	s, err := d.take(8, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(s), nil
}

// str reads a gguf_string, returning it as a slice of b.
func (d *decoder) str(what string) ([]byte, error) {
	n, err := d.u64(what + " length")
	if err != nil {
		return nil, err
	}
	if n > maxStringLen {
		return nil, fmt.Errorf("%s length %d exceeds the %d-byte limit", what, n, maxStringLen)
	}
	if n > d.left() {
		return nil, fmt.Errorf("%w: %s length %d exceeds the %d bytes left at offset %d", errTruncated, what, n, d.left(), d.off)
	}
	return d.take(n, what)
}

// parse parses a file's header. With archOnly it stops after the
// general.architecture record (or fails if the metadata has none).
func parse(b []byte, archOnly bool) (*File, error) {
	d := &decoder{b: b}
	if len(b) < 4 || string(b[:4]) != Magic {
		n := min(len(b), 4)
		return nil, fmt.Errorf("not a GGUF file (magic %q, want %q)", b[:n], Magic)
	}
	d.off = 4
	version, err := d.u32("version")
	if err != nil {
		return nil, err
	}
	switch {
	case version&0xFFFF == 0:
		return nil, fmt.Errorf("GGUF version %#x looks byte-swapped: big-endian files are not supported", version)
	case version == 1:
		return nil, errors.New("GGUF version 1 is no longer supported")
	case version < 2 || version > 3:
		return nil, fmt.Errorf("unsupported GGUF version %d (want 2 or 3)", version)
	}
	nTensors, err := d.u64("tensor count")
	if err != nil {
		return nil, err
	}
	nKV, err := d.u64("metadata count")
	if err != nil {
		return nil, err
	}
	if nKV > d.left()/minKVSize {
		return nil, fmt.Errorf("metadata count %d is impossible in a file of %d bytes", nKV, len(b))
	}
	if nTensors > d.left()/minTensorSize {
		return nil, fmt.Errorf("tensor count %d is impossible in a file of %d bytes", nTensors, len(b))
	}
	if nKV*minKVSize+nTensors*minTensorSize > d.left() {
		return nil, fmt.Errorf("%d metadata records and %d tensors cannot fit in a file of %d bytes", nKV, nTensors, len(b))
	}

	f := &File{
		version:   version,
		alignment: DefaultAlignment,
		kvs:       make([]kvEntry, 0, nKV),
		kvIndex:   make(map[string]int, nKV),
		data:      b,
	}
	for i := uint64(0); i < nKV; i++ {
		e, err := d.kv(i)
		if err != nil {
			return nil, err
		}
		if _, dup := f.kvIndex[e.Key]; dup {
			return nil, fmt.Errorf("duplicate metadata key %q", e.Key)
		}
		f.kvIndex[e.Key] = len(f.kvs)
		f.kvs = append(f.kvs, e)
		if archOnly && e.Key == KeyArchitecture {
			return f, nil
		}
	}
	if archOnly {
		return nil, fmt.Errorf("no %s key in the metadata", KeyArchitecture)
	}
	if i, ok := f.kvIndex[KeyAlignment]; ok {
		a, isU32 := f.kvs[i].val.(uint32)
		if !isU32 {
			return nil, fmt.Errorf("key %q has type %s, want uint32", KeyAlignment, f.kvs[i].Type)
		}
		if a == 0 || a&(a-1) != 0 {
			return nil, fmt.Errorf("key %q = %d is not a power of two", KeyAlignment, a)
		}
		f.alignment = uint64(a)
	}

	f.tensors = make([]TensorInfo, 0, nTensors)
	f.tIndex = make(map[string]int, nTensors)
	rel := make([]uint64, 0, nTensors)
	for i := uint64(0); i < nTensors; i++ {
		t, off, err := d.tensorInfo(i, f.alignment)
		if err != nil {
			return nil, err
		}
		if _, dup := f.tIndex[t.Name]; dup {
			return nil, fmt.Errorf("duplicate tensor name %q", t.Name)
		}
		f.tIndex[t.Name] = len(f.tensors)
		f.tensors = append(f.tensors, t)
		rel = append(rel, off)
	}
	f.dataStart = alignUp(d.off, f.alignment)
	if err := f.placeTensors(rel, uint64(len(b))); err != nil {
		return nil, err
	}
	return f, nil
}

func alignUp(x, a uint64) uint64 { return x + (a-x%a)%a }

// kv reads metadata record i.
func (d *decoder) kv(i uint64) (kvEntry, error) {
	start := d.off
	kb, err := d.str("key")
	if err != nil {
		return kvEntry{}, fmt.Errorf("metadata record #%d: %w", i, err)
	}
	if len(kb) == 0 {
		return kvEntry{}, fmt.Errorf("metadata key #%d at offset %d is empty", i, start)
	}
	if len(kb) > math.MaxUint16 {
		return kvEntry{}, fmt.Errorf("metadata key #%d at offset %d is %d bytes long, at most %d allowed", i, start, len(kb), math.MaxUint16)
	}
	for _, c := range kb {
		if c >= 0x80 || c < 0x20 {
			return kvEntry{}, fmt.Errorf("metadata key #%d at offset %d is not printable ASCII: %q", i, start, kb)
		}
	}
	e := kvEntry{KV: KV{Key: string(kb)}}
	vt, err := d.u32("value type")
	if err != nil {
		return kvEntry{}, fmt.Errorf("key %q: %w", e.Key, err)
	}
	e.Type = ValueType(vt)
	if !e.Type.valid() {
		return kvEntry{}, fmt.Errorf("key %q has unknown value type %d", e.Key, vt)
	}
	if e.Type != ValueArray {
		e.val, err = d.scalar(e.Type, e.Key)
		return e, err
	}
	et, err := d.u32("array element type")
	if err != nil {
		return kvEntry{}, fmt.Errorf("key %q: %w", e.Key, err)
	}
	e.ElemType = ValueType(et)
	switch {
	case e.ElemType == ValueArray:
		return kvEntry{}, fmt.Errorf("key %q is a nested array, which is not supported", e.Key)
	case !e.ElemType.valid():
		return kvEntry{}, fmt.Errorf("key %q has unknown array element type %d", e.Key, et)
	}
	if e.Len, err = d.u64("array length"); err != nil {
		return kvEntry{}, fmt.Errorf("key %q: %w", e.Key, err)
	}
	if e.Len > maxArrayLen {
		return kvEntry{}, fmt.Errorf("key %q: array length %d exceeds the limit of %d", e.Key, e.Len, maxArrayLen)
	}
	e.off = d.off
	if e.ElemType != ValueString {
		size := e.Len * uint64(valueSizes[e.ElemType])
		if size > d.left() {
			return kvEntry{}, fmt.Errorf("%w: key %q: array of %d %s needs %d bytes, %d left", errTruncated, e.Key, e.Len, e.ElemType, size, d.left())
		}
		d.off += size
		return e, nil
	}
	if e.Len > d.left()/8 {
		return kvEntry{}, fmt.Errorf("%w: key %q: array of %d strings cannot fit in the %d bytes left", errTruncated, e.Key, e.Len, d.left())
	}
	// The vocabulary makes this the hot loop of Open: walk the lengths
	// without the general-purpose helpers.
	off, end := d.off, uint64(len(d.b))
	for j := uint64(0); j < e.Len; j++ {
		if end-off < 8 {
			return kvEntry{}, fmt.Errorf("%w: key %q element %d: string length needs 8 bytes at offset %d, %d left", errTruncated, e.Key, j, off, end-off)
		}
		n := binary.LittleEndian.Uint64(d.b[off:])
		off += 8
		if n > maxStringLen || n > end-off {
			return kvEntry{}, fmt.Errorf("%w: key %q element %d: string length %d exceeds the %d bytes left", errTruncated, e.Key, j, n, end-off)
		}
		off += n
	}
	d.off = off
	return e, nil
}

func (d *decoder) scalar(t ValueType, key string) (any, error) {
	if t == ValueString {
		s, err := d.str("value")
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", key, err)
		}
		return string(s), nil
	}
	s, err := d.take(uint64(valueSizes[t]), "value")
	if err != nil {
		return nil, fmt.Errorf("key %q: %w", key, err)
	}
	le := binary.LittleEndian
	switch t {
	case ValueUint8:
		return s[0], nil
	case ValueInt8:
		return int8(s[0]), nil
	case ValueBool:
		return s[0] != 0, nil
	case ValueUint16:
		return le.Uint16(s), nil
	case ValueInt16:
		return int16(le.Uint16(s)), nil
	case ValueUint32:
		return le.Uint32(s), nil
	case ValueInt32:
		return int32(le.Uint32(s)), nil
	case ValueFloat32:
		return math.Float32frombits(le.Uint32(s)), nil
	case ValueUint64:
		return le.Uint64(s), nil
	case ValueInt64:
		return int64(le.Uint64(s)), nil
	case ValueFloat64:
		return math.Float64frombits(le.Uint64(s)), nil
	}
	return nil, fmt.Errorf("key %q has unknown value type %d", key, t)
}

// tensorInfo reads tensor-info record i; it returns the relative offset.
func (d *decoder) tensorInfo(i, alignment uint64) (TensorInfo, uint64, error) {
	start := d.off
	nb, err := d.str("name")
	if err != nil {
		return TensorInfo{}, 0, fmt.Errorf("tensor #%d: %w", i, err)
	}
	if len(nb) == 0 {
		return TensorInfo{}, 0, fmt.Errorf("tensor #%d at offset %d has an empty name", i, start)
	}
	if len(nb) > maxNameLen {
		return TensorInfo{}, 0, fmt.Errorf("tensor #%d name %q is %d bytes long, at most %d allowed", i, nb[:maxNameLen], len(nb), maxNameLen)
	}
	t := TensorInfo{Name: string(nb)}
	nd, err := d.u32("dim count")
	if err != nil {
		return TensorInfo{}, 0, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	if nd > maxDims {
		return TensorInfo{}, 0, fmt.Errorf("tensor %q has %d dims, at most %d allowed", t.Name, nd, maxDims)
	}
	t.Dims = make([]uint64, nd)
	for j := range t.Dims {
		if t.Dims[j], err = d.u64("dims"); err != nil {
			return TensorInfo{}, 0, fmt.Errorf("tensor %q: %w", t.Name, err)
		}
	}
	ty, err := d.u32("type")
	if err != nil {
		return TensorInfo{}, 0, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	t.Type = Type(ty)
	off, err := d.u64("offset")
	if err != nil {
		return TensorInfo{}, 0, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	if t.Size, err = TensorBytes(t.Type, t.Dims); err != nil {
		return TensorInfo{}, 0, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	if off%alignment != 0 {
		return TensorInfo{}, 0, fmt.Errorf("tensor %q: offset %d is not a multiple of the alignment %d", t.Name, off, alignment)
	}
	return t, off, nil
}

// placeTensors turns relative offsets into absolute ones and checks that
// every tensor lies inside the file and no two overlap.
func (f *File) placeTensors(rel []uint64, fileSize uint64) error {
	if len(f.tensors) > 0 && f.dataStart > fileSize {
		return fmt.Errorf("%w: data section would start at %d, past the end of the %d-byte file", errTruncated, f.dataStart, fileSize)
	}
	room := fileSize - f.dataStart
	for i := range f.tensors {
		t := &f.tensors[i]
		if rel[i] > room || t.Size > room-rel[i] {
			return fmt.Errorf("%w: tensor %q (%d bytes at data offset %d) extends past the end of the file (%d bytes of data)", errTruncated, t.Name, t.Size, rel[i], room)
		}
		t.Offset = f.dataStart + rel[i]
	}
	// Empty tensors occupy no bytes and cannot collide with anything.
	order := make([]int, 0, len(f.tensors))
	for i, t := range f.tensors {
		if t.Size > 0 {
			order = append(order, i)
		}
	}
	sort.Slice(order, func(a, b int) bool { return f.tensors[order[a]].Offset < f.tensors[order[b]].Offset })
	for k := 1; k < len(order); k++ {
		p, q := f.tensors[order[k-1]], f.tensors[order[k]]
		if p.Offset+p.Size > q.Offset {
			return fmt.Errorf("tensors %q and %q overlap", p.Name, q.Name)
		}
	}
	return nil
}
