package tokenizer

import (
	"fmt"
	"math"
)

// metadata reads GGUF metadata values leniently: scalars of any integer
// type, arrays of any integer type or []any.
type metadata struct {
	get func(key string) (any, bool)
}

func (m metadata) str(key string) (string, bool, error) {
	v, ok := m.get(key)
	if !ok {
		return "", false, nil
	}
	s, isStr := v.(string)
	if !isStr {
		return "", false, fmt.Errorf("%s: want a string, got %T", key, v)
	}
	return s, true, nil
}

func (m metadata) strs(key string) ([]string, bool, error) {
	v, ok := m.get(key)
	if !ok {
		return nil, false, nil
	}
	switch a := v.(type) {
	case []string:
		return a, true, nil
	case []any:
		out := make([]string, len(a))
		for i, e := range a {
			s, isStr := e.(string)
			if !isStr {
				return nil, false, fmt.Errorf("%s[%d]: want a string, got %T", key, i, e)
			}
			out[i] = s
		}
		return out, true, nil
	}
	return nil, false, fmt.Errorf("%s: want an array of strings, got %T", key, v)
}

func toInt64(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint:
		return int64(x), true
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint64:
		if x > math.MaxInt64 {
			return 0, false
		}
		return int64(x), true
	case float64: // JSON numbers
		if x != math.Trunc(x) || math.Abs(x) > 1<<53 {
			return 0, false
		}
		return int64(x), true
	}
	return 0, false
}

func intsOf[T int | int8 | int16 | int32 | int64 | uint | uint8 | uint16 | uint32 | uint64](a []T) []int64 {
	out := make([]int64, len(a))
	for i, v := range a {
		out[i] = int64(v)
	}
	return out
}

func (m metadata) ints(key string) ([]int64, bool, error) {
	v, ok := m.get(key)
	if !ok {
		return nil, false, nil
	}
	switch a := v.(type) {
	case []int32:
		return intsOf(a), true, nil
	case []uint32:
		return intsOf(a), true, nil
	case []int64:
		return intsOf(a), true, nil
	case []uint64:
		return intsOf(a), true, nil
	case []int:
		return intsOf(a), true, nil
	case []uint:
		return intsOf(a), true, nil
	case []int8:
		return intsOf(a), true, nil
	case []uint8:
		return intsOf(a), true, nil
	case []int16:
		return intsOf(a), true, nil
	case []uint16:
		return intsOf(a), true, nil
	case []any:
		out := make([]int64, len(a))
		for i, e := range a {
			x, isInt := toInt64(e)
			if !isInt {
				return nil, false, fmt.Errorf("%s[%d]: want an integer, got %T", key, i, e)
			}
			out[i] = x
		}
		return out, true, nil
	}
	return nil, false, fmt.Errorf("%s: want an array of integers, got %T", key, v)
}

// id reads a token id and checks it against the vocabulary size.
func (m metadata) id(key string, n int) (int32, bool, error) {
	v, ok := m.get(key)
	if !ok {
		return 0, false, nil
	}
	x, isInt := toInt64(v)
	if !isInt {
		return 0, false, fmt.Errorf("%s: want an integer token id, got %T", key, v)
	}
	if x < 0 || x >= int64(n) {
		return 0, false, fmt.Errorf("%s = %d: out of range (vocabulary has %d tokens)", key, x, n)
	}
	return int32(x), true, nil
}

func (m metadata) boolean(key string) (bool, bool, error) {
	v, ok := m.get(key)
	if !ok {
		return false, false, nil
	}
	b, isBool := v.(bool)
	if !isBool {
		return false, false, fmt.Errorf("%s: want a bool, got %T", key, v)
	}
	return b, true, nil
}
