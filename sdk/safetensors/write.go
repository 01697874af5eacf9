package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/dflash/dflash_server/sdk/gguf/quant"
)

// NewTensor is a tensor to write.
type NewTensor struct {
	Name  string
	DType string
	Shape []int64
	Data  []byte
}

// FromFloat32 encodes values as an F32, F16 or BF16 tensor.
func FromFloat32(name, dtype string, shape []int64, values []float32) (NewTensor, error) {
	size, ok := floatSizes[dtype]
	if !ok || dtype == "F64" {
		return NewTensor{}, fmt.Errorf("tensor %q: cannot encode floats as %s", name, dtype)
	}
	b := make([]byte, len(values)*size)
	le := binary.LittleEndian
	for i, v := range values {
		switch dtype {
		case "F32":
			le.PutUint32(b[4*i:], math.Float32bits(v))
		case "F16":
			le.PutUint16(b[2*i:], quant.F32ToF16(v))
		case "BF16":
			le.PutUint16(b[2*i:], quant.F32ToBF16(v))
		}
	}
	return NewTensor{Name: name, DType: dtype, Shape: shape, Data: b}, nil
}

// Write writes tensors (in the given order) as one .safetensors file.
func Write(w io.Writer, tensors []NewTensor, metadata map[string]string) error {
	header := map[string]any{}
	if metadata != nil {
		header["__metadata__"] = metadata
	}
	off := uint64(0)
	for _, t := range tensors {
		size, ok := dtypeSizes[t.DType]
		if !ok {
			return fmt.Errorf("tensor %q: unknown dtype %q", t.Name, t.DType)
		}
		n := int64(1)
		for _, d := range t.Shape {
			n *= d
		}
		if int64(len(t.Data)) != n*int64(size) {
			return fmt.Errorf("tensor %q: %d bytes for shape %v of %s, want %d", t.Name, len(t.Data), t.Shape, t.DType, n*int64(size))
		}
		shape := t.Shape
		if shape == nil {
			shape = []int64{}
		}
		header[t.Name] = headerEntry{DType: t.DType, Shape: shape, DataOffsets: []uint64{off, off + uint64(len(t.Data))}}
		off += uint64(len(t.Data))
	}
	hb, err := json.Marshal(header)
	if err != nil {
		return err
	}
	for len(hb)%8 != 0 { // the reference writer pads the header with spaces
		hb = append(hb, ' ')
	}
	if _, err := w.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(hb)))); err != nil {
		return err
	}
	if _, err := w.Write(hb); err != nil {
		return err
	}
	for _, t := range tensors {
		if _, err := w.Write(t.Data); err != nil {
			return err
		}
	}
	return nil
}

// WriteFile writes tensors to path.
func WriteFile(path string, tensors []NewTensor, metadata map[string]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := Write(f, tensors, metadata); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
