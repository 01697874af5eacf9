package gguf

import (
	"fmt"
	"math/bits"
	"strings"
)

// Type is a ggml tensor element type, as stored in a tensor-info record.
type Type uint32

// ggml type ids. The ids are stable; gaps are ids that ggml removed.
const (
	F32     Type = 0
	F16     Type = 1
	Q4_0    Type = 2
	Q4_1    Type = 3
	Q5_0    Type = 6
	Q5_1    Type = 7
	Q8_0    Type = 8
	Q8_1    Type = 9
	Q2_K    Type = 10
	Q3_K    Type = 11
	Q4_K    Type = 12
	Q5_K    Type = 13
	Q6_K    Type = 14
	Q8_K    Type = 15
	IQ2_XXS Type = 16
	IQ2_XS  Type = 17
	IQ3_XXS Type = 18
	IQ1_S   Type = 19
	IQ4_NL  Type = 20
	IQ3_S   Type = 21
	IQ2_S   Type = 22
	IQ4_XS  Type = 23
	I8      Type = 24
	I16     Type = 25
	I32     Type = 26
	I64     Type = 27
	F64     Type = 28
	IQ1_M   Type = 29
	BF16    Type = 30
	TQ1_0   Type = 34
	TQ2_0   Type = 35
	MXFP4   Type = 39
	NVFP4   Type = 40
	Q1_0    Type = 41
	Q2_0    Type = 42
)

type typeTraits struct {
	name      string
	blockSize int // elements per block; 0 for ids that are removed or unknown
	typeSize  int // bytes per block
}

// typeTable follows ggml's type traits. Removed ids keep their historical
// names so an error can say which one a file used.
var typeTable = [...]typeTraits{
	F32:     {"F32", 1, 4},
	F16:     {"F16", 1, 2},
	Q4_0:    {"Q4_0", 32, 18},
	Q4_1:    {"Q4_1", 32, 20},
	4:       {"Q4_2", 0, 0},
	5:       {"Q4_3", 0, 0},
	Q5_0:    {"Q5_0", 32, 22},
	Q5_1:    {"Q5_1", 32, 24},
	Q8_0:    {"Q8_0", 32, 34},
	Q8_1:    {"Q8_1", 32, 36},
	Q2_K:    {"Q2_K", 256, 84},
	Q3_K:    {"Q3_K", 256, 110},
	Q4_K:    {"Q4_K", 256, 144},
	Q5_K:    {"Q5_K", 256, 176},
	Q6_K:    {"Q6_K", 256, 210},
	Q8_K:    {"Q8_K", 256, 292},
	IQ2_XXS: {"IQ2_XXS", 256, 66},
	IQ2_XS:  {"IQ2_XS", 256, 74},
	IQ3_XXS: {"IQ3_XXS", 256, 98},
	IQ1_S:   {"IQ1_S", 256, 50},
	IQ4_NL:  {"IQ4_NL", 32, 18},
	IQ3_S:   {"IQ3_S", 256, 110},
	IQ2_S:   {"IQ2_S", 256, 82},
	IQ4_XS:  {"IQ4_XS", 256, 136},
	I8:      {"I8", 1, 1},
	I16:     {"I16", 1, 2},
	I32:     {"I32", 1, 4},
	I64:     {"I64", 1, 8},
	F64:     {"F64", 1, 8},
	IQ1_M:   {"IQ1_M", 256, 56},
	BF16:    {"BF16", 1, 2},
	31:      {"Q4_0_4_4", 0, 0},
	32:      {"Q4_0_4_8", 0, 0},
	33:      {"Q4_0_8_8", 0, 0},
	TQ1_0:   {"TQ1_0", 256, 54},
	TQ2_0:   {"TQ2_0", 256, 66},
	36:      {"IQ4_NL_4_4", 0, 0},
	37:      {"IQ4_NL_4_8", 0, 0},
	38:      {"IQ4_NL_8_8", 0, 0},
	MXFP4:   {"MXFP4", 32, 17},
	NVFP4:   {"NVFP4", 64, 36},
	Q1_0:    {"Q1_0", 128, 18},
	Q2_0:    {"Q2_0", 64, 18},
}

func (t Type) traits() typeTraits {
	if int(t) < len(typeTable) {
		return typeTable[t]
	}
	return typeTraits{}
}

// String returns ggml's name for the type ("F32", "Q4_K", ...), or
// "type(N)" for an id ggml never defined.
func (t Type) String() string {
	if n := t.traits().name; n != "" {
		return n
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// Valid reports whether t is a type a GGUF file may hold: a defined id that
// has not been removed from the format.
func (t Type) Valid() bool { return t.traits().blockSize > 0 }

// Quantized reports whether t packs several elements per block.
func (t Type) Quantized() bool { return t.traits().blockSize > 1 }

// BlockSize is the number of elements in one block (1 for plain types, 32 or
// 256 for most quantized ones, 0 for an invalid type).
func (t Type) BlockSize() int { return t.traits().blockSize }

// TypeSize is the number of bytes of one block (0 for an invalid type).
func (t Type) TypeSize() int { return t.traits().typeSize }

// RowSize is the number of bytes of n consecutive elements; n must be a
// multiple of BlockSize (CheckRow says whether it is).
func (t Type) RowSize(n uint64) uint64 {
	tr := t.traits()
	if tr.blockSize == 0 {
		return 0
	}
	return n / uint64(tr.blockSize) * uint64(tr.typeSize)
}

// check returns an error for an id that is removed or unknown.
func (t Type) check() error {
	tr := t.traits()
	switch {
	case tr.blockSize > 0:
		return nil
	case tr.name != "":
		return fmt.Errorf("ggml type %s (%d) was removed from the GGUF format", tr.name, uint32(t))
	default:
		return fmt.Errorf("unknown ggml type %d", uint32(t))
	}
}

// ParseType maps a type name ("f16", "Q4_K", "bf16"; case-insensitive) to its
// Type.
func ParseType(name string) (Type, error) {
	for i, tr := range typeTable {
		if tr.blockSize > 0 && strings.EqualFold(tr.name, name) {
			return Type(i), nil
		}
	}
	return 0, fmt.Errorf("unknown ggml type %q", name)
}

// Types lists every valid type in id order.
func Types() []Type {
	var out []Type
	for i, tr := range typeTable {
		if tr.blockSize > 0 {
			out = append(out, Type(i))
		}
	}
	return out
}

// maxDims is ggml's GGML_MAX_DIMS.
const maxDims = 4

// maxNameLen is the longest tensor name ggml accepts (GGML_MAX_NAME is 64
// including the terminating NUL).
const maxNameLen = 63

// TensorBytes computes the size in bytes of a tensor of type t with the given
// ggml dims, checking that the type is valid, there are at most 4 dims, ne0 is
// a multiple of the block size and nothing overflows.
func TensorBytes(t Type, dims []uint64) (uint64, error) {
	if err := t.check(); err != nil {
		return 0, err
	}
	if len(dims) > maxDims {
		return 0, fmt.Errorf("%d dims, at most %d allowed", len(dims), maxDims)
	}
	n, err := elementCount(dims)
	if err != nil {
		return 0, err
	}
	bs := uint64(t.BlockSize())
	if len(dims) > 0 && dims[0]%bs != 0 {
		return 0, fmt.Errorf("ne0 = %d is not a multiple of the %s block size %d", dims[0], t, bs)
	}
	hi, size := bits.Mul64(n/bs, uint64(t.TypeSize()))
	if hi != 0 || size > 1<<62 {
		return 0, fmt.Errorf("byte size of dims %v overflows", dims)
	}
	return size, nil
}

// elementCount multiplies dims, failing past ggml's int64 range.
func elementCount(dims []uint64) (uint64, error) {
	n := uint64(1)
	for _, d := range dims {
		if d > 1<<62 {
			return 0, fmt.Errorf("dimension %d too large", d)
		}
		hi, lo := bits.Mul64(n, d)
		if hi != 0 || lo > 1<<62 {
			return 0, fmt.Errorf("element count of dims %v overflows", dims)
		}
		n = lo
	}
	return n, nil
}

// ValueType is the type id of a metadata value.
type ValueType uint32

// Metadata value type ids.
const (
	ValueUint8   ValueType = 0
	ValueInt8    ValueType = 1
	ValueUint16  ValueType = 2
	ValueInt16   ValueType = 3
	ValueUint32  ValueType = 4
	ValueInt32   ValueType = 5
	ValueFloat32 ValueType = 6
	ValueBool    ValueType = 7
	ValueString  ValueType = 8
	ValueArray   ValueType = 9
	ValueUint64  ValueType = 10
	ValueInt64   ValueType = 11
	ValueFloat64 ValueType = 12
)

var valueNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64", "int64", "float64"}

// fixed byte size of one value; 0 for string and array.
var valueSizes = [...]int{1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8}

func (v ValueType) String() string {
	if int(v) < len(valueNames) {
		return valueNames[v]
	}
	return fmt.Sprintf("value_type(%d)", uint32(v))
}

func (v ValueType) valid() bool { return int(v) < len(valueNames) }
