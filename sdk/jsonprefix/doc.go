// Package jsonprefix decides, byte by byte, whether text is still the
// beginning of a JSON object, and whether that object is complete. It is
// the grammar behind response_format json_object: a sampler checks each
// candidate token's bytes against a copy of the state and keeps only tokens
// the object can continue with.
//
// A State is a small value (a pushdown automaton whose stack is a bit per
// nesting level), so checking a candidate is a copy and a few byte steps,
// with no allocation. The grammar is RFC 8259 with the top-level value
// restricted to an object: strings must be valid UTF-8 without control
// characters (escapes, \uXXXX included, are checked for form; lone
// surrogate escapes are accepted, as encoding/json does), numbers follow the
// JSON number syntax, and only whitespace may follow the closing brace.
// Nesting deeper than MaxDepth is refused.
package jsonprefix
