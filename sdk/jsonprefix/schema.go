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
