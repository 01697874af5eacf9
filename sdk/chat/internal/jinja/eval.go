package jinja

import (
	"errors"
	"fmt"
	"strings"
)

// Template is a compiled template; safe for concurrent rendering.
type Template struct {
	nodes []node
}

// Compile parses a template.
func Compile(src string) (*Template, error) {
	nodes, err := parse(src)
	if err != nil {
		return nil, err
	}
	return &Template{nodes: nodes}, nil
}

// Render runs the template with vars as its context. Values are nil, bool,
// int64, float64, string, List, *Dict (other Go ints and floats convert).
func (t *Template) Render(vars map[string]any) (string, error) {
	root := make(map[string]any, len(vars))
	for k, v := range vars {
		root[k] = normalize(v)
	}
	c := &ctx{scopes: []map[string]any{root}, out: &strings.Builder{}}
	if err := c.exec(t.nodes); err != nil {
		if errors.Is(err, errBreak) || errors.Is(err, errContinue) {
			return "", fmt.Errorf("%w: break or continue outside a loop", ErrTemplate)
		}
		return "", err
	}
	return c.out.String(), nil
}

func normalize(v any) any {
	switch x := v.(type) {
	case int:
		return int64(x)
	case int32:
		return int64(x)
	case float32:
		return float64(x)
	case []any:
		out := make(List, len(x))
		for i, it := range x {
			out[i] = normalize(it)
		}
		return out
	}
	return v
}

var (
	errBreak    = errors.New("break")
	errContinue = errors.New("continue")
)

type ctx struct {
	scopes []map[string]any
	out    *strings.Builder
	depth  int
}

type macro struct {
	n    *macroNode
	root map[string]any
}

type loopInfo struct {
	items []any
	i     int
}

func (c *ctx) lookup(name string) any {
	for i := len(c.scopes) - 1; i >= 0; i-- {
		if v, ok := c.scopes[i][name]; ok {
			return v
		}
	}
	if g, ok := globals[name]; ok {
		return g
	}
	return undefined{name}
}

func (c *ctx) exec(nodes []node) error {
	for _, n := range nodes {
		if err := c.execNode(n); err != nil {
			return err
		}
	}
	return nil
}

func (c *ctx) execNode(n node) error {
	switch n := n.(type) {
	case *textNode:
		c.out.WriteString(n.s)
	case *outputNode:
		v, err := c.eval(n.x)
		if err != nil {
			return err
		}
		c.out.WriteString(pyStr(v))
	case *ifNode:
		for i, cond := range n.conds {
			v, err := c.eval(cond)
			if err != nil {
				return err
			}
			if truthy(v) {
				return c.exec(n.bodies[i])
			}
		}
		return c.exec(n.orElse)
	case *forNode:
		return c.execFor(n)
	case *setNode:
		return c.execSet(n)
	case *macroNode:
		c.scopes[len(c.scopes)-1][n.name] = &macro{n: n, root: c.scopes[0]}
	case *filterBlock:
		saved := c.out
		c.out = &strings.Builder{}
		err := c.exec(n.body)
		body := c.out.String()
		c.out = saved
		if err != nil {
			return err
		}
		c.scopes = append(c.scopes, map[string]any{filterBodyVar: body})
		v, err := c.evalFilter(n.f)
		c.scopes = c.scopes[:len(c.scopes)-1]
		if err != nil {
			return err
		}
		c.out.WriteString(pyStr(v))
	case *breakNode:
		return errBreak
	case *continueNode:
		return errContinue
	default:
		return fmt.Errorf("%w: unknown node %T", ErrTemplate, n)
	}
	return nil
}

func (c *ctx) execFor(n *forNode) error {
	seq, err := c.eval(n.iter)
	if err != nil {
		return err
	}
	items, err := iterate(seq)
	if err != nil {
		return err
	}
	if n.filter != nil {
		var kept []any
		for _, it := range items {
			c.scopes = append(c.scopes, map[string]any{})
			if err := c.bind(n.targets, it); err != nil {
				return err
			}
			v, err := c.eval(n.filter)
			c.scopes = c.scopes[:len(c.scopes)-1]
			if err != nil {
				return err
			}
			if truthy(v) {
				kept = append(kept, it)
			}
		}
		items = kept
	}
	if len(items) == 0 {
		return c.exec(n.orElse)
	}
	loop := &loopInfo{items: items}
	for i, it := range items {
		loop.i = i
		c.scopes = append(c.scopes, map[string]any{"loop": loop})
		if err := c.bind(n.targets, it); err != nil {
			return err
		}
		err := c.exec(n.body)
		c.scopes = c.scopes[:len(c.scopes)-1]
		if errors.Is(err, errBreak) {
			break
		}
		if err != nil && !errors.Is(err, errContinue) {
			return err
		}
	}
	return nil
}

func (c *ctx) bind(targets []string, v any) error {
	scope := c.scopes[len(c.scopes)-1]
	if len(targets) == 1 {
		scope[targets[0]] = v
		return nil
	}
	items, err := iterate(v)
	if err != nil {
		return err
	}
	if len(items) != len(targets) {
		return fmt.Errorf("%w: cannot unpack %d values into %d names", ErrType, len(items), len(targets))
	}
	for i, t := range targets {
		scope[t] = items[i]
	}
	return nil
}

func (c *ctx) execSet(n *setNode) error {
	var v any
	if n.body != nil {
		saved := c.out
		c.out = &strings.Builder{}
		err := c.exec(n.body)
		v, c.out = c.out.String(), saved
		if err != nil {
			return err
		}
	} else {
		var err error
		if v, err = c.eval(n.x); err != nil {
			return err
		}
	}
	if n.attr != "" {
		ns, ok := c.lookup(n.targets[0]).(*namespace)
		if !ok {
			return fmt.Errorf("%w: cannot assign attribute on non-namespace object", ErrTemplate)
		}
		ns.d.Set(n.attr, v)
		return nil
	}
	return c.bind(n.targets, v)
}

func (c *ctx) eval(x expr) (any, error) {
	switch x := x.(type) {
	case *literal:
		return x.v, nil
	case *nameRef:
		return c.lookup(x.name), nil
	case *attrRef:
		v, err := c.eval(x.x)
		if err != nil {
			return nil, err
		}
		return getAttr(v, x.name)
	case *itemRef:
		v, err := c.eval(x.x)
		if err != nil {
			return nil, err
		}
		k, err := c.eval(x.key)
		if err != nil {
			return nil, err
		}
		return getItem(v, k)
	case *sliceRef:
		return c.evalSlice(x)
	case *callExpr:
		return c.evalCall(x)
	case *filterExpr:
		return c.evalFilter(x)
	case *testExpr:
		return c.evalTest(x)
	case *unaryExpr:
		v, err := c.eval(x.x)
		if err != nil {
			return nil, err
		}
		switch x.op {
		case "not":
			return !truthy(v), nil
		case "-":
			switch n := v.(type) {
			case float64:
				return -n, nil
			case int64:
				return -n, nil
			case bool:
				return -boolInt(n), nil
			}
			return arith("-", int64(0), v)
		default:
			return arith("+", int64(0), v)
		}
	case *binaryExpr:
		return c.evalBinary(x)
	case *condExpr:
		cond, err := c.eval(x.cond)
		if err != nil {
			return nil, err
		}
		if truthy(cond) {
			return c.eval(x.then)
		}
		if x.orElse == nil {
			return undefined{}, nil
		}
		return c.eval(x.orElse)
	case *listExpr:
		out := make(List, len(x.items))
		for i, it := range x.items {
			v, err := c.eval(it)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	case *tupleExpr:
		out := make(tuple, len(x.items))
		for i, it := range x.items {
			v, err := c.eval(it)
			if err != nil {
				return nil, err
			}
			out[i] = v
		}
		return out, nil
	case *dictExpr:
		d := NewDict()
		for i := range x.keys {
			k, err := c.eval(x.keys[i])
			if err != nil {
				return nil, err
			}
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("%w: dict keys must be strings here", ErrTemplate)
			}
			v, err := c.eval(x.vals[i])
			if err != nil {
				return nil, err
			}
			d.Set(ks, v)
		}
		return d, nil
	}
	return nil, fmt.Errorf("%w: unknown expression %T", ErrTemplate, x)
}

func (c *ctx) evalBinary(x *binaryExpr) (any, error) {
	l, err := c.eval(x.l)
	if err != nil {
		return nil, err
	}
	switch x.op { // Python's and/or return an operand
	case "and":
		if !truthy(l) {
			return l, nil
		}
		return c.eval(x.r)
	case "or":
		if truthy(l) {
			return l, nil
		}
		return c.eval(x.r)
	}
	r, err := c.eval(x.r)
	if err != nil {
		return nil, err
	}
	switch x.op {
	case "~":
		return pyStr(l) + pyStr(r), nil
	case "==":
		return pyEqual(l, r), nil
	case "!=":
		return !pyEqual(l, r), nil
	case "<":
		return pyLess(l, r)
	case ">":
		return pyLess(r, l)
	case "<=":
		lt, err := pyLess(r, l)
		return !lt, err
	case ">=":
		lt, err := pyLess(l, r)
		return !lt, err
	case "in":
		return contains(r, l)
	case "notin":
		in, err := contains(r, l)
		return !in, err
	}
	return arith(x.op, l, r)
}

func (c *ctx) evalSlice(x *sliceRef) (any, error) {
	v, err := c.eval(x.x)
	if err != nil {
		return nil, err
	}
	bound := func(e expr) (int64, bool, error) {
		if e == nil {
			return 0, false, nil
		}
		b, err := c.eval(e)
		if err != nil || b == nil {
			return 0, false, err
		}
		i, ok := b.(int64)
		if !ok {
			return 0, false, fmt.Errorf("%w: slice indices must be integers", ErrType)
		}
		return i, true, nil
	}
	start, hasStart, err := bound(x.start)
	if err != nil {
		return nil, err
	}
	stop, hasStop, err := bound(x.stop)
	if err != nil {
		return nil, err
	}
	step, hasStep, err := bound(x.step)
	if err != nil {
		return nil, err
	}
	if !hasStep {
		step = 1
	}
	if step == 0 {
		return nil, fmt.Errorf("%w: slice step cannot be zero", ErrType)
	}
	var items []any
	var str []rune
	switch s := v.(type) {
	case List:
		items = s
	case tuple:
		items = s
	case string:
		str = []rune(s)
		items = make([]any, len(str))
	case undefined:
		return nil, undefErr(s)
	default:
		return nil, fmt.Errorf("%w: '%s' object is not subscriptable", ErrType, typeName(v))
	}
	n := int64(len(items))
	norm := func(i int64, has bool, def int64, lo, hi int64) int64 {
		if !has {
			return def
		}
		if i < 0 {
			i += n
		}
		return min(max(i, lo), hi)
	}
	var idx []int64
	if step > 0 {
		for i := norm(start, hasStart, 0, 0, n); i < norm(stop, hasStop, n, 0, n); i += step {
			idx = append(idx, i)
		}
	} else {
		for i := norm(start, hasStart, n-1, -1, n-1); i > norm(stop, hasStop, -1, -1, n-1); i += step {
			idx = append(idx, i)
		}
	}
	if str != nil || v == "" {
		out := make([]rune, len(idx))
		for j, i := range idx {
			out[j] = str[i]
		}
		return string(out), nil
	}
	out := make([]any, len(idx))
	for j, i := range idx {
		out[j] = items[i]
	}
	if _, ok := v.(tuple); ok {
		return tuple(out), nil
	}
	return List(out), nil
}

func (c *ctx) evalArgs(args []expr, kwargs []kwarg) ([]any, map[string]any, error) {
	vals := make([]any, len(args))
	for i, a := range args {
		v, err := c.eval(a)
		if err != nil {
			return nil, nil, err
		}
		vals[i] = v
	}
	var kw map[string]any
	if len(kwargs) > 0 {
		kw = make(map[string]any, len(kwargs))
		for _, k := range kwargs {
			v, err := c.eval(k.x)
			if err != nil {
				return nil, nil, err
			}
			kw[k.name] = v
		}
	}
	return vals, kw, nil
}

func (c *ctx) evalCall(x *callExpr) (any, error) {
	fn, err := c.eval(x.fn)
	if err != nil {
		return nil, err
	}
	args, kwargs, err := c.evalArgs(x.args, x.kwargs)
	if err != nil {
		return nil, err
	}
	return c.call(fn, args, kwargs)
}

func (c *ctx) call(fn any, args []any, kwargs map[string]any) (any, error) {
	switch f := fn.(type) {
	case *macro:
		return c.callMacro(f, args, kwargs)
	case builtin:
		return f(c, args, kwargs)
	case boundMethod:
		return callMethod(f, args, kwargs)
	case undefined:
		return nil, undefErr(f)
	}
	return nil, fmt.Errorf("%w: '%s' object is not callable", ErrType, typeName(fn))
}

func (c *ctx) callMacro(m *macro, args []any, kwargs map[string]any) (any, error) {
	if c.depth > 64 {
		return nil, fmt.Errorf("%w: macro recursion too deep", ErrTemplate)
	}
	if len(args) > len(m.n.params) {
		return nil, fmt.Errorf("%w: macro '%s' takes not more than %d argument(s)", ErrType, m.n.name, len(m.n.params))
	}
	inner := &ctx{scopes: []map[string]any{m.root, {}}, out: &strings.Builder{}, depth: c.depth + 1}
	scope := inner.scopes[1]
	for i, name := range m.n.params {
		switch v, ok := kwargs[name]; {
		case i < len(args):
			scope[name] = args[i]
		case ok:
			scope[name] = v
		case m.n.defaults[i] != nil:
			d, err := inner.eval(m.n.defaults[i])
			if err != nil {
				return nil, err
			}
			scope[name] = d
		default:
			scope[name] = undefined{name}
		}
	}
	if err := inner.exec(m.n.body); err != nil {
		return nil, err
	}
	return inner.out.String(), nil
}

func (c *ctx) evalFilter(x *filterExpr) (any, error) {
	v, err := c.eval(x.x)
	if err != nil {
		return nil, err
	}
	args, kwargs, err := c.evalArgs(x.args, x.kwargs)
	if err != nil {
		return nil, err
	}
	f, ok := filters[x.name]
	if !ok {
		return nil, fmt.Errorf("%w: no filter named '%s'", ErrTemplate, x.name)
	}
	return f(c, v, args, kwargs)
}

func (c *ctx) evalTest(x *testExpr) (any, error) {
	v, err := c.eval(x.x)
	if err != nil {
		return nil, err
	}
	args, _, err := c.evalArgs(x.args, nil)
	if err != nil {
		return nil, err
	}
	t, ok := tests[x.name]
	if !ok {
		return nil, fmt.Errorf("%w: no test named '%s'", ErrTemplate, x.name)
	}
	r, err := t(c, v, args)
	if err != nil {
		return nil, err
	}
	return r != x.negate, nil
}

// getAttr is Jinja's obj.name: the Python attribute first, then the item.
func getAttr(v any, name string) (any, error) {
	switch x := v.(type) {
	case undefined:
		return nil, undefErr(x)
	case *Dict:
		if hasMethod(v, name) {
			return boundMethod{v, name}, nil
		}
		if r, ok := x.m[name]; ok {
			return r, nil
		}
	case *namespace:
		if r, ok := x.d.m[name]; ok {
			return r, nil
		}
	case *loopInfo:
		return x.attr(name), nil
	default:
		if hasMethod(v, name) {
			return boundMethod{v, name}, nil
		}
	}
	return undefined{name}, nil
}

// getItem is Jinja's obj[key]: the item first, then the attribute.
func getItem(v, key any) (any, error) {
	switch x := v.(type) {
	case undefined:
		return nil, undefErr(x)
	case *Dict:
		if s, ok := key.(string); ok {
			if r, ok := x.m[s]; ok {
				return r, nil
			}
		}
	case List, tuple, string:
		if i, ok := key.(int64); ok {
			var items []any
			var runes []rune
			switch s := x.(type) {
			case List:
				items = s
			case tuple:
				items = s
			case string:
				runes = []rune(s)
			}
			n := int64(len(items) + len(runes))
			if i < 0 {
				i += n
			}
			if i < 0 || i >= n {
				return undefined{}, nil
			}
			if runes != nil {
				return string(runes[i]), nil
			}
			return items[i], nil
		}
	}
	if s, ok := key.(string); ok {
		return getAttr(v, s)
	}
	return undefined{}, nil
}

func (l *loopInfo) attr(name string) any {
	n := int64(len(l.items))
	i := int64(l.i)
	switch name {
	case "index":
		return i + 1
	case "index0":
		return i
	case "revindex":
		return n - i
	case "revindex0":
		return n - i - 1
	case "first":
		return i == 0
	case "last":
		return i == n-1
	case "length":
		return n
	case "previtem":
		if i > 0 {
			return l.items[i-1]
		}
	case "nextitem":
		if i < n-1 {
			return l.items[i+1]
		}
	case "depth":
		return int64(1)
	case "depth0":
		return int64(0)
	}
	return undefined{name}
}
