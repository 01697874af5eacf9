package gguf

import (
	"fmt"
	"math"
	"strconv"
)

func (f *File) entry(key string) (*kvEntry, error) {
	i, ok := f.kvIndex[key]
	if !ok {
		return nil, fmt.Errorf("missing key %q", key)
	}
	return &f.kvs[i], nil
}

// TypeName describes a record's type: "uint32", "array[string]", ...
func (kv KV) TypeName() string {
	if kv.Type == ValueArray {
		return "array[" + kv.ElemType.String() + "]"
	}
	return kv.Type.String()
}

func wrongType(e *kvEntry, want string) error {
	return fmt.Errorf("key %q has type %s, want %s", e.Key, e.TypeName(), want)
}

// String returns a string value.
func (f *File) String(key string) (string, error) {
	e, err := f.entry(key)
	if err != nil {
		return "", err
	}
	s, ok := e.val.(string)
	if !ok {
		return "", wrongType(e, "string")
	}
	return s, nil
}

// Bool returns a bool value.
func (f *File) Bool(key string) (bool, error) {
	e, err := f.entry(key)
	if err != nil {
		return false, err
	}
	b, ok := e.val.(bool)
	if !ok {
		return false, wrongType(e, "bool")
	}
	return b, nil
}

// integer is a metadata integer of any width: magnitude and sign.
type integer struct {
	mag uint64
	neg bool
}

func (n integer) String() string {
	if n.neg {
		return "-" + strconv.FormatUint(n.mag, 10)
	}
	return strconv.FormatUint(n.mag, 10)
}

func signed(v int64) integer {
	if v < 0 {
		return integer{mag: uint64(-(v + 1)) + 1, neg: true}
	}
	return integer{mag: uint64(v)}
}

func asInteger(v any) (integer, bool) {
	switch x := v.(type) {
	case uint8:
		return integer{mag: uint64(x)}, true
	case uint16:
		return integer{mag: uint64(x)}, true
	case uint32:
		return integer{mag: uint64(x)}, true
	case uint64:
		return integer{mag: x}, true
	case int8:
		return signed(int64(x)), true
	case int16:
		return signed(int64(x)), true
	case int32:
		return signed(int64(x)), true
	case int64:
		return signed(x), true
	}
	return integer{}, false
}

// fit checks n against [-negMax, posMax].
func (n integer) fit(negMax, posMax uint64) bool {
	if n.neg {
		return n.mag <= negMax
	}
	return n.mag <= posMax
}

func (n integer) int64() int64 {
	if n.neg {
		return -int64(n.mag-1) - 1
	}
	return int64(n.mag)
}

func (f *File) integer(key, want string, negMax, posMax uint64) (integer, error) {
	e, err := f.entry(key)
	if err != nil {
		return integer{}, err
	}
	n, ok := asInteger(e.val)
	if !ok {
		return integer{}, wrongType(e, want)
	}
	if !n.fit(negMax, posMax) {
		return integer{}, fmt.Errorf("key %q value %s does not fit %s", key, n, want)
	}
	return n, nil
}

// Uint32 returns an integer value of any width that fits a uint32.
func (f *File) Uint32(key string) (uint32, error) {
	n, err := f.integer(key, "uint32", 0, math.MaxUint32)
	return uint32(n.mag), err
}

// Uint64 returns a non-negative integer value of any width.
func (f *File) Uint64(key string) (uint64, error) {
	n, err := f.integer(key, "uint64", 0, math.MaxUint64)
	return n.mag, err
}

// Int32 returns an integer value of any width that fits an int32.
func (f *File) Int32(key string) (int32, error) {
	n, err := f.integer(key, "int32", 1<<31, math.MaxInt32)
	return int32(n.int64()), err
}

// Int64 returns an integer value of any width that fits an int64.
func (f *File) Int64(key string) (int64, error) {
	n, err := f.integer(key, "int64", 1<<63, math.MaxInt64)
	return n.int64(), err
}

func asFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case float32:
		return float64(x), true
	case float64:
		return x, true
	}
	if n, ok := asInteger(v); ok {
		if n.neg {
			return -float64(n.mag), true
		}
		return float64(n.mag), true
	}
	return 0, false
}

// Float32 returns a float32, float64 or integer value as a float32.
func (f *File) Float32(key string) (float32, error) {
	v, err := f.Float64(key)
	return float32(v), err
}

// Float64 returns a float32, float64 or integer value as a float64.
func (f *File) Float64(key string) (float64, error) {
	e, err := f.entry(key)
	if err != nil {
		return 0, err
	}
	v, ok := asFloat(e.val)
	if !ok {
		return 0, wrongType(e, "float")
	}
	return v, nil
}

func (f *File) array(key, want string) (*kvEntry, any, error) {
	e, err := f.entry(key)
	if err != nil {
		return nil, nil, err
	}
	if e.Type != ValueArray {
		return nil, nil, wrongType(e, want)
	}
	v, ok := f.Meta(key)
	if !ok {
		return nil, nil, fmt.Errorf("key %q: file is closed", key)
	}
	return e, v, nil
}

// Strings returns an array of strings.
func (f *File) Strings(key string) ([]string, error) {
	e, v, err := f.array(key, "array[string]")
	if err != nil {
		return nil, err
	}
	s, ok := v.([]string)
	if !ok {
		return nil, wrongType(e, "array[string]")
	}
	return s, nil
}

// integers converts an integer array of any element type.
func integers(v any) ([]integer, bool) {
	var out []integer
	add := func(n int, at func(int) integer) {
		out = make([]integer, n)
		for i := range out {
			out[i] = at(i)
		}
	}
	switch x := v.(type) {
	case []uint8:
		add(len(x), func(i int) integer { return integer{mag: uint64(x[i])} })
	case []uint16:
		add(len(x), func(i int) integer { return integer{mag: uint64(x[i])} })
	case []uint32:
		add(len(x), func(i int) integer { return integer{mag: uint64(x[i])} })
	case []uint64:
		add(len(x), func(i int) integer { return integer{mag: x[i]} })
	case []int8:
		add(len(x), func(i int) integer { return signed(int64(x[i])) })
	case []int16:
		add(len(x), func(i int) integer { return signed(int64(x[i])) })
	case []int32:
		add(len(x), func(i int) integer { return signed(int64(x[i])) })
	case []int64:
		add(len(x), func(i int) integer { return signed(x[i]) })
	default:
		return nil, false
	}
	return out, true
}

func (f *File) intArray(key, elem string, negMax, posMax uint64) ([]integer, error) {
	want := "array[" + elem + "]"
	e, v, err := f.array(key, want)
	if err != nil {
		return nil, err
	}
	ns, ok := integers(v)
	if !ok {
		return nil, wrongType(e, want)
	}
	for i, n := range ns {
		if !n.fit(negMax, posMax) {
			return nil, fmt.Errorf("key %q element %d value %s does not fit %s", key, i, n, elem)
		}
	}
	return ns, nil
}

// Int32s returns an integer array of any element type whose values fit int32.
func (f *File) Int32s(key string) ([]int32, error) {
	ns, err := f.intArray(key, "int32", 1<<31, math.MaxInt32)
	if err != nil {
		return nil, err
	}
	out := make([]int32, len(ns))
	for i, n := range ns {
		out[i] = int32(n.int64())
	}
	return out, nil
}

// Uint32s returns an integer array of any element type whose values fit
// uint32.
func (f *File) Uint32s(key string) ([]uint32, error) {
	ns, err := f.intArray(key, "uint32", 0, math.MaxUint32)
	if err != nil {
		return nil, err
	}
	out := make([]uint32, len(ns))
	for i, n := range ns {
		out[i] = uint32(n.mag)
	}
	return out, nil
}

// Float32s returns a float32 or float64 array as float32.
func (f *File) Float32s(key string) ([]float32, error) {
	e, v, err := f.array(key, "array[float32]")
	if err != nil {
		return nil, err
	}
	switch x := v.(type) {
	case []float32:
		return x, nil
	case []float64:
		out := make([]float32, len(x))
		for i, y := range x {
			out[i] = float32(y)
		}
		return out, nil
	}
	return nil, wrongType(e, "array[float32]")
}

// PerLayerUint32 reads a key that is either one integer shared by all n
// layers or an array with one integer per layer (some architectures write
// feed_forward_length or head_count that way), returning n values.
func (f *File) PerLayerUint32(key string, n int) ([]uint32, error) {
	e, err := f.entry(key)
	if err != nil {
		return nil, err
	}
	if e.Type != ValueArray {
		v, err := f.Uint32(key)
		if err != nil {
			return nil, err
		}
		out := make([]uint32, n)
		for i := range out {
			out[i] = v
		}
		return out, nil
	}
	out, err := f.Uint32s(key)
	if err != nil {
		return nil, err
	}
	if len(out) != n {
		return nil, fmt.Errorf("key %q has %d per-layer values, want %d", key, len(out), n)
	}
	return out, nil
}
