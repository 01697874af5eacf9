package jsonprefix

import (
	"bytes"
	"math"
	"slices"
	"strconv"
	"strings"
)

// frame is an open object or array and what its schema still allows.
type frame struct {
	node  *node
	array bool
	seen  uint64 // object: properties written
	last  int    // object: index of the last property written, -1 before
	count int    // array: items begun
	cur   *node  // object: the schema of the value after the current key
}

// scalar is the string, number or literal value being written.
type scalar struct {
	node   *node
	active bool
	number bool
	str    bool
	chars  int
}

// SchemaState is where a JSON object's text stands against a Schema after
// the bytes fed so far: the JSON grammar of State plus what the schema
// allows at each point. Unlike State it is not a value: use Clone to try
// bytes on a copy; Accepts and AcceptsByte do that internally without
// allocating.
type SchemaState struct {
	syn    State
	root   *node
	frames []frame
	key    []byte // the object key being written
	buf    []byte // the scalar being written, when its node has an enum or bounds
	sc     scalar
	// scratch is where Accepts tries bytes.
	scratch *SchemaState
}

// NewSchemaState starts an object of schema s, with at most maxSpace
// whitespace bytes in a row (see WithMaxSpace).
func NewSchemaState(s *Schema, maxSpace int) *SchemaState {
	return &SchemaState{syn: WithMaxSpace(maxSpace), root: s.root}
}

func (s *SchemaState) copyFrom(o *SchemaState) {
	s.syn, s.root, s.sc = o.syn, o.root, o.sc
	s.frames = append(s.frames[:0], o.frames...)
	s.key = append(s.key[:0], o.key...)
	s.buf = append(s.buf[:0], o.buf...)
}

func (s *SchemaState) try() *SchemaState {
	if s.scratch == nil {
		s.scratch = &SchemaState{}
	}
	s.scratch.copyFrom(s)
	return s.scratch
}

// Feed advances over b and reports true when the text is still a valid
// prefix of an object the schema admits; otherwise the state is unchanged.
func (s *SchemaState) Feed(b []byte) bool {
	t := s.try()
	for _, c := range b {
		if !t.step(c) {
			return false
		}
	}
	s.copyFrom(t)
	return true
}

// Accepts reports whether b would keep the text a valid prefix.
func (s *SchemaState) Accepts(b []byte) bool {
	if s.plainText(b) {
		// Inside a string the schema only counts characters: the grammar
		// alone decides, without copying the schema's stack. This is most
		// of a vocabulary scan.
		return s.syn.Accepts(b)
	}
	t := s.try()
	for _, c := range b {
		if !t.step(c) {
			return false
		}
	}
	return true
}

// plainText reports whether b is text inside a string value whose schema
// cannot refuse it: no quote or backslash, no enum, and short enough for
// any maxLength.
func (s *SchemaState) plainText(b []byte) bool {
	if !s.sc.active || !s.sc.str || s.syn.mode != mString || bytes.ContainsAny(b, "\"\\") {
		return false
	}
	n := s.sc.node
	return n == nil || n.enum == nil && (n.maxLen < 0 || s.sc.chars+len(b) <= n.maxLen)
}

// PlainString reports whether the text stands inside a string value at a
// character boundary, where the schema admits any text without a quote, a
// backslash or a control character; room is how many more characters fit
// (-1: no limit). Keys and enum strings are never plain.
func (s *SchemaState) PlainString() (ok bool, room int) {
	if !s.sc.active || !s.sc.str || s.syn.mode != mString {
		return false, 0
	}
	n := s.sc.node
	switch {
	case n == nil || n.maxLen < 0 && n.enum == nil:
		return true, -1
	case n.enum != nil:
		return false, 0
	}
	return true, max(n.maxLen-s.sc.chars, 0)
}

// AcceptsByte reports whether c would keep the text a valid prefix.
func (s *SchemaState) AcceptsByte(c byte) bool { return s.try().step(c) }

// Complete reports whether the top-level object has been closed.
func (s *SchemaState) Complete() bool { return s.syn.Complete() }

// Started reports whether anything but whitespace has been fed.
func (s *SchemaState) Started() bool { return s.syn.Started() }

func isNumByte(c byte) bool {
	return c >= '0' && c <= '9' || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'
}

// step takes one byte: the grammar first, then the schema.
func (s *SchemaState) step(c byte) bool {
	pre := s.syn
	if !s.syn.step(c) {
		return false
	}
	mode := pre.mode
	if s.sc.active && s.sc.number && mode >= mNumMinus && mode <= mNumExp {
		if isNumByte(c) {
			return s.numberByte(c)
		}
		if !s.endScalar() {
			return false
		}
		mode = mAfter
	}
	switch mode {
	case mStart, mValue, mValueOrEnd:
		if isSpace(c) {
			return true
		}
		if c == ']' {
			return s.closeContainer()
		}
		return s.startValue(c)
	case mKeyOrEnd, mKey:
		switch c {
		case '"':
			s.key = s.key[:0]
			return s.keyCanStart()
		case '}':
			return s.closeContainer()
		}
		return true
	case mColon:
		return true
	case mAfter:
		switch c {
		case ',':
			return s.comma()
		case '}', ']':
			return s.closeContainer()
		}
		return true
	case mString, mEscape, mHex, mUTF8:
		if pre.key {
			return s.keyByte(c, mode == mString && c == '"')
		}
		return s.stringByte(c, mode)
	case mLiteral:
		if s.sc.node != nil && s.sc.node.enum != nil {
			s.buf = append(s.buf, c)
			if !s.enumPrefix() {
				return false
			}
		}
		if s.syn.mode != mLiteral {
			return s.endScalar()
		}
		return true
	}
	return true
}

func (s *SchemaState) top() *frame {
	if len(s.frames) == 0 {
		return nil
	}
	return &s.frames[len(s.frames)-1]
}

// expected is the schema of the value about to start.
func (s *SchemaState) expected() *node {
	f := s.top()
	switch {
	case f == nil:
		return s.root
	case f.node == nil:
		return nil
	case f.array:
		return f.node.items
	}
	return f.cur
}

func kindOf(c byte) uint8 {
	switch {
	case c == '{':
		return kObject
	case c == '[':
		return kArray
	case c == '"':
		return kString
	case c == '-' || c >= '0' && c <= '9':
		return kInteger | kNumber
	case c == 't' || c == 'f':
		return kBoolean
	case c == 'n':
		return kNull
	}
	return 0
}

func (n *node) admits(c byte) bool {
	if n == nil {
		return true
	}
	if n.kinds&kindOf(c) == 0 {
		return false
	}
	if n.enum != nil {
		return slices.ContainsFunc(n.enum, func(e []byte) bool { return e[0] == c })
	}
	return true
}

// branch is the node a value starting with c is held to: the anyOf branch
// whose type it is.
func (n *node) branch(c byte) (*node, bool) {
	if n == nil {
		return nil, true
	}
	if n.anyOf == nil {
		return n, n.admits(c)
	}
	for _, b := range n.anyOf {
		if b.admits(c) {
			return b, true
		}
	}
	return nil, false
}

func (s *SchemaState) startValue(c byte) bool {
	if f := s.top(); f != nil && f.array && f.node != nil {
		if f.node.maxItems >= 0 && f.count >= f.node.maxItems {
			return false
		}
		f.count++
	}
	n, ok := s.expected().branch(c)
	if !ok {
		return false
	}
	switch c {
	case '{', '[':
		s.frames = append(s.frames, frame{node: n, array: c == '[', last: -1})
		return true
	}
	s.sc = scalar{node: n, active: true, str: c == '"', number: c == '-' || c >= '0' && c <= '9'}
	s.buf = append(s.buf[:0], c)
	if n == nil {
		return true
	}
	if n.enum != nil && !s.enumPrefix() {
		return false
	}
	if s.sc.number {
		return s.numberFeasible()
	}
	return true
}

func (s *SchemaState) enumPrefix() bool {
	return slices.ContainsFunc(s.sc.node.enum, func(e []byte) bool { return bytes.HasPrefix(e, s.buf) })
}

// endScalar checks a finished scalar against its schema.
func (s *SchemaState) endScalar() bool {
	sc := s.sc
	s.sc = scalar{}
	n := sc.node
	if n == nil {
		return true
	}
	if n.enum != nil && !slices.ContainsFunc(n.enum, func(e []byte) bool { return bytes.Equal(e, s.buf) }) {
		return false
	}
	if sc.str && sc.chars < n.minLen {
		return false
	}
	if sc.number {
		v, err := strconv.ParseFloat(string(s.buf), 64)
		if err != nil {
			return false
		}
		return inBounds(n, v)
	}
	return true
}

func inBounds(n *node, v float64) bool {
	if v < n.lo || v == n.lo && n.loExc || v > n.hi || v == n.hi && n.hiExc {
		return false
	}
	return true
}

func (s *SchemaState) numberByte(c byte) bool {
	s.buf = append(s.buf, c)
	n := s.sc.node
	if n == nil {
		return true
	}
	if n.kinds&kNumber == 0 && (c == '.' || c == 'e' || c == 'E') {
		return false // an integer
	}
	if n.enum != nil && !s.enumPrefix() {
		return false
	}
	return s.numberFeasible()
}

// numberFeasible reports whether the number written so far can still end
// inside the node's bounds. Bounded numbers are written without exponent,
// so that the reachable values are an interval or two.
func (s *SchemaState) numberFeasible() bool {
	n := s.sc.node
	if math.IsInf(n.lo, -1) && math.IsInf(n.hi, 1) {
		return true
	}
	b := s.buf
	if bytes.ContainsAny(b, "eE") {
		return false
	}
	neg := b[0] == '-'
	digits := b
	if neg {
		digits = b[1:]
	}
	// reach is the set of values the prefix can still become, as
	// magnitudes: [lo, hi] or, while more integer digits may come,
	// also [lo2, +Inf).
	var lo, hi, lo2 float64
	more := false
	switch {
	case len(digits) == 0: // "-": any negative
		lo, hi = 0, math.Inf(1)
	case bytes.IndexByte(digits, '.') >= 0:
		x, _ := strconv.ParseFloat(strings.TrimSuffix(string(digits), "."), 64)
		frac := len(digits) - bytes.IndexByte(digits, '.') - 1
		lo, hi = x, x+math.Pow(10, -float64(frac))
	default:
		x, _ := strconv.ParseFloat(string(digits), 64)
		lo, hi = x, x+1
		if x != 0 {
			more, lo2 = true, x*10
		}
	}
	// fits reports whether some value of magnitude in [a, z) with the
	// number's sign is in bounds.
	fits := func(a, z float64) bool {
		if neg {
			top, bottom := -a, -z // values in (bottom, top]
			return (top > n.lo || top == n.lo && !n.loExc) && bottom < n.hi
		}
		return (a < n.hi || a == n.hi && !n.hiExc) && z > n.lo
	}
	return fits(lo, hi) || more && fits(lo2, math.Inf(1))
}

func (s *SchemaState) stringByte(c byte, mode mode) bool {
	n := s.sc.node
	if n == nil {
		if mode == mString && c == '"' {
			s.sc = scalar{}
		}
		return true
	}
	if n.enum != nil {
		s.buf = append(s.buf, c)
		if !s.enumPrefix() {
			return false
		}
	}
	if mode == mString {
		if c == '"' {
			return s.endScalar()
		}
		// A character begins with an escape or a byte that is not a
		// UTF-8 continuation.
		s.sc.chars++
		if n.maxLen >= 0 && s.sc.chars > n.maxLen {
			return false
		}
	}
	return true
}

// nextProps calls fn with the index of each property that may come next in
// an object: declared ones after the last written, none skipping a
// required one.
func nextProps(f *frame, fn func(i int) bool) bool {
	for i := f.last + 1; i < len(f.node.props); i++ {
		if fn(i) {
			return true
		}
		if f.node.required&(1<<i) != 0 {
			return false
		}
	}
	return false
}

func (s *SchemaState) keyCanStart() bool {
	f := s.top()
	if f.node == nil || !f.node.closed {
		return true
	}
	return nextProps(f, func(int) bool { return true })
}

func (s *SchemaState) keyByte(c byte, closing bool) bool {
	f := s.top()
	if f.node == nil || !f.node.closed {
		if closing {
			f.cur = nil
		}
		return true
	}
	if closing {
		return nextProps(f, func(i int) bool {
			if !bytes.Equal(f.node.props[i].key, s.key) {
				return false
			}
			f.last, f.seen, f.cur = i, f.seen|1<<i, f.node.props[i].node
			return true
		})
	}
	s.key = append(s.key, c)
	return nextProps(f, func(i int) bool { return bytes.HasPrefix(f.node.props[i].key, s.key) })
}

func (s *SchemaState) comma() bool {
	f := s.top()
	if f.node == nil {
		return true
	}
	if f.array {
		return f.node.maxItems < 0 || f.count < f.node.maxItems
	}
	if !f.node.closed {
		return true
	}
	return nextProps(f, func(int) bool { return true })
}

func (s *SchemaState) closeContainer() bool {
	f := s.top()
	if f == nil {
		return false
	}
	if n := f.node; n != nil {
		if f.array && f.count < n.minItems {
			return false
		}
		if !f.array && n.required&^f.seen != 0 {
			return false
		}
	}
	s.frames = s.frames[:len(s.frames)-1]
	return true
}
