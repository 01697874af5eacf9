package jinja

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Values are plain Go values with Python meaning:
//
//	nil → None, bool, int64 → int, float64 → float, string → str,
//	List → list, tuple → tuple, *Dict → dict, *namespace, *macro,
//	*loopInfo, builtin, boundMethod, undefined.

// List is a Python list.
type List []any

type tuple []any

// Dict is a Python dict with string keys; it keeps insertion order.
type Dict struct {
	keys []string
	m    map[string]any
}

// NewDict returns an empty dict.
func NewDict() *Dict { return &Dict{m: map[string]any{}} }

// Set sets key, keeping the position of an existing key, like Python.
func (d *Dict) Set(key string, v any) {
	if _, ok := d.m[key]; !ok {
		d.keys = append(d.keys, key)
	}
	d.m[key] = v
}

// Get returns the value of key.
func (d *Dict) Get(key string) (any, bool) {
	v, ok := d.m[key]
	return v, ok
}

// Len is the number of keys.
func (d *Dict) Len() int { return len(d.keys) }

type namespace struct{ d *Dict }

type undefined struct{ name string }

type builtin func(c *ctx, args []any, kwargs map[string]any) (any, error)

type boundMethod struct {
	recv any
	name string
}

// Error kinds, after Jinja's TemplateError (also what raise_exception
// raises), UndefinedError and Python's TypeError.
var (
	ErrTemplate  = errors.New("template error")
	ErrUndefined = errors.New("undefined value")
	ErrType      = errors.New("type error")
)

func undefErr(u undefined) error {
	if u.name == "" {
		return fmt.Errorf("%w: value is undefined", ErrUndefined)
	}
	return fmt.Errorf("%w: '%s' is undefined", ErrUndefined, u.name)
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "NoneType"
	case bool:
		return "bool"
	case int64:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case List:
		return "list"
	case tuple:
		return "tuple"
	case *Dict:
		return "dict"
	case *namespace:
		return "Namespace"
	case undefined:
		return "Undefined"
	}
	return fmt.Sprintf("%T", v)
}

func truthy(v any) bool {
	switch x := v.(type) {
	case nil, undefined:
		return false
	case bool:
		return x
	case int64:
		return x != 0
	case float64:
		return x != 0
	case string:
		return x != ""
	case List:
		return len(x) > 0
	case tuple:
		return len(x) > 0
	case *Dict:
		return x.Len() > 0
	}
	return true
}

// pyStr is Python's str(v); Undefined prints as "".
func pyStr(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case undefined:
		return ""
	case bool:
		if x {
			return "True"
		}
		return "False"
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		return pyFloat(x)
	case string:
		return x
	}
	return pyRepr(v)
}

// pyFloat is Python's repr of a float.
func pyFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64)
	if exp, _ := strconv.Atoi(e[strings.IndexByte(e, 'e')+1:]); exp < -4 || exp >= 16 {
		return e
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}

func pyRepr(v any) string {
	switch x := v.(type) {
	case string:
		return reprString(x)
	case List:
		return "[" + reprItems(x) + "]"
	case tuple:
		if len(x) == 1 {
			return "(" + pyRepr(x[0]) + ",)"
		}
		return "(" + reprItems(x) + ")"
	case *Dict:
		var b strings.Builder
		b.WriteByte('{')
		for i, k := range x.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(reprString(k))
			b.WriteString(": ")
			b.WriteString(pyRepr(x.m[k]))
		}
		b.WriteByte('}')
		return b.String()
	case *namespace:
		return "<Namespace " + pyRepr(x.d) + ">"
	case *macro:
		return "<Macro '" + x.n.name + "'>"
	case undefined:
		return ""
	case builtin, boundMethod:
		return "<built-in function>"
	case *loopInfo:
		return "<LoopContext>"
	case nil, bool, int64, float64:
		return pyStr(v)
	}
	return fmt.Sprintf("<%T>", v)
}

func reprItems(items []any) string {
	var b strings.Builder
	for i, it := range items {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(pyRepr(it))
	}
	return b.String()
}

func reprString(s string) string {
	q := byte('\'')
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		q = '"'
	}
	var b strings.Builder
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case r == rune(q):
			b.WriteByte('\\')
			b.WriteByte(q)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == utf8.RuneError:
			b.WriteRune(r)
		case r == ' ' || unicode.IsPrint(r):
			b.WriteRune(r)
		case r < 0x100:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r < 0x10000:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	b.WriteByte(q)
	return b.String()
}

// number returns v as int or float; bools count as ints, as in Python.
func number(v any) (i int64, f float64, isFloat, ok bool) {
	switch x := v.(type) {
	case bool:
		if x {
			return 1, 1, false, true
		}
		return 0, 0, false, true
	case int64:
		return x, float64(x), false, true
	case float64:
		return 0, x, true, true
	}
	return 0, 0, false, false
}

func pyEqual(a, b any) bool {
	if ai, af, aFloat, ok := number(a); ok {
		bi, bf, bFloat, ok := number(b)
		if !ok {
			return false
		}
		if aFloat || bFloat {
			return af == bf
		}
		return ai == bi
	}
	switch x := a.(type) {
	case nil:
		return b == nil
	case string:
		y, ok := b.(string)
		return ok && x == y
	case undefined:
		_, ok := b.(undefined)
		return ok
	case List:
		y, ok := b.(List)
		return ok && equalSeq(x, y)
	case tuple:
		y, ok := b.(tuple)
		return ok && equalSeq(x, y)
	case *Dict:
		y, ok := b.(*Dict)
		if !ok || x.Len() != y.Len() {
			return false
		}
		for _, k := range x.keys {
			yv, ok := y.m[k]
			if !ok || !pyEqual(x.m[k], yv) {
				return false
			}
		}
		return true
	}
	return a == b
}

func equalSeq(a, b []any) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !pyEqual(a[i], b[i]) {
			return false
		}
	}
	return true
}

// pyLess orders numbers, strings and sequences; anything else is a TypeError.
func pyLess(a, b any) (bool, error) {
	if _, af, aFloat, ok := number(a); ok {
		if _, bf, bFloat, ok := number(b); ok {
			if !aFloat && !bFloat {
				ai, _, _, _ := number(a)
				bi, _, _, _ := number(b)
				return ai < bi, nil
			}
			return af < bf, nil
		}
	}
	switch x := a.(type) {
	case string:
		if y, ok := b.(string); ok {
			return x < y, nil
		}
	case List:
		if y, ok := b.(List); ok {
			return lessSeq(x, y)
		}
	case tuple:
		if y, ok := b.(tuple); ok {
			return lessSeq(x, y)
		}
	}
	return false, fmt.Errorf("%w: '<' not supported between instances of '%s' and '%s'", ErrType, typeName(a), typeName(b))
}

func lessSeq(a, b []any) (bool, error) {
	for i := 0; i < len(a) && i < len(b); i++ {
		if !pyEqual(a[i], b[i]) {
			return pyLess(a[i], b[i])
		}
	}
	return len(a) < len(b), nil
}

// maxRepeat caps "x" * n so a template cannot ask for unbounded memory.
const maxRepeat = 1 << 24

func arith(op string, a, b any) (any, error) {
	if u, ok := a.(undefined); ok {
		return nil, undefErr(u)
	}
	if u, ok := b.(undefined); ok {
		return nil, undefErr(u)
	}
	ai, af, aFloat, aNum := number(a)
	bi, bf, bFloat, bNum := number(b)
	if aNum && bNum {
		useFloat := aFloat || bFloat
		switch op {
		case "+":
			if useFloat {
				return af + bf, nil
			}
			return ai + bi, nil
		case "-":
			if useFloat {
				return af - bf, nil
			}
			return ai - bi, nil
		case "*":
			if useFloat {
				return af * bf, nil
			}
			return ai * bi, nil
		case "/":
			if bf == 0 {
				return nil, fmt.Errorf("%w: division by zero", ErrType)
			}
			return af / bf, nil
		case "//", "%":
			if bf == 0 {
				return nil, fmt.Errorf("%w: division by zero", ErrType)
			}
			if useFloat {
				q := math.Floor(af / bf)
				if op == "//" {
					return q, nil
				}
				return af - q*bf, nil
			}
			q := ai / bi
			if (ai%bi != 0) && ((ai < 0) != (bi < 0)) {
				q--
			}
			if op == "//" {
				return q, nil
			}
			return ai - q*bi, nil
		case "**":
			if !useFloat && bi >= 0 {
				r := int64(1)
				for range bi {
					r *= ai
				}
				return r, nil
			}
			return math.Pow(af, bf), nil
		}
	}
	switch op {
	case "+":
		switch x := a.(type) {
		case string:
			if y, ok := b.(string); ok {
				return x + y, nil
			}
		case List:
			if y, ok := b.(List); ok {
				return append(append(List{}, x...), y...), nil
			}
		case tuple:
			if y, ok := b.(tuple); ok {
				return append(append(tuple{}, x...), y...), nil
			}
		}
	case "*":
		if bNum && !bFloat && bi > 0 {
			if n, _ := length(a); int64(n)*bi > maxRepeat {
				return nil, fmt.Errorf("%w: repeated sequence too long", ErrTemplate)
			}
		}
		if s, ok := a.(string); ok && bNum && !bFloat {
			return strings.Repeat(s, int(max(bi, 0))), nil
		}
		if l, ok := a.(List); ok && bNum && !bFloat {
			var out List
			for range max(bi, 0) {
				out = append(out, l...)
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("%w: unsupported operand type(s) for %s: '%s' and '%s'", ErrType, op, typeName(a), typeName(b))
}

// iterate lists what a for loop over v visits.
func iterate(v any) ([]any, error) {
	switch x := v.(type) {
	case undefined:
		return nil, nil
	case List:
		return x, nil
	case tuple:
		return x, nil
	case *Dict:
		out := make([]any, len(x.keys))
		for i, k := range x.keys {
			out[i] = k
		}
		return out, nil
	case string:
		out := make([]any, 0, len(x))
		for _, r := range x {
			out = append(out, string(r))
		}
		return out, nil
	}
	return nil, fmt.Errorf("%w: '%s' object is not iterable", ErrType, typeName(v))
}

func length(v any) (int, error) {
	switch x := v.(type) {
	case undefined:
		return 0, nil
	case string:
		return utf8.RuneCountInString(x), nil
	case List:
		return len(x), nil
	case tuple:
		return len(x), nil
	case *Dict:
		return x.Len(), nil
	}
	return 0, fmt.Errorf("%w: object of type '%s' has no len()", ErrType, typeName(v))
}

func contains(container, item any) (bool, error) {
	switch x := container.(type) {
	case string:
		s, ok := item.(string)
		if !ok {
			return false, fmt.Errorf("%w: 'in <string>' requires string as left operand, not %s", ErrType, typeName(item))
		}
		return strings.Contains(x, s), nil
	case *Dict:
		s, ok := item.(string)
		if !ok {
			return false, nil
		}
		_, has := x.m[s]
		return has, nil
	case undefined:
		return false, nil // Undefined iterates as empty
	}
	items, err := iterate(container)
	if err != nil {
		return false, fmt.Errorf("%w: argument of type '%s' is not iterable", ErrType, typeName(container))
	}
	for _, it := range items {
		if pyEqual(it, item) {
			return true, nil
		}
	}
	return false, nil
}
