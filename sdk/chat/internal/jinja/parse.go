package jinja

import (
	"fmt"
	"strings"
)

// Statement nodes.
type (
	node interface{}

	textNode   struct{ s string }
	outputNode struct{ x expr }
	ifNode     struct {
		conds  []expr
		bodies [][]node
		orElse []node
	}
	forNode struct {
		targets []string
		iter    expr
		filter  expr
		body    []node
		orElse  []node
	}
	setNode struct {
		targets []string // one name, or several to unpack
		attr    string   // set ns.attr = …
		x       expr
		body    []node // {% set x %}…{% endset %}
	}
	macroNode struct {
		name     string
		params   []string
		defaults []expr
		body     []node
	}
	filterBlock struct {
		f    *filterExpr // x is unset: the body's output is filtered
		body []node
	}
	breakNode    struct{}
	continueNode struct{}
)

// Expression nodes.
type (
	expr interface{}

	literal struct{ v any }
	nameRef struct{ name string }
	attrRef struct {
		x    expr
		name string
	}
	itemRef  struct{ x, key expr }
	sliceRef struct {
		x                 expr
		start, stop, step expr
	}
	callExpr struct {
		fn     expr
		args   []expr
		kwargs []kwarg
	}
	filterExpr struct {
		x      expr
		name   string
		args   []expr
		kwargs []kwarg
	}
	testExpr struct {
		x      expr
		name   string
		args   []expr
		negate bool
	}
	unaryExpr struct {
		op string
		x  expr
	}
	binaryExpr struct {
		op   string
		l, r expr
	}
	condExpr  struct{ then, cond, orElse expr }
	listExpr  struct{ items []expr }
	tupleExpr struct{ items []expr }
	dictExpr  struct{ keys, vals []expr }
	kwarg     struct {
		name string
		x    expr
	}
)

// filterBodyVar holds a {% filter %} block's output while its filters run;
// no template can name it.
const filterBodyVar = "\x00body"

type parser struct {
	segs []segment
	pos  int
}

func parse(src string) ([]node, error) {
	segs, err := split(src)
	if err != nil {
		return nil, err
	}
	p := &parser{segs: segs}
	body, end, err := p.body()
	if err != nil {
		return nil, err
	}
	if end != "" {
		return nil, fmt.Errorf("unexpected {%% %s %%}", end)
	}
	return body, nil
}

// body parses nodes until a block tag it does not own, which it returns
// (with its source) for the caller; "" at the end of the template.
func (p *parser) body(stops ...string) ([]node, string, error) {
	var out []node
	for p.pos < len(p.segs) {
		s := p.segs[p.pos]
		p.pos++
		switch s.kind {
		case segText:
			out = append(out, &textNode{s.text})
		case segOutput:
			x, err := parseExprSource(s.text)
			if err != nil {
				return nil, "", fmt.Errorf("line %d: {{ %s }}: %w", s.line, s.text, err)
			}
			out = append(out, &outputNode{x})
		case segBlock:
			word := s.text
			if i := strings.IndexAny(word, " \t\r\n("); i >= 0 {
				word = word[:i]
			}
			for _, st := range stops {
				if word == st {
					return out, s.text, nil
				}
			}
			n, err := p.block(word, s)
			if err != nil {
				return nil, "", fmt.Errorf("line %d: {%% %s %%}: %w", s.line, s.text, err)
			}
			if n != nil {
				out = append(out, n)
			}
		}
	}
	if len(stops) > 0 {
		return nil, "", fmt.Errorf("missing {%% %s %%}", stops[len(stops)-1])
	}
	return out, "", nil
}

func keyword(tag string) string {
	if i := strings.IndexAny(tag, " \t\r\n("); i >= 0 {
		return tag[:i]
	}
	return tag
}

func (p *parser) block(word string, s segment) (node, error) {
	rest := strings.TrimSpace(strings.TrimPrefix(s.text, word))
	switch word {
	case "if":
		n := &ifNode{}
		cond := rest
		for {
			x, err := parseExprSource(cond)
			if err != nil {
				return nil, err
			}
			body, end, err := p.body("elif", "else", "endif")
			if err != nil {
				return nil, err
			}
			n.conds, n.bodies = append(n.conds, x), append(n.bodies, body)
			switch keyword(end) {
			case "elif":
				cond = strings.TrimSpace(strings.TrimPrefix(end, "elif"))
				continue
			case "else":
				body, _, err := p.body("endif")
				if err != nil {
					return nil, err
				}
				n.orElse = body
			}
			return n, nil
		}
	case "for":
		return p.forBlock(rest)
	case "set":
		return p.setBlock(rest)
	case "macro":
		return p.macroBlock(rest)
	case "filter":
		toks, err := tokenize(rest)
		if err != nil {
			return nil, err
		}
		e := &exprParser{toks: append([]token{{kind: tkOp, s: "|"}}, toks...)}
		x, err := e.filters(&nameRef{filterBodyVar})
		if err != nil {
			return nil, err
		}
		f, ok := x.(*filterExpr)
		if !ok || e.peek().kind != tkEOF {
			return nil, fmt.Errorf("bad filter block")
		}
		body, _, err := p.body("endfilter")
		if err != nil {
			return nil, err
		}
		return &filterBlock{f: f, body: body}, nil
	case "break":
		return &breakNode{}, nil
	case "continue":
		return &continueNode{}, nil
	case "generation":
		// transformers' assistant-mask marker: renders its body.
		body, _, err := p.body("endgeneration")
		if err != nil {
			return nil, err
		}
		return &ifNode{conds: []expr{&literal{true}}, bodies: [][]node{body}}, nil
	}
	return nil, fmt.Errorf("unsupported tag %q", word)
}

func (p *parser) forBlock(src string) (node, error) {
	toks, err := tokenize(src)
	if err != nil {
		return nil, err
	}
	e := &exprParser{toks: toks}
	n := &forNode{}
	for {
		t := e.next()
		if t.kind != tkName {
			return nil, fmt.Errorf("bad loop target")
		}
		n.targets = append(n.targets, t.s)
		if !e.peek().is(",") {
			break
		}
		e.next()
	}
	if !e.next().isName("in") {
		return nil, fmt.Errorf("expected 'in'")
	}
	if n.iter, err = e.orExpr(); err != nil { // no ternary: 'if' filters
		return nil, err
	}
	if e.peek().isName("if") {
		e.next()
		if n.filter, err = e.orExpr(); err != nil {
			return nil, err
		}
	}
	if e.peek().isName("recursive") {
		return nil, fmt.Errorf("recursive loops are not supported")
	}
	if e.peek().kind != tkEOF {
		return nil, fmt.Errorf("unexpected %q", e.peek().s)
	}
	body, end, err := p.body("else", "endfor")
	if err != nil {
		return nil, err
	}
	n.body = body
	if keyword(end) == "else" {
		if n.orElse, _, err = p.body("endfor"); err != nil {
			return nil, err
		}
	}
	return n, nil
}

func (p *parser) setBlock(src string) (node, error) {
	eq := -1
	for i := 0; i < len(src); i++ { // the first '=' that is not part of '=='
		if src[i] == '=' && (i+1 >= len(src) || src[i+1] != '=') && (i == 0 || !strings.ContainsRune("=!<>", rune(src[i-1]))) {
			eq = i
			break
		}
	}
	lhs := src
	if eq >= 0 {
		lhs = src[:eq]
	}
	n := &setNode{}
	for _, part := range strings.Split(lhs, ",") {
		name := strings.TrimSpace(part)
		if before, after, ok := strings.Cut(name, "."); ok {
			n.attr = strings.TrimSpace(after)
			name = strings.TrimSpace(before)
		}
		if name == "" {
			return nil, fmt.Errorf("bad set target")
		}
		n.targets = append(n.targets, name)
	}
	if eq < 0 {
		body, _, err := p.body("endset")
		if err != nil {
			return nil, err
		}
		n.body = body
		return n, nil
	}
	x, err := parseExprSource(src[eq+1:])
	if err != nil {
		return nil, err
	}
	n.x = x
	return n, nil
}

func (p *parser) macroBlock(src string) (node, error) {
	toks, err := tokenize(src)
	if err != nil {
		return nil, err
	}
	e := &exprParser{toks: toks}
	name := e.next()
	if name.kind != tkName || !e.next().is("(") {
		return nil, fmt.Errorf("bad macro header")
	}
	n := &macroNode{name: name.s}
	for !e.peek().is(")") {
		t := e.next()
		if t.kind != tkName {
			return nil, fmt.Errorf("bad macro parameter")
		}
		var def expr
		if e.peek().is("=") {
			e.next()
			if def, err = e.expr(); err != nil {
				return nil, err
			}
		}
		n.params, n.defaults = append(n.params, t.s), append(n.defaults, def)
		if e.peek().is(",") {
			e.next()
		}
	}
	e.next()
	body, _, err := p.body("endmacro")
	if err != nil {
		return nil, err
	}
	n.body = body
	return n, nil
}

func parseExprSource(src string) (expr, error) {
	toks, err := tokenize(src)
	if err != nil {
		return nil, err
	}
	e := &exprParser{toks: toks}
	x, err := e.tupleOrExpr()
	if err != nil {
		return nil, err
	}
	if e.peek().kind != tkEOF {
		return nil, fmt.Errorf("unexpected %q", e.peek().s)
	}
	return x, nil
}

type exprParser struct {
	toks []token
	pos  int
}

func (e *exprParser) peek() token { return e.toks[e.pos] }
func (e *exprParser) next() token {
	t := e.toks[e.pos]
	if t.kind != tkEOF {
		e.pos++
	}
	return t
}

func (e *exprParser) expect(op string) error {
	if t := e.next(); !t.is(op) {
		return fmt.Errorf("expected %q, got %q", op, t.s)
	}
	return nil
}

// tupleOrExpr allows a bare tuple (a, b) at the top of an expression.
func (e *exprParser) tupleOrExpr() (expr, error) {
	x, err := e.expr()
	if err != nil || !e.peek().is(",") {
		return x, err
	}
	items := []expr{x}
	for e.peek().is(",") {
		e.next()
		if e.peek().kind == tkEOF {
			break
		}
		x, err := e.expr()
		if err != nil {
			return nil, err
		}
		items = append(items, x)
	}
	return &tupleExpr{items}, nil
}

func (e *exprParser) expr() (expr, error) {
	x, err := e.orExpr()
	if err != nil {
		return nil, err
	}
	for e.peek().isName("if") {
		e.next()
		cond, err := e.orExpr()
		if err != nil {
			return nil, err
		}
		var orElse expr
		if e.peek().isName("else") {
			e.next()
			if orElse, err = e.expr(); err != nil {
				return nil, err
			}
		}
		x = &condExpr{then: x, cond: cond, orElse: orElse}
	}
	return x, nil
}

func (e *exprParser) orExpr() (expr, error) {
	x, err := e.andExpr()
	for err == nil && e.peek().isName("or") {
		e.next()
		var r expr
		if r, err = e.andExpr(); err == nil {
			x = &binaryExpr{"or", x, r}
		}
	}
	return x, err
}

func (e *exprParser) andExpr() (expr, error) {
	x, err := e.notExpr()
	for err == nil && e.peek().isName("and") {
		e.next()
		var r expr
		if r, err = e.notExpr(); err == nil {
			x = &binaryExpr{"and", x, r}
		}
	}
	return x, err
}

func (e *exprParser) notExpr() (expr, error) {
	if e.peek().isName("not") {
		e.next()
		x, err := e.notExpr()
		if err != nil {
			return nil, err
		}
		return &unaryExpr{"not", x}, nil
	}
	return e.compare()
}

func (e *exprParser) compare() (expr, error) {
	x, err := e.math1()
	if err != nil {
		return nil, err
	}
	var result expr
	for {
		t := e.peek()
		var op string
		switch {
		case t.kind == tkOp && (t.s == "==" || t.s == "!=" || t.s == "<" || t.s == ">" || t.s == "<=" || t.s == ">="):
			op = t.s
			e.next()
		case t.isName("in"):
			op = "in"
			e.next()
		case t.isName("not") && e.toks[e.pos+1].isName("in"):
			op = "notin"
			e.next()
			e.next()
		default:
			if result == nil {
				return x, nil
			}
			return result, nil
		}
		r, err := e.math1()
		if err != nil {
			return nil, err
		}
		cmp := &binaryExpr{op, x, r}
		if result == nil {
			result = cmp
		} else {
			result = &binaryExpr{"and", result, cmp}
		}
		x = r
	}
}

func (e *exprParser) math1() (expr, error) {
	x, err := e.concat()
	for err == nil && (e.peek().is("+") || e.peek().is("-")) {
		op := e.next().s
		var r expr
		if r, err = e.concat(); err == nil {
			x = &binaryExpr{op, x, r}
		}
	}
	return x, err
}

func (e *exprParser) concat() (expr, error) {
	x, err := e.math2()
	for err == nil && e.peek().is("~") {
		e.next()
		var r expr
		if r, err = e.math2(); err == nil {
			x = &binaryExpr{"~", x, r}
		}
	}
	return x, err
}

func (e *exprParser) math2() (expr, error) {
	x, err := e.pow()
	for err == nil && (e.peek().is("*") || e.peek().is("/") || e.peek().is("//") || e.peek().is("%")) {
		op := e.next().s
		var r expr
		if r, err = e.pow(); err == nil {
			x = &binaryExpr{op, x, r}
		}
	}
	return x, err
}

func (e *exprParser) pow() (expr, error) {
	x, err := e.unary(true)
	for err == nil && e.peek().is("**") {
		e.next()
		var r expr
		if r, err = e.unary(true); err == nil {
			x = &binaryExpr{"**", x, r}
		}
	}
	return x, err
}

func (e *exprParser) unary(withFilter bool) (expr, error) {
	var x expr
	var err error
	switch t := e.peek(); {
	case t.is("-") || t.is("+"):
		e.next()
		var inner expr
		if inner, err = e.unary(false); err != nil {
			return nil, err
		}
		x = &unaryExpr{t.s, inner}
	default:
		if x, err = e.primary(); err != nil {
			return nil, err
		}
		if x, err = e.postfix(x); err != nil {
			return nil, err
		}
	}
	if withFilter {
		return e.filters(x)
	}
	return x, nil
}

func (e *exprParser) primary() (expr, error) {
	t := e.next()
	switch t.kind {
	case tkString:
		s := t.s
		for e.peek().kind == tkString { // adjacent literals concatenate
			s += e.next().s
		}
		return &literal{s}, nil
	case tkInt:
		return &literal{t.i}, nil
	case tkFloat:
		return &literal{t.f}, nil
	case tkName:
		switch t.s {
		case "true", "True":
			return &literal{true}, nil
		case "false", "False":
			return &literal{false}, nil
		case "none", "None":
			return &literal{nil}, nil
		}
		return &nameRef{t.s}, nil
	case tkOp:
		switch t.s {
		case "(":
			if e.peek().is(")") {
				e.next()
				return &tupleExpr{}, nil
			}
			x, err := e.expr()
			if err != nil {
				return nil, err
			}
			if e.peek().is(",") {
				items := []expr{x}
				for e.peek().is(",") {
					e.next()
					if e.peek().is(")") {
						break
					}
					it, err := e.expr()
					if err != nil {
						return nil, err
					}
					items = append(items, it)
				}
				x = &tupleExpr{items}
			}
			return x, e.expect(")")
		case "[":
			l := &listExpr{}
			for !e.peek().is("]") {
				it, err := e.expr()
				if err != nil {
					return nil, err
				}
				l.items = append(l.items, it)
				if !e.peek().is(",") {
					break
				}
				e.next()
			}
			return l, e.expect("]")
		case "{":
			d := &dictExpr{}
			for !e.peek().is("}") {
				k, err := e.expr()
				if err != nil {
					return nil, err
				}
				if err := e.expect(":"); err != nil {
					return nil, err
				}
				v, err := e.expr()
				if err != nil {
					return nil, err
				}
				d.keys, d.vals = append(d.keys, k), append(d.vals, v)
				if !e.peek().is(",") {
					break
				}
				e.next()
			}
			return d, e.expect("}")
		}
	}
	return nil, fmt.Errorf("unexpected %q", t.s)
}

func (e *exprParser) postfix(x expr) (expr, error) {
	for {
		switch t := e.peek(); {
		case t.is("."):
			e.next()
			n := e.next()
			switch n.kind {
			case tkName:
				x = &attrRef{x, n.s}
			case tkInt:
				x = &itemRef{x, &literal{n.i}}
			default:
				return nil, fmt.Errorf("bad attribute")
			}
		case t.is("["):
			e.next()
			var parts [3]expr
			colons := 0
			for !e.peek().is("]") {
				if e.peek().is(":") {
					e.next()
					colons++
					if colons > 2 {
						return nil, fmt.Errorf("bad slice")
					}
					continue
				}
				v, err := e.expr()
				if err != nil {
					return nil, err
				}
				parts[colons] = v
			}
			e.next()
			if colons == 0 {
				x = &itemRef{x, parts[0]}
			} else {
				x = &sliceRef{x, parts[0], parts[1], parts[2]}
			}
		case t.is("("):
			e.next()
			args, kwargs, err := e.callArgs()
			if err != nil {
				return nil, err
			}
			x = &callExpr{x, args, kwargs}
		default:
			return x, nil
		}
	}
}

// callArgs parses arguments after '(' up to and including ')'.
func (e *exprParser) callArgs() ([]expr, []kwarg, error) {
	var args []expr
	var kwargs []kwarg
	for !e.peek().is(")") {
		if e.peek().kind == tkName && e.toks[e.pos+1].is("=") {
			name := e.next().s
			e.next()
			v, err := e.expr()
			if err != nil {
				return nil, nil, err
			}
			kwargs = append(kwargs, kwarg{name, v})
		} else {
			v, err := e.expr()
			if err != nil {
				return nil, nil, err
			}
			args = append(args, v)
		}
		if !e.peek().is(",") {
			break
		}
		e.next()
	}
	return args, kwargs, e.expect(")")
}

func (e *exprParser) filters(x expr) (expr, error) {
	for {
		switch t := e.peek(); {
		case t.is("|"):
			e.next()
			name := e.next()
			if name.kind != tkName {
				return nil, fmt.Errorf("bad filter name")
			}
			f := &filterExpr{x: x, name: name.s}
			if e.peek().is("(") {
				e.next()
				var err error
				if f.args, f.kwargs, err = e.callArgs(); err != nil {
					return nil, err
				}
			}
			x = f
		case t.isName("is"):
			e.next()
			te := &testExpr{x: x}
			if e.peek().isName("not") {
				e.next()
				te.negate = true
			}
			name := e.next()
			if name.kind != tkName {
				return nil, fmt.Errorf("bad test name")
			}
			te.name = name.s
			switch n := e.peek(); {
			case n.is("("):
				e.next()
				args, _, err := e.callArgs()
				if err != nil {
					return nil, err
				}
				te.args = args
			case n.kind == tkString || n.kind == tkInt || n.kind == tkFloat ||
				(n.kind == tkName && !strings.Contains(" else or and not in is if ", " "+n.s+" ")):
				arg, err := e.unary(false)
				if err != nil {
					return nil, err
				}
				te.args = []expr{arg}
			}
			x = te
		default:
			return x, nil
		}
	}
}
