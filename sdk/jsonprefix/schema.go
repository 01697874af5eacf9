package jsonprefix

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// SchemaKeywords are the JSON Schema keywords a Schema enforces; Annotations
// are accepted and ignored. Any other keyword is refused by CompileSchema,
// naming it, so that a schema is never silently enforced in part.
var (
	SchemaKeywords = []string{"type", "properties", "required", "additionalProperties", "enum", "const", "items",
		"anyOf", "oneOf", "minLength", "maxLength", "minItems", "maxItems",
		"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "$ref", "$defs", "definitions"}
	Annotations = []string{"title", "description", "default", "examples", "$schema", "$id", "$comment",
		"deprecated", "readOnly", "writeOnly", "strict"}
)

// Value kinds a schema node admits, as a bit set.
const (
	kObject uint8 = 1 << iota
	kArray
	kString
	kInteger
	kNumber // any number; implies kInteger
	kBoolean
	kNull
	kAny = kObject | kArray | kString | kInteger | kNumber | kBoolean | kNull
)

// node is one compiled schema. A nil *node admits any value.
type node struct {
	kinds    uint8
	props    []prop // declared properties, in the schema's order
	required uint64 // bit i: props[i] is required
	closed   bool   // only declared properties may appear
	items    *node
	minItems int
	maxItems int // -1: none
	minLen   int
	maxLen   int // -1: none
	enum     [][]byte
	anyOf    []*node
	// Numeric bounds; lo/hi are ±Inf when absent.
	lo, hi       float64
	loExc, hiExc bool
}

type prop struct {
	key  []byte // the name as it appears between the quotes
	node *node
}

// Schema is a compiled JSON Schema (the subset in SchemaKeywords) whose
// root is an object. It is immutable and safe for concurrent use.
type Schema struct{ root *node }

// maxProps bounds the properties of one object: which were seen is a bit
// set.
const maxProps = 64

// CompileSchema compiles a JSON Schema. Errors name the keyword (and where
// it is) that is not supported.
func CompileSchema(raw []byte) (*Schema, error) {
	c := &compiler{expanding: map[string]bool{}}
	// Local definitions ($defs, or draft-7's definitions) are what $ref
	// may point at: "#/$defs/Name" and "#/definitions/Name".
	var root struct {
		Defs        map[string]json.RawMessage `json:"$defs"`
		Definitions map[string]json.RawMessage `json:"definitions"`
	}
	_ = json.Unmarshal(raw, &root) // a malformed schema fails in compile with its own message
	c.defs = map[string]json.RawMessage{}
	for k, v := range root.Defs {
		c.defs["#/$defs/"+k] = v
	}
	for k, v := range root.Definitions {
		c.defs["#/definitions/"+k] = v
	}
	n, err := c.compile(raw, "schema")
	if err != nil {
		return nil, err
	}
	if n != nil && n.kinds&kObject == 0 && !anyBranch(n, kObject) {
		return nil, fmt.Errorf("schema: the root must be an object (type object)")
	}
	return &Schema{root: n}, nil
}

func anyBranch(n *node, k uint8) bool {
	for _, b := range n.anyOf {
		if b == nil || b.kinds&k != 0 {
			return true
		}
	}
	return false
}

// compiler holds what compiling one schema shares: the definitions $ref
// may name and the references being expanded (a reference inside its own
// expansion is recursive, which a finite prefix validator cannot hold).
type compiler struct {
	defs      map[string]json.RawMessage
	expanding map[string]bool
}

func (c *compiler) ref(r json.RawMessage, kw map[string]json.RawMessage, at string) (*node, error) {
	var name string
	if err := json.Unmarshal(r, &name); err != nil {
		return nil, fmt.Errorf("%s.$ref: expected a string", at)
	}
	for k := range kw {
		if k != "$ref" && k != "$defs" && k != "definitions" && !slices.Contains(Annotations, k) {
			return nil, fmt.Errorf("%s: keyword %q next to $ref is not supported", at, k)
		}
	}
	def, ok := c.defs[name]
	if !ok {
		return nil, fmt.Errorf("%s.$ref: %q is not supported (only #/$defs/NAME and #/definitions/NAME of this schema)", at, name)
	}
	if c.expanding[name] {
		return nil, fmt.Errorf("%s.$ref: %q refers to itself; recursive schemas are not supported", at, name)
	}
	c.expanding[name] = true
	defer delete(c.expanding, name)
	return c.compile(def, at+"("+name+")")
}

func (c *compiler) compile(raw []byte, at string) (*node, error) {
	t := bytes.TrimSpace(raw)
	switch string(t) {
	case "true", "{}":
		return nil, nil
	case "false":
		return nil, fmt.Errorf("%s: the schema false admits nothing", at)
	}
	var kw map[string]json.RawMessage
	if err := json.Unmarshal(t, &kw); err != nil {
		return nil, fmt.Errorf("%s: a schema must be an object or a boolean: %v", at, err)
	}
	keys := make([]string, 0, len(kw))
	for k := range kw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !slices.Contains(SchemaKeywords, k) && !slices.Contains(Annotations, k) {
			return nil, fmt.Errorf("%s: keyword %q is not supported (supported: %s)", at, k, strings.Join(SchemaKeywords, ", "))
		}
	}
	if r, ok := kw["$ref"]; ok {
		return c.ref(r, kw, at)
	}
	n := &node{kinds: kAny, maxItems: -1, maxLen: -1, lo: math.Inf(-1), hi: math.Inf(1)}
	if r, ok := kw["type"]; ok {
		k, err := kindsOf(r, at)
		if err != nil {
			return nil, err
		}
		n.kinds = k
	} else if _, ok := kw["properties"]; ok {
		n.kinds = kObject
	}
	for _, name := range []string{"anyOf", "oneOf"} {
		r, ok := kw[name]
		if !ok {
			continue
		}
		if n.anyOf != nil {
			return nil, fmt.Errorf("%s: anyOf and oneOf together are not supported", at)
		}
		var branches []json.RawMessage
		if err := json.Unmarshal(r, &branches); err != nil || len(branches) == 0 {
			return nil, fmt.Errorf("%s.%s: expected a non-empty array of schemas", at, name)
		}
		seen := uint8(0)
		for i, b := range branches {
			bn, err := c.compile(b, fmt.Sprintf("%s.%s[%d]", at, name, i))
			if err != nil {
				return nil, err
			}
			k := uint8(kAny)
			if bn != nil {
				k = bn.kinds
			}
			if k&kNumber != 0 {
				k |= kInteger
			}
			// Branches that differ in type make the first byte of a value
			// pick the branch, and make anyOf and oneOf the same thing.
			if seen&k != 0 {
				return nil, fmt.Errorf("%s.%s[%d]: branches that accept the same type are not supported; %s is supported over different types only", at, name, i, name)
			}
			seen |= k
			n.anyOf = append(n.anyOf, bn)
		}
		if len(keys) > 0 {
			for _, k := range keys {
				if k != name && k != "$defs" && k != "definitions" && !slices.Contains(Annotations, k) {
					return nil, fmt.Errorf("%s: keyword %q next to %s is not supported", at, k, name)
				}
			}
		}
		n.kinds = seen
	}
	if r, ok := kw["properties"]; ok {
		if err := n.compileProps(c, r, kw, at); err != nil {
			return nil, err
		}
	} else if r, ok := kw["required"]; ok && rawNonEmptyArray(r) {
		return nil, fmt.Errorf("%s.required: required without properties is not supported", at)
	}
	if r, ok := kw["additionalProperties"]; ok {
		if s := string(bytes.TrimSpace(r)); s != "true" && s != "false" {
			return nil, fmt.Errorf("%s.additionalProperties: only true or false is supported", at)
		}
	}
	if r, ok := kw["items"]; ok {
		it, err := c.compile(r, at+".items")
		if err != nil {
			return nil, err
		}
		n.items = it
	}
	for name, dst := range map[string]*int{"minItems": &n.minItems, "maxItems": &n.maxItems, "minLength": &n.minLen, "maxLength": &n.maxLen} {
		if r, ok := kw[name]; ok {
			v, err := strconv.Atoi(string(bytes.TrimSpace(r)))
			if err != nil || v < 0 {
				return nil, fmt.Errorf("%s.%s: expected a non-negative integer", at, name)
			}
			*dst = v
		}
	}
	if n.maxItems >= 0 && n.minItems > n.maxItems || n.maxLen >= 0 && n.minLen > n.maxLen {
		return nil, fmt.Errorf("%s: a minimum above its maximum admits nothing", at)
	}
	if err := n.compileBounds(kw, at); err != nil {
		return nil, err
	}
	if err := n.compileEnum(kw, at); err != nil {
		return nil, err
	}
	return n, nil
}

func rawNonEmptyArray(r json.RawMessage) bool {
	var a []json.RawMessage
	return json.Unmarshal(r, &a) == nil && len(a) > 0
}

func kindsOf(r json.RawMessage, at string) (uint8, error) {
	var names []string
	var one string
	if json.Unmarshal(r, &one) == nil {
		names = []string{one}
	} else if err := json.Unmarshal(r, &names); err != nil {
		return 0, fmt.Errorf("%s.type: expected a type name or an array of them", at)
	}
	k := uint8(0)
	for _, t := range names {
		switch t {
		case "object":
			k |= kObject
		case "array":
			k |= kArray
		case "string":
			k |= kString
		case "integer":
			k |= kInteger
		case "number":
			k |= kNumber | kInteger
		case "boolean":
			k |= kBoolean
		case "null":
			k |= kNull
		default:
			return 0, fmt.Errorf("%s.type: unknown type %q", at, t)
		}
	}
	if k == 0 {
		return 0, fmt.Errorf("%s.type: an empty list of types admits nothing", at)
	}
	return k, nil
}

func (n *node) compileProps(c *compiler, r json.RawMessage, kw map[string]json.RawMessage, at string) error {
	// The order of the properties is the schema's: output follows it, as
	// a model trained on the schema expects.
	dec := json.NewDecoder(bytes.NewReader(r))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return fmt.Errorf("%s.properties: expected an object", at)
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return fmt.Errorf("%s.properties: %v", at, err)
		}
		name := t.(string)
		var sub json.RawMessage
		if err := dec.Decode(&sub); err != nil {
			return fmt.Errorf("%s.properties.%s: %v", at, name, err)
		}
		pn, err := c.compile(sub, at+".properties."+name)
		if err != nil {
			return err
		}
		key, _ := marshalNoEscape(name)
		n.props = append(n.props, prop{key: key[1 : len(key)-1], node: pn})
	}
	if len(n.props) > maxProps {
		return fmt.Errorf("%s.properties: at most %d properties are supported, got %d", at, maxProps, len(n.props))
	}
	n.closed = true
	if r, ok := kw["required"]; ok {
		var req []string
		if err := json.Unmarshal(r, &req); err != nil {
			return fmt.Errorf("%s.required: expected an array of property names", at)
		}
		for _, name := range req {
			key, _ := marshalNoEscape(name)
			i := slices.IndexFunc(n.props, func(p prop) bool { return bytes.Equal(p.key, key[1:len(key)-1]) })
			if i < 0 {
				return fmt.Errorf("%s.required: %q is not in properties", at, name)
			}
			n.required |= 1 << i
		}
	}
	return nil
}

func (n *node) compileBounds(kw map[string]json.RawMessage, at string) error {
	num := func(name string) (float64, bool, error) {
		r, ok := kw[name]
		if !ok {
			return 0, false, nil
		}
		v, err := strconv.ParseFloat(string(bytes.TrimSpace(r)), 64)
		if err != nil {
			return 0, false, fmt.Errorf("%s.%s: expected a number", at, name)
		}
		return v, true, nil
	}
	for _, b := range []struct {
		name string
		dst  *float64
		exc  *bool
		isLo bool
	}{{"minimum", &n.lo, nil, true}, {"maximum", &n.hi, nil, false}, {"exclusiveMinimum", &n.lo, &n.loExc, true}, {"exclusiveMaximum", &n.hi, &n.hiExc, false}} {
		v, ok, err := num(b.name)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		if b.isLo && v >= *b.dst || !b.isLo && v <= *b.dst {
			*b.dst = v
			if b.exc != nil {
				*b.exc = true
			}
		}
	}
	if n.lo > n.hi || n.lo == n.hi && (n.loExc || n.hiExc) {
		return fmt.Errorf("%s: numeric bounds admit nothing", at)
	}
	return nil
}

func (n *node) compileEnum(kw map[string]json.RawMessage, at string) error {
	var vals []json.RawMessage
	if r, ok := kw["const"]; ok {
		vals = []json.RawMessage{r}
	}
	if r, ok := kw["enum"]; ok {
		if vals != nil {
			return fmt.Errorf("%s: const and enum together are not supported", at)
		}
		if err := json.Unmarshal(r, &vals); err != nil || len(vals) == 0 {
			return fmt.Errorf("%s.enum: expected a non-empty array", at)
		}
	}
	if vals == nil {
		return nil
	}
	kinds := uint8(0)
	for i, v := range vals {
		var x any
		if err := json.Unmarshal(v, &x); err != nil {
			return fmt.Errorf("%s.enum[%d]: %v", at, i, err)
		}
		switch x.(type) {
		case map[string]any, []any:
			return fmt.Errorf("%s.enum[%d]: enum and const values that are objects or arrays are not supported", at, i)
		case string:
			kinds |= kString
		case float64:
			kinds |= kNumber | kInteger
		case bool:
			kinds |= kBoolean
		case nil:
			kinds |= kNull
		}
		// The canonical text is what the model must write, byte for byte.
		b, err := marshalNoEscape(x)
		if err != nil {
			return fmt.Errorf("%s.enum[%d]: %v", at, i, err)
		}
		n.enum = append(n.enum, b)
	}
	n.kinds &= kinds
	if n.kinds == 0 {
		return fmt.Errorf("%s: no enum or const value has the schema's type", at)
	}
	return nil
}

func marshalNoEscape(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

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
