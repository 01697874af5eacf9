package jinja

import (
	"fmt"
	"html"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
)

var globals map[string]any

func init() {
	globals = map[string]any{
		"range":           builtin(fnRange),
		"namespace":       builtin(fnNamespace),
		"dict":            builtin(fnDict),
		"raise_exception": builtin(fnRaise),
		"strftime_now":    builtin(fnStrftimeNow),
	}
}

func fnRange(_ *ctx, args []any, _ map[string]any) (any, error) {
	ints := make([]int64, len(args))
	for i, a := range args {
		n, ok := a.(int64)
		if !ok {
			return nil, fmt.Errorf("%w: range() needs integers", ErrType)
		}
		ints[i] = n
	}
	start, stop, step := int64(0), int64(0), int64(1)
	switch len(ints) {
	case 1:
		stop = ints[0]
	case 2:
		start, stop = ints[0], ints[1]
	case 3:
		start, stop, step = ints[0], ints[1], ints[2]
	default:
		return nil, fmt.Errorf("%w: range() takes 1 to 3 arguments", ErrType)
	}
	if step == 0 {
		return nil, fmt.Errorf("%w: range() step must not be zero", ErrType)
	}
	var out List
	for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
		out = append(out, i)
		if len(out) > 1_000_000 {
			return nil, fmt.Errorf("%w: range too large", ErrTemplate)
		}
	}
	return out, nil
}

func fnNamespace(_ *ctx, args []any, kwargs map[string]any) (any, error) {
	ns := &namespace{d: NewDict()}
	for _, a := range args {
		if d, ok := a.(*Dict); ok {
			for _, k := range d.keys {
				ns.d.Set(k, d.m[k])
			}
		}
	}
	for _, k := range sortedKeys(kwargs) {
		ns.d.Set(k, kwargs[k])
	}
	return ns, nil
}

func fnDict(_ *ctx, args []any, kwargs map[string]any) (any, error) {
	d := NewDict()
	for _, a := range args {
		if src, ok := a.(*Dict); ok {
			for _, k := range src.keys {
				d.Set(k, src.m[k])
			}
		}
	}
	for _, k := range sortedKeys(kwargs) {
		d.Set(k, kwargs[k])
	}
	return d, nil
}

func fnRaise(_ *ctx, args []any, _ map[string]any) (any, error) {
	msg := ""
	if len(args) > 0 {
		msg = pyStr(args[0])
	}
	return nil, fmt.Errorf("%w: %s", ErrTemplate, msg)
}

func fnStrftimeNow(_ *ctx, args []any, _ map[string]any) (any, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("%w: strftime_now takes a format", ErrType)
	}
	return strftime(time.Now(), pyStr(args[0])), nil
}

func strftime(t time.Time, f string) string {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 == len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case 'Y':
			fmt.Fprintf(&b, "%04d", t.Year())
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'B':
			b.WriteString(t.Month().String())
		case 'b':
			b.WriteString(t.Month().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'I':
			fmt.Fprintf(&b, "%02d", (t.Hour()+11)%12+1)
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'p':
			b.WriteString(t.Format("PM"))
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(f[i])
		}
	}
	return b.String()
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

type filterFunc func(c *ctx, v any, args []any, kwargs map[string]any) (any, error)

var filters map[string]filterFunc

func init() {
	filters = map[string]filterFunc{
		"tojson":     filterToJSON,
		"string":     func(_ *ctx, v any, _ []any, _ map[string]any) (any, error) { return pyStr(v), nil },
		"safe":       func(_ *ctx, v any, _ []any, _ map[string]any) (any, error) { return v, nil },
		"trim":       filterTrim,
		"length":     filterLength,
		"count":      filterLength,
		"items":      filterItems,
		"first":      filterFirst,
		"last":       filterLast,
		"join":       filterJoin,
		"default":    filterDefault,
		"d":          filterDefault,
		"list":       filterList,
		"lower":      strFilter(strings.ToLower),
		"upper":      strFilter(strings.ToUpper),
		"capitalize": strFilter(capitalize),
		"title":      strFilter(title),
		"replace":    filterReplace,
		"int":        filterInt,
		"float":      filterFloat,
		"abs":        filterAbs,
		"reverse":    filterReverse,
		"unique":     filterUnique,
		"sort":       filterSort,
		"min":        minMax(true),
		"max":        minMax(false),
		"sum":        filterSum,
		"map":        filterMap,
		"select":     selectFilter(false, false),
		"reject":     selectFilter(true, false),
		"selectattr": selectFilter(false, true),
		"rejectattr": selectFilter(true, true),
		"escape":     strFilter(html.EscapeString),
		"e":          strFilter(html.EscapeString),
		"indent":     filterIndent,
		"wordcount": func(_ *ctx, v any, _ []any, _ map[string]any) (any, error) {
			return int64(len(strings.Fields(pyStr(v)))), nil
		},
		"round":    filterRound,
		"dictsort": filterDictsort,
		"attr": func(_ *ctx, v any, args []any, _ map[string]any) (any, error) {
			if len(args) != 1 {
				return nil, fmt.Errorf("%w: attr takes a name", ErrType)
			}
			return getAttr(v, pyStr(args[0]))
		},
	}
}

func arg(args []any, kwargs map[string]any, i int, name string, def any) any {
	if i < len(args) {
		return args[i]
	}
	if v, ok := kwargs[name]; ok {
		return v
	}
	return def
}

func strFilter(f func(string) string) filterFunc {
	return func(_ *ctx, v any, _ []any, _ map[string]any) (any, error) { return f(pyStr(v)), nil }
}

func capitalize(s string) string {
	r := []rune(strings.ToLower(s))
	if len(r) > 0 {
		r[0] = unicode.ToUpper(r[0])
	}
	return string(r)
}

func title(s string) string {
	r := []rune(s)
	prevLetter := false
	for i, c := range r {
		if unicode.IsLetter(c) {
			if prevLetter {
				r[i] = unicode.ToLower(c)
			} else {
				r[i] = unicode.ToTitle(c)
			}
			prevLetter = true
		} else {
			prevLetter = false
		}
	}
	return string(r)
}

func filterTrim(_ *ctx, v any, args []any, kwargs map[string]any) (any, error) {
	chars := arg(args, kwargs, 0, "chars", nil)
	return pyStrip(pyStr(v), chars, true, true), nil
}

// pyStrip is str.strip/lstrip/rstrip: whitespace, or the given characters.
func pyStrip(s string, chars any, left, right bool) string {
	var f func(rune) bool
	if cs, ok := chars.(string); ok {
		f = func(r rune) bool { return strings.ContainsRune(cs, r) }
	} else {
		f = unicode.IsSpace
	}
	if left {
		s = strings.TrimLeftFunc(s, f)
	}
	if right {
		s = strings.TrimRightFunc(s, f)
	}
	return s
}

func filterLength(_ *ctx, v any, _ []any, _ map[string]any) (any, error) {
	n, err := length(v)
	return int64(n), err
}

func filterItems(_ *ctx, v any, _ []any, _ map[string]any) (any, error) {
	switch d := v.(type) {
	case undefined:
		return List{}, nil
	case *Dict:
		out := make(List, len(d.keys))
		for i, k := range d.keys {
			out[i] = tuple{k, d.m[k]}
		}
		return out, nil
	}
	return nil, fmt.Errorf("%w: can only get item pairs from a mapping", ErrType)
}

func filterFirst(_ *ctx, v any, _ []any, _ map[string]any) (any, error) {
	items, err := iterate(v)
	if err != nil || len(items) == 0 {
		return undefined{}, err
	}
	return items[0], nil
}

func filterLast(_ *ctx, v any, _ []any, _ map[string]any) (any, error) {
	items, err := iterate(v)
	if err != nil || len(items) == 0 {
		return undefined{}, err
	}
	return items[len(items)-1], nil
}

func filterJoin(_ *ctx, v any, args []any, kwargs map[string]any) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	sep := pyStr(arg(args, kwargs, 0, "d", ""))
	attr, hasAttr := arg(args, kwargs, 1, "attribute", nil).(string)
	parts := make([]string, len(items))
	for i, it := range items {
		if hasAttr {
			if it, err = getAttr(it, attr); err != nil {
				return nil, err
			}
		}
		parts[i] = pyStr(it)
	}
	return strings.Join(parts, sep), nil
}

func filterDefault(_ *ctx, v any, args []any, kwargs map[string]any) (any, error) {
	def := arg(args, kwargs, 0, "default_value", "")
	boolean := truthy(arg(args, kwargs, 1, "boolean", false))
	if _, undef := v.(undefined); undef || (boolean && !truthy(v)) {
		return def, nil
	}
	return v, nil
}

func filterList(_ *ctx, v any, _ []any, _ map[string]any) (any, error) {
	items, err := iterate(v)
	return List(append([]any{}, items...)), err
}

func filterReplace(_ *ctx, v any, args []any, kwargs map[string]any) (any, error) {
	if len(args) < 2 {
		return nil, fmt.Errorf("%w: replace takes old and new", ErrType)
	}
	n := -1
	if c, ok := arg(args, kwargs, 2, "count", nil).(int64); ok {
		n = int(c)
	}
	return strings.Replace(pyStr(v), pyStr(args[0]), pyStr(args[1]), n), nil
}

func filterInt(_ *ctx, v any, args []any, kwargs map[string]any) (any, error) {
	def := arg(args, kwargs, 0, "default", int64(0))
	switch x := v.(type) {
	case bool:
		if x {
			return int64(1), nil
		}
		return int64(0), nil
	case int64:
		return x, nil
	case float64:
		return int64(x), nil
	case string:
		s := strings.TrimSpace(x)
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return n, nil
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			return int64(f), nil
		}
	}
	return def, nil
}

func filterFloat(_ *ctx, v any, args []any, kwargs map[string]any) (any, error) {
	def := arg(args, kwargs, 0, "default", 0.0)
	if _, f, _, ok := number(v); ok {
		return f, nil
	}
	if s, ok := v.(string); ok {
		if f, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
			return f, nil
		}
	}
	return def, nil
}

func filterAbs(_ *ctx, v any, _ []any, _ map[string]any) (any, error) {
	switch x := v.(type) {
	case int64:
		if x < 0 {
			return -x, nil
		}
		return x, nil
	case float64:
		return math.Abs(x), nil
	}
	return nil, fmt.Errorf("%w: bad operand type for abs()", ErrType)
}

func filterRound(_ *ctx, v any, args []any, kwargs map[string]any) (any, error) {
	_, f, _, ok := number(v)
	if !ok {
		return nil, fmt.Errorf("%w: round needs a number", ErrType)
	}
	prec, _ := arg(args, kwargs, 0, "precision", int64(0)).(int64)
	method := pyStr(arg(args, kwargs, 1, "method", "common"))
	p := math.Pow(10, float64(prec))
	switch method {
	case "ceil":
		return math.Ceil(f*p) / p, nil
	case "floor":
		return math.Floor(f*p) / p, nil
	}
	return math.RoundToEven(f*p) / p, nil
}

// filterDictsort is Jinja's dictsort(case_sensitive=False, by='key',
// reverse=False): (key, value) pairs in order.
func filterDictsort(_ *ctx, v any, args []any, kwargs map[string]any) (any, error) {
	d, ok := v.(*Dict)
	if !ok {
		return nil, fmt.Errorf("%w: dictsort needs a mapping", ErrType)
	}
	caseSensitive := truthy(arg(args, kwargs, 0, "case_sensitive", false))
	byValue := pyStr(arg(args, kwargs, 1, "by", "key")) == "value"
	reverse := truthy(arg(args, kwargs, 2, "reverse", false))
	pairs, _ := filterItems(nil, d, nil, nil)
	out := pairs.(List)
	key := func(p any) any {
		x := p.(tuple)[0]
		if byValue {
			x = p.(tuple)[1]
		}
		if s, ok := x.(string); ok && !caseSensitive {
			return strings.ToLower(s)
		}
		return x
	}
	var sortErr error
	sort.SliceStable(out, func(i, j int) bool {
		a, b := key(out[i]), key(out[j])
		if reverse {
			a, b = b, a
		}
		lt, err := pyLess(a, b)
		if err != nil {
			sortErr = err
		}
		return lt
	})
	return out, sortErr
}

func filterReverse(_ *ctx, v any, _ []any, _ map[string]any) (any, error) {
	if s, ok := v.(string); ok {
		r := []rune(s)
		for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
			r[i], r[j] = r[j], r[i]
		}
		return string(r), nil
	}
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	out := make(List, len(items))
	for i, it := range items {
		out[len(items)-1-i] = it
	}
	return out, nil
}

func filterUnique(_ *ctx, v any, _ []any, _ map[string]any) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	var out List
	for _, it := range items {
		dup := false
		for _, o := range out {
			if pyEqual(o, it) {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, it)
		}
	}
	return out, nil
}

func filterSort(_ *ctx, v any, args []any, kwargs map[string]any) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	reverse := truthy(arg(args, kwargs, 0, "reverse", false))
	attr, hasAttr := arg(args, kwargs, 2, "attribute", nil).(string)
	out := append(List{}, items...)
	key := func(x any) any {
		if hasAttr {
			x, _ = getAttr(x, attr)
		}
		if s, ok := x.(string); ok {
			return strings.ToLower(s)
		}
		return x
	}
	var sortErr error
	sort.SliceStable(out, func(i, j int) bool {
		a, b := key(out[i]), key(out[j])
		if reverse {
			a, b = b, a
		}
		lt, err := pyLess(a, b)
		if err != nil {
			sortErr = err
		}
		return lt
	})
	return out, sortErr
}

func minMax(isMin bool) filterFunc {
	return func(_ *ctx, v any, _ []any, _ map[string]any) (any, error) {
		items, err := iterate(v)
		if err != nil || len(items) == 0 {
			return undefined{}, err
		}
		best := items[0]
		for _, it := range items[1:] {
			a, b := it, best
			if !isMin {
				a, b = best, it
			}
			lt, err := pyLess(a, b)
			if err != nil {
				return nil, err
			}
			if lt {
				best = it
			}
		}
		return best, nil
	}
}

func filterSum(_ *ctx, v any, args []any, kwargs map[string]any) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	attr, hasAttr := arg(args, kwargs, 0, "attribute", nil).(string)
	total := arg(args, kwargs, 1, "start", int64(0))
	for _, it := range items {
		if hasAttr {
			if it, err = getAttr(it, attr); err != nil {
				return nil, err
			}
		}
		if total, err = arith("+", total, it); err != nil {
			return nil, err
		}
	}
	return total, nil
}

func filterMap(c *ctx, v any, args []any, kwargs map[string]any) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	out := make(List, 0, len(items))
	if attr, ok := kwargs["attribute"].(string); ok {
		def, hasDef := kwargs["default"]
		for _, it := range items {
			r, err := getAttr(it, attr)
			if err != nil {
				return nil, err
			}
			if _, undef := r.(undefined); undef && hasDef {
				r = def
			}
			out = append(out, r)
		}
		return out, nil
	}
	if len(args) == 0 {
		return nil, fmt.Errorf("%w: map needs a filter or attribute", ErrType)
	}
	f, ok := filters[pyStr(args[0])]
	if !ok {
		return nil, fmt.Errorf("%w: no filter named '%s'", ErrTemplate, pyStr(args[0]))
	}
	for _, it := range items {
		r, err := f(c, it, args[1:], nil)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func selectFilter(reject, byAttr bool) filterFunc {
	return func(c *ctx, v any, args []any, _ map[string]any) (any, error) {
		items, err := iterate(v)
		if err != nil {
			return nil, err
		}
		attr := ""
		if byAttr {
			if len(args) == 0 {
				return nil, fmt.Errorf("%w: missing attribute", ErrType)
			}
			attr, args = pyStr(args[0]), args[1:]
		}
		var test testFunc
		var testArgs []any
		if len(args) > 0 {
			t, ok := tests[pyStr(args[0])]
			if !ok {
				return nil, fmt.Errorf("%w: no test named '%s'", ErrTemplate, pyStr(args[0]))
			}
			test, testArgs = t, args[1:]
		}
		var out List
		for _, it := range items {
			x := it
			if byAttr {
				if x, err = getAttr(it, attr); err != nil {
					return nil, err
				}
			}
			ok := truthy(x)
			if test != nil {
				if ok, err = test(c, x, testArgs); err != nil {
					return nil, err
				}
			}
			if ok != reject {
				out = append(out, it)
			}
		}
		return out, nil
	}
}

func filterIndent(_ *ctx, v any, args []any, kwargs map[string]any) (any, error) {
	width := arg(args, kwargs, 0, "width", int64(4))
	pad := ""
	if s, ok := width.(string); ok {
		pad = s
	} else if n, ok := width.(int64); ok {
		pad = strings.Repeat(" ", int(n))
	}
	first := truthy(arg(args, kwargs, 1, "first", false))
	blank := truthy(arg(args, kwargs, 2, "blank", false))
	lines := strings.Split(pyStr(v), "\n")
	for i := range lines {
		if (i == 0 && !first) || (!blank && strings.TrimSpace(lines[i]) == "" && i > 0) {
			continue
		}
		lines[i] = pad + lines[i]
	}
	return strings.Join(lines, "\n"), nil
}

type testFunc func(c *ctx, v any, args []any) (bool, error)

var tests map[string]testFunc

func init() {
	compare := func(op string) testFunc {
		return func(_ *ctx, v any, args []any) (bool, error) {
			if len(args) != 1 {
				return false, fmt.Errorf("%w: test needs one argument", ErrType)
			}
			switch op {
			case "==":
				return pyEqual(v, args[0]), nil
			case "!=":
				return !pyEqual(v, args[0]), nil
			case "<":
				return pyLess(v, args[0])
			case ">":
				return pyLess(args[0], v)
			case "<=":
				lt, err := pyLess(args[0], v)
				return !lt, err
			}
			lt, err := pyLess(v, args[0])
			return !lt, err
		}
	}
	kind := func(f func(any) bool) testFunc {
		return func(_ *ctx, v any, _ []any) (bool, error) { return f(v), nil }
	}
	tests = map[string]testFunc{
		"defined":   kind(func(v any) bool { _, u := v.(undefined); return !u }),
		"undefined": kind(func(v any) bool { _, u := v.(undefined); return u }),
		"none":      kind(func(v any) bool { return v == nil }),
		"boolean":   kind(func(v any) bool { _, ok := v.(bool); return ok }),
		"true":      kind(func(v any) bool { b, ok := v.(bool); return ok && b }),
		"false":     kind(func(v any) bool { b, ok := v.(bool); return ok && !b }),
		"integer":   kind(func(v any) bool { _, ok := v.(int64); return ok }),
		"float":     kind(func(v any) bool { _, ok := v.(float64); return ok }),
		"number":    kind(func(v any) bool { _, _, _, ok := number(v); return ok }),
		"string":    kind(func(v any) bool { _, ok := v.(string); return ok }),
		"mapping":   kind(func(v any) bool { _, ok := v.(*Dict); return ok }),
		"iterable": kind(func(v any) bool {
			switch v.(type) {
			case string, List, tuple, *Dict, undefined:
				return true
			}
			return false
		}),
		"sequence": kind(func(v any) bool {
			switch v.(type) {
			case string, List, tuple, *Dict, undefined:
				return true
			}
			return false
		}),
		"callable": kind(func(v any) bool {
			switch v.(type) {
			case *macro, builtin, boundMethod:
				return true
			}
			return false
		}),
		"odd": func(_ *ctx, v any, _ []any) (bool, error) {
			n, ok := v.(int64)
			return ok && n%2 != 0, nil
		},
		"even": func(_ *ctx, v any, _ []any) (bool, error) {
			n, ok := v.(int64)
			return ok && n%2 == 0, nil
		},
		"divisibleby": func(_ *ctx, v any, args []any) (bool, error) {
			n, ok1 := v.(int64)
			d, ok2 := args[0].(int64)
			return ok1 && ok2 && d != 0 && n%d == 0, nil
		},
		"lower": kind(func(v any) bool { s, ok := v.(string); return ok && strings.ToLower(s) == s }),
		"upper": kind(func(v any) bool { s, ok := v.(string); return ok && strings.ToUpper(s) == s }),
		"in": func(_ *ctx, v any, args []any) (bool, error) {
			if len(args) != 1 {
				return false, fmt.Errorf("%w: in needs one argument", ErrType)
			}
			return contains(args[0], v)
		},
		"sameas": func(_ *ctx, v any, args []any) (bool, error) {
			if len(args) != 1 {
				return false, fmt.Errorf("%w: sameas needs one argument", ErrType)
			}
			return v == args[0] || (v == nil && args[0] == nil), nil
		},
		"eq": compare("=="), "equalto": compare("=="), "==": compare("=="),
		"ne": compare("!="), "!=": compare("!="),
		"lt": compare("<"), "lessthan": compare("<"), "<": compare("<"),
		"gt": compare(">"), "greaterthan": compare(">"), ">": compare(">"),
		"le": compare("<="), "<=": compare("<="),
		"ge": compare(">="), ">=": compare(">="),
		"escaped": kind(func(any) bool { return false }),
	}
}

var methods = map[string]map[string]bool{
	"str": {"startswith": true, "endswith": true, "split": true, "rsplit": true, "strip": true, "lstrip": true,
		"rstrip": true, "upper": true, "lower": true, "title": true, "capitalize": true, "replace": true,
		"find": true, "rfind": true, "count": true, "join": true, "splitlines": true, "isdigit": true,
		"isalpha": true, "isspace": true, "removeprefix": true, "removesuffix": true},
	"dict": {"items": true, "keys": true, "values": true, "get": true, "copy": true},
	"list": {"index": true, "count": true, "copy": true},
}

func hasMethod(v any, name string) bool {
	switch v.(type) {
	case string:
		return methods["str"][name]
	case *Dict:
		return methods["dict"][name]
	case List, tuple:
		return methods["list"][name]
	}
	return false
}

func callMethod(m boundMethod, args []any, kwargs map[string]any) (any, error) {
	switch r := m.recv.(type) {
	case string:
		return strMethod(r, m.name, args, kwargs)
	case *Dict:
		switch m.name {
		case "items":
			return filterItems(nil, r, nil, nil)
		case "keys":
			keys, _ := iterate(r)
			return List(keys), nil
		case "values":
			out := make(List, len(r.keys))
			for i, k := range r.keys {
				out[i] = r.m[k]
			}
			return out, nil
		case "get":
			if len(args) == 0 {
				return nil, fmt.Errorf("%w: get expected at least 1 argument", ErrType)
			}
			if k, ok := args[0].(string); ok {
				if v, ok := r.m[k]; ok {
					return v, nil
				}
			}
			if len(args) > 1 {
				return args[1], nil
			}
			return nil, nil
		case "copy":
			d := NewDict()
			for _, k := range r.keys {
				d.Set(k, r.m[k])
			}
			return d, nil
		}
	case List, tuple:
		items, _ := iterate(r)
		switch m.name {
		case "index", "count":
			if len(args) != 1 {
				return nil, fmt.Errorf("%w: %s takes one argument", ErrType, m.name)
			}
			n := int64(0)
			for i, it := range items {
				if pyEqual(it, args[0]) {
					if m.name == "index" {
						return int64(i), nil
					}
					n++
				}
			}
			if m.name == "index" {
				return nil, fmt.Errorf("%w: value is not in list", ErrType)
			}
			return n, nil
		case "copy":
			return append(List{}, items...), nil
		}
	}
	return nil, fmt.Errorf("%w: '%s' object has no method '%s'", ErrType, typeName(m.recv), m.name)
}

func strMethod(s, name string, args []any, kwargs map[string]any) (any, error) {
	str := func(i int, kw string) (string, bool) {
		v, ok := arg(args, kwargs, i, kw, nil).(string)
		return v, ok
	}
	switch name {
	case "startswith", "endswith":
		has := strings.HasPrefix
		if name == "endswith" {
			has = strings.HasSuffix
		}
		switch p := arg(args, kwargs, 0, "prefix", nil).(type) {
		case string:
			return has(s, p), nil
		case tuple, List:
			items, _ := iterate(p)
			for _, it := range items {
				if ps, ok := it.(string); ok && has(s, ps) {
					return true, nil
				}
			}
			return false, nil
		}
		return nil, fmt.Errorf("%w: %s needs a string", ErrType, name)
	case "split", "rsplit":
		sep, hasSep := str(0, "sep")
		maxsplit := int64(-1)
		if n, ok := arg(args, kwargs, 1, "maxsplit", nil).(int64); ok {
			maxsplit = n
		}
		var parts []string
		switch {
		case !hasSep:
			parts = strings.Fields(s)
			if maxsplit >= 0 && int64(len(parts)) > maxsplit+1 {
				// Rare in templates; good enough: rejoin the tail.
				parts = append(parts[:maxsplit], strings.Join(parts[maxsplit:], " "))
			}
		case sep == "":
			return nil, fmt.Errorf("%w: empty separator", ErrType)
		case name == "rsplit" && maxsplit >= 0:
			all := strings.Split(s, sep)
			if int64(len(all)) > maxsplit+1 {
				cut := int64(len(all)) - maxsplit
				parts = append([]string{strings.Join(all[:cut], sep)}, all[cut:]...)
			} else {
				parts = all
			}
		default:
			parts = strings.SplitN(s, sep, int(maxsplit)+int(boolInt(maxsplit >= 0)))
			if maxsplit < 0 {
				parts = strings.Split(s, sep)
			}
		}
		out := make(List, len(parts))
		for i, p := range parts {
			out[i] = p
		}
		return out, nil
	case "strip", "lstrip", "rstrip":
		chars := arg(args, kwargs, 0, "chars", nil)
		return pyStrip(s, chars, name != "rstrip", name != "lstrip"), nil
	case "upper":
		return strings.ToUpper(s), nil
	case "lower":
		return strings.ToLower(s), nil
	case "title":
		return title(s), nil
	case "capitalize":
		return capitalize(s), nil
	case "replace":
		oldS, _ := str(0, "old")
		newS, _ := str(1, "new")
		n := -1
		if c, ok := arg(args, kwargs, 2, "count", nil).(int64); ok {
			n = int(c)
		}
		return strings.Replace(s, oldS, newS, n), nil
	case "find", "rfind", "count":
		sub, _ := str(0, "sub")
		switch name {
		case "find":
			return int64(runeIndex(s, strings.Index(s, sub))), nil
		case "rfind":
			return int64(runeIndex(s, strings.LastIndex(s, sub))), nil
		}
		return int64(strings.Count(s, sub)), nil
	case "join":
		items, err := iterate(arg(args, kwargs, 0, "iterable", List{}))
		if err != nil {
			return nil, err
		}
		parts := make([]string, len(items))
		for i, it := range items {
			p, ok := it.(string)
			if !ok {
				return nil, fmt.Errorf("%w: sequence item %d: expected str instance", ErrType, i)
			}
			parts[i] = p
		}
		return strings.Join(parts, s), nil
	case "splitlines":
		lines := strings.Split(strings.ReplaceAll(s, "\r\n", "\n"), "\n")
		if len(lines) > 0 && lines[len(lines)-1] == "" {
			lines = lines[:len(lines)-1]
		}
		out := make(List, len(lines))
		for i, l := range lines {
			out[i] = l
		}
		return out, nil
	case "isdigit", "isalpha", "isspace":
		if s == "" {
			return false, nil
		}
		f := unicode.IsDigit
		if name == "isalpha" {
			f = unicode.IsLetter
		} else if name == "isspace" {
			f = unicode.IsSpace
		}
		for _, r := range s {
			if !f(r) {
				return false, nil
			}
		}
		return true, nil
	case "removeprefix":
		p, _ := str(0, "prefix")
		return strings.TrimPrefix(s, p), nil
	case "removesuffix":
		p, _ := str(0, "suffix")
		return strings.TrimSuffix(s, p), nil
	}
	return nil, fmt.Errorf("%w: 'str' object has no method '%s'", ErrType, name)
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func runeIndex(s string, byteIdx int) int {
	if byteIdx < 0 {
		return -1
	}
	return len([]rune(s[:byteIdx]))
}

// filterToJSON is transformers' tojson: json.dumps(x, ensure_ascii=False,
// indent=indent, separators=separators, sort_keys=sort_keys).
func filterToJSON(_ *ctx, v any, args []any, kwargs map[string]any) (any, error) {
	indent := arg(args, kwargs, 1, "indent", nil)
	itemSep, keySep := ", ", ": "
	pad := ""
	if indent != nil {
		itemSep = ","
		switch x := indent.(type) {
		case int64:
			pad = strings.Repeat(" ", int(x))
		case string:
			pad = x
		}
	}
	if seps, ok := kwargs["separators"]; ok && seps != nil {
		items, err := iterate(seps)
		if err != nil || len(items) != 2 {
			return nil, fmt.Errorf("%w: separators must be a pair", ErrType)
		}
		itemSep, keySep = pyStr(items[0]), pyStr(items[1])
	}
	sortKeys := truthy(kwargs["sort_keys"])
	var b strings.Builder
	j := jsonWriter{b: &b, itemSep: itemSep, keySep: keySep, pad: pad, indented: indent != nil, sortKeys: sortKeys}
	if err := j.write(v, 0); err != nil {
		return nil, err
	}
	return b.String(), nil
}

type jsonWriter struct {
	b               *strings.Builder
	itemSep, keySep string
	pad             string
	indented        bool
	sortKeys        bool
}

func (j *jsonWriter) newline(depth int) {
	if j.indented {
		j.b.WriteByte('\n')
		j.b.WriteString(strings.Repeat(j.pad, depth))
	}
}

func (j *jsonWriter) write(v any, depth int) error {
	switch x := v.(type) {
	case nil:
		j.b.WriteString("null")
	case bool:
		if x {
			j.b.WriteString("true")
		} else {
			j.b.WriteString("false")
		}
	case int64:
		j.b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		switch {
		case math.IsNaN(x):
			j.b.WriteString("NaN")
		case math.IsInf(x, 1):
			j.b.WriteString("Infinity")
		case math.IsInf(x, -1):
			j.b.WriteString("-Infinity")
		default:
			j.b.WriteString(pyFloat(x))
		}
	case string:
		writeJSONString(j.b, x)
	case List, tuple:
		items, _ := iterate(x)
		if len(items) == 0 {
			j.b.WriteString("[]")
			return nil
		}
		j.b.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				j.b.WriteString(j.itemSep)
			}
			j.newline(depth + 1)
			if err := j.write(it, depth+1); err != nil {
				return err
			}
		}
		j.newline(depth)
		j.b.WriteByte(']')
	case *Dict:
		if x.Len() == 0 {
			j.b.WriteString("{}")
			return nil
		}
		keys := x.keys
		if j.sortKeys {
			keys = append([]string{}, keys...)
			sort.Strings(keys)
		}
		j.b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				j.b.WriteString(j.itemSep)
			}
			j.newline(depth + 1)
			writeJSONString(j.b, k)
			j.b.WriteString(j.keySep)
			if err := j.write(x.m[k], depth+1); err != nil {
				return err
			}
		}
		j.newline(depth)
		j.b.WriteByte('}')
	case *namespace:
		return fmt.Errorf("%w: Object of type Namespace is not JSON serializable", ErrType)
	case undefined:
		return fmt.Errorf("%w: Object of type Undefined is not JSON serializable", ErrType)
	default:
		return fmt.Errorf("%w: Object of type %s is not JSON serializable", ErrType, typeName(v))
	}
	return nil
}

// writeJSONString writes s the way json.dumps(ensure_ascii=False) does.
func writeJSONString(b *strings.Builder, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if c < 0x20 {
				b.WriteString(`\u00`)
				b.WriteByte(hex[c>>4])
				b.WriteByte(hex[c&0xF])
			} else {
				b.WriteByte(c)
			}
		}
	}
	b.WriteByte('"')
}
