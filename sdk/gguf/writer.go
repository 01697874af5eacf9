package gguf

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
)

// Writer streams a GGUF v3 file. Call AddKV and AddTensor for everything the
// file holds, then WriteTensor (or WriteTensorData) once per tensor in the
// order the tensors were added, then Close. The header is written on the
// first WriteTensor; tensor offsets follow from the declared shapes, so no
// tensor has to be in memory whole.
//
// Tensors are laid out contiguously, each padded to the alignment, which is
// the layout ggml and llama.cpp require.
type Writer struct {
	w         *bufio.Writer
	file      *os.File // set by Create; closed by Close
	alignment uint64
	kv        bytes.Buffer
	nKV       uint64
	keys      map[string]bool
	tensors   []wTensor
	names     map[string]bool
	started   bool // header written
	next      int  // index of the next tensor to write
	pos       uint64
	err       error // sticky: after a failed write the file is unusable
}

type wTensor struct {
	name string
	typ  Type
	dims []uint64
	size uint64
}

// NewWriter writes a GGUF file to w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{
		w:         bufio.NewWriterSize(w, 1<<20),
		alignment: DefaultAlignment,
		keys:      map[string]bool{},
		names:     map[string]bool{},
	}
}

// Create creates (or truncates) path and writes a GGUF file to it; Close
// closes the file.
func Create(path string) (*Writer, error) {
	fd, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("create gguf: %w", err)
	}
	w := NewWriter(fd)
	w.file = fd
	return w, nil
}

var errStarted = errors.New("header already written: add metadata and tensors before writing tensor data")

// AddKV adds a metadata record. value's Go type selects the GGUF type:
// string, bool, uint8, int8, uint16, int16, uint32, int32, uint64, int64,
// float32, float64, or a slice of one of them for an array. int and uint are
// refused because their width is not part of the format.
func (w *Writer) AddKV(key string, value any) error {
	if w.started {
		return fmt.Errorf("add key %q: %w", key, errStarted)
	}
	if err := checkKey(key); err != nil {
		return err
	}
	if w.keys[key] {
		return fmt.Errorf("duplicate metadata key %q", key)
	}
	if key == KeyAlignment {
		a, ok := value.(uint32)
		if !ok {
			return fmt.Errorf("key %q must be a uint32, got %T", key, value)
		}
		if a == 0 || a&(a-1) != 0 {
			return fmt.Errorf("key %q = %d is not a power of two", key, a)
		}
		w.alignment = uint64(a)
	}
	var rec bytes.Buffer
	putString(&rec, key)
	if err := encodeValue(&rec, value); err != nil {
		return fmt.Errorf("key %q: %w", key, err)
	}
	w.kv.Write(rec.Bytes())
	w.keys[key] = true
	w.nKV++
	return nil
}

func checkKey(key string) error {
	if key == "" {
		return errors.New("empty metadata key")
	}
	if len(key) > math.MaxUint16 {
		return fmt.Errorf("metadata key %.40q... is %d bytes long, at most %d allowed", key, len(key), math.MaxUint16)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c >= 0x80 || c < 0x20 {
			return fmt.Errorf("metadata key %q is not printable ASCII", key)
		}
	}
	return nil
}

// AddTensor declares a tensor; dims are in ggml order (ne0 first).
func (w *Writer) AddTensor(name string, t Type, dims []uint64) error {
	if w.started {
		return fmt.Errorf("add tensor %q: %w", name, errStarted)
	}
	switch {
	case name == "":
		return errors.New("empty tensor name")
	case len(name) > maxNameLen:
		return fmt.Errorf("tensor name %q is %d bytes long, at most %d allowed", name, len(name), maxNameLen)
	case w.names[name]:
		return fmt.Errorf("duplicate tensor name %q", name)
	}
	size, err := TensorBytes(t, dims)
	if err != nil {
		return fmt.Errorf("tensor %q: %w", name, err)
	}
	w.names[name] = true
	w.tensors = append(w.tensors, wTensor{name: name, typ: t, dims: append([]uint64(nil), dims...), size: size})
	return nil
}

// TensorSize is the byte size of a declared tensor.
func (w *Writer) TensorSize(name string) (uint64, bool) {
	for _, t := range w.tensors {
		if t.name == name {
			return t.size, true
		}
	}
	return 0, false
}

func (w *Writer) write(p []byte) error {
	if w.err != nil {
		return w.err
	}
	n, err := w.w.Write(p)
	w.pos += uint64(n)
	if err != nil {
		w.err = fmt.Errorf("write gguf: %w", err)
	}
	return w.err
}

func (w *Writer) pad() error {
	var zero [64]byte
	for n := alignUp(w.pos, w.alignment) - w.pos; n > 0; {
		k := min(n, uint64(len(zero)))
		if err := w.write(zero[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

func (w *Writer) writeHeader() error {
	w.started = true
	var h bytes.Buffer
	h.WriteString(Magic)
	le := binary.LittleEndian
	h.Write(le.AppendUint32(nil, 3))
	h.Write(le.AppendUint64(nil, uint64(len(w.tensors))))
	h.Write(le.AppendUint64(nil, w.nKV))
	if err := w.write(h.Bytes()); err != nil {
		return err
	}
	if err := w.write(w.kv.Bytes()); err != nil {
		return err
	}
	w.kv = bytes.Buffer{}
	off := uint64(0)
	for _, t := range w.tensors {
		h.Reset()
		putString(&h, t.name)
		h.Write(le.AppendUint32(nil, uint32(len(t.dims))))
		for _, d := range t.dims {
			h.Write(le.AppendUint64(nil, d))
		}
		h.Write(le.AppendUint32(nil, uint32(t.typ)))
		h.Write(le.AppendUint64(nil, off))
		if err := w.write(h.Bytes()); err != nil {
			return err
		}
		off += alignUp(t.size, w.alignment)
	}
	return w.pad()
}

// WriteTensor writes the next tensor's data: fn must write exactly its byte
// size to the io.Writer it is given. Tensors are written in the order they
// were added.
func (w *Writer) WriteTensor(name string, fn func(io.Writer) error) error {
	if w.err != nil {
		return w.err
	}
	if w.next >= len(w.tensors) {
		if w.names[name] {
			return fmt.Errorf("tensor %q written twice", name)
		}
		return fmt.Errorf("tensor %q was not declared", name)
	}
	t := w.tensors[w.next]
	if t.name != name {
		if !w.names[name] {
			return fmt.Errorf("tensor %q was not declared", name)
		}
		return fmt.Errorf("tensor %q written out of order: the next tensor is %q", name, t.name)
	}
	if !w.started {
		if err := w.writeHeader(); err != nil {
			return err
		}
	}
	tw := &tensorWriter{w: w, left: t.size}
	if err := fn(tw); err != nil {
		w.err = fmt.Errorf("write tensor %q: %w", name, err)
		return w.err
	}
	if tw.left != 0 {
		w.err = fmt.Errorf("write tensor %q: %d of %d bytes written", name, t.size-tw.left, t.size)
		return w.err
	}
	w.next++
	return w.pad()
}

// WriteTensorData writes the next tensor's data from one slice.
func (w *Writer) WriteTensorData(name string, data []byte) error {
	return w.WriteTensor(name, func(tw io.Writer) error {
		_, err := tw.Write(data)
		return err
	})
}

type tensorWriter struct {
	w    *Writer
	left uint64
}

func (t *tensorWriter) Write(p []byte) (int, error) {
	if uint64(len(p)) > t.left {
		return 0, fmt.Errorf("%d bytes written past the tensor's end", uint64(len(p))-t.left)
	}
	if err := t.w.write(p); err != nil {
		return 0, err
	}
	t.left -= uint64(len(p))
	return len(p), nil
}

// Close writes the header if no tensor was written, flushes, and closes the
// file opened by Create. It fails if a declared tensor was not written.
func (w *Writer) Close() error {
	err := w.finish()
	if w.file != nil {
		if cerr := w.file.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close gguf: %w", cerr)
		}
		w.file = nil
	}
	return err
}

func (w *Writer) finish() error {
	if w.err != nil {
		return w.err
	}
	if !w.started {
		if err := w.writeHeader(); err != nil {
			return err
		}
	}
	if w.next < len(w.tensors) {
		w.err = fmt.Errorf("tensor %q was declared but never written", w.tensors[w.next].name)
		return w.err
	}
	if err := w.w.Flush(); err != nil {
		w.err = fmt.Errorf("write gguf: %w", err)
		return w.err
	}
	return nil
}

func putString(b *bytes.Buffer, s string) {
	b.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(s))))
	b.WriteString(s)
}

func putType(b *bytes.Buffer, t ValueType) {
	b.Write(binary.LittleEndian.AppendUint32(nil, uint32(t)))
}

func putArrayHeader(b *bytes.Buffer, et ValueType, n int) {
	putType(b, ValueArray)
	putType(b, et)
	b.Write(binary.LittleEndian.AppendUint64(nil, uint64(n)))
}

// encodeValue appends a value's type id and encoding.
func encodeValue(b *bytes.Buffer, v any) error {
	le := binary.LittleEndian
	boolByte := func(x bool) byte {
		if x {
			return 1
		}
		return 0
	}
	switch x := v.(type) {
	case string:
		putType(b, ValueString)
		putString(b, x)
	case bool:
		putType(b, ValueBool)
		b.WriteByte(boolByte(x))
	case uint8:
		putType(b, ValueUint8)
		b.WriteByte(x)
	case int8:
		putType(b, ValueInt8)
		b.WriteByte(byte(x))
	case uint16:
		putType(b, ValueUint16)
		b.Write(le.AppendUint16(nil, x))
	case int16:
		putType(b, ValueInt16)
		b.Write(le.AppendUint16(nil, uint16(x)))
	case uint32:
		putType(b, ValueUint32)
		b.Write(le.AppendUint32(nil, x))
	case int32:
		putType(b, ValueInt32)
		b.Write(le.AppendUint32(nil, uint32(x)))
	case float32:
		putType(b, ValueFloat32)
		b.Write(le.AppendUint32(nil, math.Float32bits(x)))
	case uint64:
		putType(b, ValueUint64)
		b.Write(le.AppendUint64(nil, x))
	case int64:
		putType(b, ValueInt64)
		b.Write(le.AppendUint64(nil, uint64(x)))
	case float64:
		putType(b, ValueFloat64)
		b.Write(le.AppendUint64(nil, math.Float64bits(x)))
	case []string:
		putArrayHeader(b, ValueString, len(x))
		for _, s := range x {
			putString(b, s)
		}
	case []bool:
		putArrayHeader(b, ValueBool, len(x))
		for _, y := range x {
			b.WriteByte(boolByte(y))
		}
	case []uint8:
		putArrayHeader(b, ValueUint8, len(x))
		b.Write(x)
	case []int8:
		putArrayHeader(b, ValueInt8, len(x))
		for _, y := range x {
			b.WriteByte(byte(y))
		}
	case []uint16:
		putArrayHeader(b, ValueUint16, len(x))
		for _, y := range x {
			b.Write(le.AppendUint16(nil, y))
		}
	case []int16:
		putArrayHeader(b, ValueInt16, len(x))
		for _, y := range x {
			b.Write(le.AppendUint16(nil, uint16(y)))
		}
	case []uint32:
		putArrayHeader(b, ValueUint32, len(x))
		for _, y := range x {
			b.Write(le.AppendUint32(nil, y))
		}
	case []int32:
		putArrayHeader(b, ValueInt32, len(x))
		for _, y := range x {
			b.Write(le.AppendUint32(nil, uint32(y)))
		}
	case []float32:
		putArrayHeader(b, ValueFloat32, len(x))
		for _, y := range x {
			b.Write(le.AppendUint32(nil, math.Float32bits(y)))
		}
	case []uint64:
		putArrayHeader(b, ValueUint64, len(x))
		for _, y := range x {
			b.Write(le.AppendUint64(nil, y))
		}
	case []int64:
		putArrayHeader(b, ValueInt64, len(x))
		for _, y := range x {
			b.Write(le.AppendUint64(nil, uint64(y)))
		}
	case []float64:
		putArrayHeader(b, ValueFloat64, len(x))
		for _, y := range x {
			b.Write(le.AppendUint64(nil, math.Float64bits(y)))
		}
	case int, uint, []int, []uint:
		return fmt.Errorf("a value of Go type %T has no fixed GGUF width; use int32, uint32, int64 or uint64", v)
	default:
		return fmt.Errorf("unsupported Go type %T", v)
	}
	return nil
}
