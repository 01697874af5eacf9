package chat

import (
	"encoding/json"
	"strings"
)

// jsonLexer scans one JSON value a byte at a time. Besides telling where the
// value ends, it knows after every byte whether the text so far can be made
// valid JSON by appending closers (a "safe point"), which is what lets tool
// arguments stream while staying valid JSON even when generation stops
// mid-value.
type jsonLexer struct {
	stack  []byte // open containers, '{' or '['
	state  lexState
	isKey  bool   // the string being scanned is an object key
	lit    string // rest of an expected literal (true, false, null)
	num    []byte // number being scanned
	esc    int    // 0 none; 1 after '\'; 2..5 reading \u hex digits
	utf8   int    // continuation bytes still expected inside a string
	done   bool
	failed bool

	// safe is set after each step when the text consumed so far plus
	// closer() is valid JSON.
	safe bool
	// safeBefore is set when a number ended just before the byte fed
	// (the text before it was safe, closed by closeBefore).
	safeBefore  bool
	closeBefore string
	// events, when set, hears where keys and values start and end.
	events func(ev lexEvent, depth int, consumed bool)
}

type lexState uint8

const (
	lsValue       lexState = iota // expecting a value
	lsObjFirstKey                 // after '{': a key or '}'
	lsObjKey                      // after ',' in an object: a key
	lsColon                       // after a key
	lsArrFirst                    // after '[': a value or ']'
	lsString
	lsNumber
	lsLiteral
	lsAfterValue
)

type lexEvent uint8

const (
	evKeyStart lexEvent = iota
	evKeyEnd
	evValueStart
	evValueEnd
)

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func (lx *jsonLexer) emit(ev lexEvent, consumed bool) {
	if lx.events != nil {
		lx.events(ev, len(lx.stack), consumed)
	}
}

// step feeds one byte. It returns false when the byte is not part of the
// value: the value ended just before it (done is then set) or it is invalid
// (failed is set).
func (lx *jsonLexer) step(c byte) bool {
	lx.safeBefore = false
	return lx.dispatch(c)
}

func (lx *jsonLexer) dispatch(c byte) bool {
	lx.safe = false
	if lx.done || lx.failed {
		return false
	}
	switch lx.state {
	case lsValue, lsArrFirst:
		if isJSONSpace(c) {
			return true
		}
		if lx.state == lsArrFirst && c == ']' {
			return lx.closeContainer(c)
		}
		lx.emit(evValueStart, false)
		switch {
		case c == '{':
			lx.stack = append(lx.stack, '{')
			lx.state = lsObjFirstKey
			lx.safe = true
		case c == '[':
			lx.stack = append(lx.stack, '[')
			lx.state = lsArrFirst
			lx.safe = true
		case c == '"':
			lx.state, lx.isKey = lsString, false
			lx.safe = true
		case c == '-' || (c >= '0' && c <= '9'):
			lx.state = lsNumber
			lx.num = append(lx.num[:0], c)
		case c == 't':
			lx.state, lx.lit = lsLiteral, "rue"
		case c == 'f':
			lx.state, lx.lit = lsLiteral, "alse"
		case c == 'n':
			lx.state, lx.lit = lsLiteral, "ull"
		default:
			lx.failed = true
			return false
		}
		return true
	case lsObjFirstKey, lsObjKey:
		if isJSONSpace(c) {
			return true
		}
		if c == '}' && lx.state == lsObjFirstKey {
			return lx.closeContainer(c)
		}
		if c != '"' {
			lx.failed = true
			return false
		}
		lx.emit(evKeyStart, false)
		lx.state, lx.isKey = lsString, true
		return true
	case lsColon:
		if isJSONSpace(c) {
			return true
		}
		if c != ':' {
			lx.failed = true
			return false
		}
		lx.state = lsValue
		return true
	case lsString:
		return lx.stringByte(c)
	case lsNumber:
		if (c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-' {
			lx.num = append(lx.num, c)
			return true
		}
		if !json.Valid(lx.num) {
			lx.failed = true
			return false
		}
		lx.valueEnd(false)
		lx.safeBefore, lx.closeBefore = true, lx.closer()
		if lx.done {
			return false
		}
		return lx.dispatch(c)
	case lsLiteral:
		if lx.lit == "" || c != lx.lit[0] {
			lx.failed = true
			return false
		}
		lx.lit = lx.lit[1:]
		if lx.lit == "" {
			lx.valueEnd(true)
			lx.safe = true
		}
		return true
	case lsAfterValue:
		if isJSONSpace(c) {
			return true
		}
		top := lx.stack[len(lx.stack)-1]
		switch {
		case c == ',' && top == '{':
			lx.state = lsObjKey
		case c == ',':
			lx.state = lsValue
		case c == '}' || c == ']':
			return lx.closeContainer(c)
		default:
			lx.failed = true
			return false
		}
		return true
	}
	lx.failed = true
	return false
}

func (lx *jsonLexer) closeContainer(c byte) bool {
	top := lx.stack[len(lx.stack)-1]
	if (c == '}') != (top == '{') {
		lx.failed = true
		return false
	}
	lx.stack = lx.stack[:len(lx.stack)-1]
	lx.valueEnd(true)
	lx.safe = true
	return true
}

// valueEnd records that a value (or key) just ended.
func (lx *jsonLexer) valueEnd(consumed bool) {
	if lx.state == lsString && lx.isKey {
		lx.emit(evKeyEnd, consumed)
		lx.state = lsColon
		return
	}
	lx.emit(evValueEnd, consumed)
	if len(lx.stack) == 0 {
		lx.done = true
		return
	}
	lx.state = lsAfterValue
}

func (lx *jsonLexer) stringByte(c byte) bool {
	if lx.utf8 > 0 {
		if c&0xC0 != 0x80 {
			lx.failed = true
			return false
		}
		lx.utf8--
		lx.safe = lx.utf8 == 0 && !lx.isKey
		return true
	}
	switch {
	case lx.esc == 1:
		switch c {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			lx.esc = 0
		case 'u':
			lx.esc = 2
		default:
			lx.failed = true
			return false
		}
	case lx.esc >= 2:
		if !isHex(c) {
			lx.failed = true
			return false
		}
		lx.esc++
		if lx.esc == 6 {
			lx.esc = 0
		}
	case c == '\\':
		lx.esc = 1
	case c == '"':
		wasKey := lx.isKey
		lx.valueEnd(true)
		lx.safe = !wasKey
		return true
	case c < 0x20:
		lx.failed = true
		return false
	case c >= 0xC0:
		switch {
		case c >= 0xF0:
			lx.utf8 = 3
		case c >= 0xE0:
			lx.utf8 = 2
		default:
			lx.utf8 = 1
		}
	}
	lx.safe = lx.esc == 0 && lx.utf8 == 0 && !lx.isKey
	return true
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// closer is what makes the text up to the last safe point valid JSON. It is
// only meaningful right after a step that set safe.
func (lx *jsonLexer) closer() string {
	var b strings.Builder
	if lx.state == lsString && !lx.isKey {
		b.WriteByte('"')
	}
	for i := len(lx.stack) - 1; i >= 0; i-- {
		if lx.stack[i] == '{' {
			b.WriteByte('}')
		} else {
			b.WriteByte(']')
		}
	}
	return b.String()
}

// jsonStreamer passes one JSON value through in fragments that always end at
// safe points, so that the fragments plus finish() form valid JSON however
// early the input stops.
type jsonStreamer struct {
	lx        jsonLexer
	pending   []byte // bytes after the last safe point
	ready     []byte // bytes up to the last safe point, not yet taken
	safeClose string // closer at the last safe point
	started   bool
}

// feed consumes bytes of s until the value ends. It returns how many bytes
// it consumed; fewer than len(s) means the value ended (or broke) there.
func (st *jsonStreamer) feed(s string) int {
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := st.lx.step(c)
		if st.lx.safeBefore { // a number ended just before c
			st.ready = append(st.ready, st.pending...)
			st.pending = st.pending[:0]
			st.safeClose = st.lx.closeBefore
		}
		if !ok {
			return i
		}
		if !st.started {
			if isJSONSpace(c) {
				continue // leading whitespace is not worth sending
			}
			st.started = true
		}
		st.pending = append(st.pending, c)
		if st.lx.safe {
			st.commit()
		}
		if st.lx.done {
			return i + 1
		}
	}
	return len(s)
}

func (st *jsonStreamer) commit() {
	st.ready = append(st.ready, st.pending...)
	st.pending = st.pending[:0]
	if !st.lx.done {
		st.safeClose = st.lx.closer()
	} else {
		st.safeClose = ""
	}
}

// take returns the committed fragment.
func (st *jsonStreamer) take() string {
	if len(st.ready) == 0 {
		return ""
	}
	s := string(st.ready)
	st.ready = st.ready[:0]
	return s
}

// finish returns what closes the value: nothing when it ended by itself,
// else the closers for the last safe point ("{}" when nothing was safe).
func (st *jsonStreamer) finish() string {
	if st.lx.done && !st.lx.failed {
		return st.take()
	}
	s := st.take()
	if !st.startedSafe() {
		return "{}"
	}
	return s + st.safeClose
}

func (st *jsonStreamer) startedSafe() bool { return st.safeClose != "" || st.lx.done }
