package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"os"
	"path/filepath"
	"sort"

	"github.com/dflash/dflash_server/sdk/gguf/quant"
	"github.com/dflash/dflash_server/sdk/internal/mmap"
	"github.com/hashicorp/go-multierror"
)

// maxHeader bounds the JSON header, as the reference implementation does.
const maxHeader = 100 << 20

var dtypeSizes = map[string]int{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
	"U16": 2, "I16": 2, "F16": 2, "BF16": 2,
	"U32": 4, "I32": 4, "F32": 4,
	"U64": 8, "I64": 8, "F64": 8,
}

// Tensor is one tensor of a checkpoint.
type Tensor struct {
	Name  string
	DType string
	// Shape is in PyTorch order (outermost first).
	Shape []int64
	data  []byte
}

// Elements is the number of elements.
func (t *Tensor) Elements() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// Data returns the raw little-endian bytes (a slice of the mapping).
func (t *Tensor) Data() []byte { return t.data }

// ReadFloat32 decodes elements [start, start+len(dst)) in row-major order to
// float32. Float tensors (F32, F16, BF16, F64) and integer tables (I64, I32,
// I16, I8, U8: ids and the like, exact below 2^24) can be decoded.
func (t *Tensor) ReadFloat32(start int64, dst []float32) error {
	size, ok := readSizes[t.DType]
	if !ok {
		return fmt.Errorf("tensor %q has dtype %s; only F32, F16, BF16, F64 and integer tensors can be read as floats", t.Name, t.DType)
	}
	if start < 0 || start+int64(len(dst)) > t.Elements() {
		return fmt.Errorf("tensor %q: elements [%d, %d) out of range (%d elements)", t.Name, start, start+int64(len(dst)), t.Elements())
	}
	b := t.data[start*int64(size):]
	le := binary.LittleEndian
	switch t.DType {
	case "F32":
		for i := range dst {
			dst[i] = math.Float32frombits(le.Uint32(b[4*i:]))
		}
	case "F16":
		for i := range dst {
			dst[i] = quant.F16ToF32(le.Uint16(b[2*i:]))
		}
	case "BF16":
		for i := range dst {
			dst[i] = quant.BF16ToF32(le.Uint16(b[2*i:]))
		}
	case "F64":
		for i := range dst {
			dst[i] = float32(math.Float64frombits(le.Uint64(b[8*i:])))
		}
	case "I64":
		for i := range dst {
			dst[i] = float32(int64(le.Uint64(b[8*i:])))
		}
	case "I32":
		for i := range dst {
			dst[i] = float32(int32(le.Uint32(b[4*i:])))
		}
	case "I16":
		for i := range dst {
			dst[i] = float32(int16(le.Uint16(b[2*i:])))
		}
	case "I8":
		for i := range dst {
			dst[i] = float32(int8(b[i]))
		}
	case "U8":
		for i := range dst {
			dst[i] = float32(b[i])
		}
	}
	return nil
}

// floatSizes are the float dtypes; readSizes adds the integer ones
// ReadFloat32 also decodes.
var (
	floatSizes = map[string]int{"F32": 4, "F16": 2, "BF16": 2, "F64": 8}
	readSizes  = map[string]int{"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1}
)

// IsFloat reports whether a dtype holds floating-point values.
func IsFloat(dtype string) bool {
	_, ok := floatSizes[dtype]
	return ok
}

// Float32 decodes the whole tensor.
func (t *Tensor) Float32() ([]float32, error) {
	out := make([]float32, t.Elements())
	return out, t.ReadFloat32(0, out)
}

// Checkpoint is a set of tensors from one or more .safetensors files.
type Checkpoint struct {
	tensors  map[string]*Tensor
	metadata map[string]string
	unmaps   []func() error
}

// Open opens a .safetensors file, or a folder holding a checkpoint (see the
// package comment).
func Open(path string) (*Checkpoint, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("open safetensors: %w", err)
	}
	if !st.IsDir() {
		c := &Checkpoint{tensors: map[string]*Tensor{}}
		if err := c.addFile(path); err != nil {
			return nil, err
		}
		return c, nil
	}
	files, err := shardFiles(path)
	if err != nil {
		return nil, err
	}
	c := &Checkpoint{tensors: map[string]*Tensor{}}
	for _, f := range files {
		if err := c.addFile(f); err != nil {
			_ = c.Close()
			return nil, err
		}
	}
	if err := c.checkIndex(path); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// shardFiles lists a folder's checkpoint files.
func shardFiles(dir string) ([]string, error) {
	idx := filepath.Join(dir, "model.safetensors.index.json")
	if b, err := os.ReadFile(idx); err == nil {
		var ix struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(b, &ix); err != nil {
			return nil, fmt.Errorf("read %s: %w", idx, err)
		}
		seen := map[string]bool{}
		var files []string
		for _, f := range ix.WeightMap {
			if !seen[f] {
				seen[f] = true
				files = append(files, filepath.Join(dir, filepath.Clean("/" + f)[1:]))
			}
		}
		sort.Strings(files)
		if len(files) == 0 {
			return nil, fmt.Errorf("%s lists no tensors", idx)
		}
		return files, nil
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no .safetensors files in %s", dir)
	}
	sort.Strings(files)
	return files, nil
}

// checkIndex verifies that every tensor the index names is present.
func (c *Checkpoint) checkIndex(dir string) error {
	idx := filepath.Join(dir, "model.safetensors.index.json")
	b, err := os.ReadFile(idx)
	if err != nil {
		return nil
	}
	var ix struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(b, &ix); err != nil {
		return fmt.Errorf("read %s: %w", idx, err)
	}
	var errs *multierror.Error
	for name, file := range ix.WeightMap {
		if _, ok := c.tensors[name]; !ok {
			errs = multierror.Append(errs, fmt.Errorf("tensor %q listed in %s is missing from %s", name, filepath.Base(idx), file))
		}
	}
	return errs.ErrorOrNil()
}

func (c *Checkpoint) addFile(path string) error {
	fd, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open safetensors: %w", err)
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return fmt.Errorf("open safetensors %s: %w", path, err)
	}
	data, unmap, err := mmap.File(fd, st.Size())
	if err != nil {
		return fmt.Errorf("open safetensors %s: %w", path, err)
	}
	ts, md, err := parse(data)
	if err != nil {
		_ = unmap()
		return fmt.Errorf("open safetensors %s: %w", path, err)
	}
	c.unmaps = append(c.unmaps, unmap)
	for _, t := range ts {
		if _, dup := c.tensors[t.Name]; dup {
			return fmt.Errorf("open safetensors %s: tensor %q is also in another shard", path, t.Name)
		}
		c.tensors[t.Name] = t
	}
	if c.metadata == nil {
		c.metadata = md
	}
	return nil
}

// Parse reads a checkpoint held in memory; tensors refer to b.
func Parse(b []byte) (*Checkpoint, error) {
	ts, md, err := parse(b)
	if err != nil {
		return nil, fmt.Errorf("parse safetensors: %w", err)
	}
	c := &Checkpoint{tensors: map[string]*Tensor{}, metadata: md}
	for _, t := range ts {
		c.tensors[t.Name] = t
	}
	return c, nil
}

type headerEntry struct {
	DType       string   `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets []uint64 `json:"data_offsets"`
}

func parse(b []byte) ([]*Tensor, map[string]string, error) {
	if len(b) < 8 {
		return nil, nil, fmt.Errorf("file of %d bytes is too short for a safetensors header", len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > maxHeader {
		return nil, nil, fmt.Errorf("header length %d exceeds the %d-byte limit", n, maxHeader)
	}
	if n > uint64(len(b)-8) {
		return nil, nil, fmt.Errorf("header length %d exceeds the %d bytes after it", n, len(b)-8)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &raw); err != nil {
		return nil, nil, fmt.Errorf("header: %w", err)
	}
	data := b[8+n:]
	var md map[string]string
	var ts []*Tensor
	var errs *multierror.Error
	for name, r := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(r, &md); err != nil {
				errs = multierror.Append(errs, fmt.Errorf("__metadata__: %w", err))
			}
			continue
		}
		t, err := tensorFrom(name, r, data)
		if err != nil {
			errs = multierror.Append(errs, err)
			continue
		}
		ts = append(ts, t)
	}
	if err := errs.ErrorOrNil(); err != nil {
		return nil, nil, err
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	return ts, md, nil
}

func tensorFrom(name string, r json.RawMessage, data []byte) (*Tensor, error) {
	var e headerEntry
	if err := json.Unmarshal(r, &e); err != nil {
		return nil, fmt.Errorf("tensor %q: %w", name, err)
	}
	size, ok := dtypeSizes[e.DType]
	if !ok {
		return nil, fmt.Errorf("tensor %q: unknown dtype %q", name, e.DType)
	}
	if len(e.DataOffsets) != 2 {
		return nil, fmt.Errorf("tensor %q: data_offsets has %d entries, want 2", name, len(e.DataOffsets))
	}
	n := uint64(1)
	for _, d := range e.Shape {
		if d < 0 {
			return nil, fmt.Errorf("tensor %q: negative dimension in shape %v", name, e.Shape)
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > 1<<60 {
			return nil, fmt.Errorf("tensor %q: shape %v is too large", name, e.Shape)
		}
		n = lo
	}
	begin, end := e.DataOffsets[0], e.DataOffsets[1]
	switch {
	case begin > end || end > uint64(len(data)):
		return nil, fmt.Errorf("tensor %q: data_offsets [%d, %d] outside the %d data bytes", name, begin, end, len(data))
	case end-begin != n*uint64(size):
		return nil, fmt.Errorf("tensor %q: %d bytes for shape %v of %s, want %d", name, end-begin, e.Shape, e.DType, n*uint64(size))
	}
	return &Tensor{Name: name, DType: e.DType, Shape: e.Shape, data: data[begin:end:end]}, nil
}

// Tensor returns the named tensor.
func (c *Checkpoint) Tensor(name string) (*Tensor, bool) {
	t, ok := c.tensors[name]
	return t, ok
}

// Names lists the tensor names in sorted order.
func (c *Checkpoint) Names() []string {
	out := make([]string, 0, len(c.tensors))
	for n := range c.tensors {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Metadata is the first file's __metadata__ map (may be nil).
func (c *Checkpoint) Metadata() map[string]string { return c.metadata }

// Close unmaps the files; tensor data must not be used after.
func (c *Checkpoint) Close() error {
	var errs *multierror.Error
	for _, u := range c.unmaps {
		if err := u(); err != nil {
			errs = multierror.Append(errs, err)
		}
	}
	c.unmaps = nil
	return errs.ErrorOrNil()
}
