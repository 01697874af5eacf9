package jsonprefix

// MaxDepth is the deepest nesting of objects and arrays a State accepts.
const MaxDepth = 256

type mode uint8

const (
	mStart      mode = iota // before the top-level '{'
	mValue                  // a value must come (after ':' or an array's ',')
	mValueOrEnd             // after '[': a value or ']'
	mKeyOrEnd               // after '{': a key or '}'
	mKey                    // after an object's ',': a key
	mColon                  // after a key
	mAfter                  // after a value inside a container: ',' or the closing bracket
	mString                 // inside a string
	mEscape                 // after a backslash in a string
	mHex                    // inside \uXXXX; n digits left
	mUTF8                   // inside a multi-byte character; n bytes left, next in [lo, hi]
	mNumMinus               // after '-'
	mNumZero                // after a leading '0'
	mNumInt                 // in the integer digits
	mNumDot                 // after '.'
	mNumFrac                // in the fraction digits
	mNumE                   // after 'e' or 'E'
	mNumESign               // after the exponent's sign
	mNumExp                 // in the exponent digits
	mLiteral                // in true, false or null; n bytes matched
	mDone                   // the top-level object is closed
)

var literals = [...]string{"true", "false", "null"}

// State is where a JSON object's text stands after the bytes fed so far.
// The zero value expects the object's opening brace (after optional
// whitespace). States are values: copy one to try bytes without changing
// the original.
type State struct {
	stack [MaxDepth / 64]uint64 // bit set: the container at that depth is an array
	depth uint16
	mode  mode
	key   bool  // the string being read is an object key
	lit   uint8 // which literal (index into literals)
	n     uint8
	lo    uint8
	hi    uint8
	// spaces counts the whitespace bytes in a row outside strings;
	// maxSpace (0: no limit) caps it.
	spaces   uint16
	maxSpace uint16
}

// WithMaxSpace returns a fresh State that also refuses more than n
// whitespace bytes in a row outside strings (n <= 0: no limit). The JSON
// grammar sets no such limit; a sampler wants one so that a model fond of
// newlines cannot pad the object forever.
func WithMaxSpace(n int) State {
	return State{maxSpace: uint16(min(max(n, 0), 1<<16-1))}
}

// Feed advances the state over b and reports true when the text is still a
// valid prefix; when it is not, the state is left as it was.
func (s *State) Feed(b []byte) bool {
	t := *s
	for _, c := range b {
		if !t.step(c) {
			return false
		}
	}
	*s = t
	return true
}

// Accepts reports whether b would keep the text a valid prefix.
func (s State) Accepts(b []byte) bool { return s.Feed(b) }

// AcceptsByte reports whether c would keep the text a valid prefix.
func (s State) AcceptsByte(c byte) bool { return s.step(c) }

// Complete reports whether the top-level object has been closed. Only
// whitespace can follow.
func (s State) Complete() bool { return s.mode == mDone }

// Started reports whether anything but whitespace has been fed.
func (s State) Started() bool { return s.mode != mStart }

// PlainString reports whether the text stands inside a string at a
// character boundary, where any text without a quote, a backslash or a
// control character fits; room is how many more characters fit (-1: no
// limit).
func (s State) PlainString() (ok bool, room int) { return s.mode == mString, -1 }

// Depth is the number of objects and arrays open.
func (s State) Depth() int { return int(s.depth) }

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

func (s *State) inArray() bool { return s.stack[(s.depth-1)/64]&(1<<((s.depth-1)%64)) != 0 }

func (s *State) push(array bool) bool {
	if s.depth == MaxDepth {
		return false
	}
	w, bit := s.depth/64, uint64(1)<<(s.depth%64)
	if array {
		s.stack[w] |= bit
		s.mode = mValueOrEnd
	} else {
		s.stack[w] &^= bit
		s.mode = mKeyOrEnd
	}
	s.depth++
	return true
}

// valueDone moves past a finished value.
func (s *State) valueDone() {
	if s.depth == 0 {
		s.mode = mDone
	} else {
		s.mode = mAfter
	}
}

// pop closes the innermost container with c, if c is its closing bracket.
func (s *State) pop(c byte) bool {
	if s.depth == 0 || (c == ']') != s.inArray() {
		return false
	}
	s.depth--
	s.valueDone()
	return true
}

// step advances over one byte; false means c cannot come next (the state
// may then be partly changed: callers work on copies).
func (s *State) step(c byte) bool {
	if !s.next(c) {
		return false
	}
	if !isSpace(c) || s.mode == mString { // a space inside a string is text
		s.spaces = 0
		return true
	}
	s.spaces++
	return s.maxSpace == 0 || s.spaces <= s.maxSpace
}

// next is step without the whitespace limit.
func (s *State) next(c byte) bool {
	switch s.mode {
	case mStart:
		if isSpace(c) {
			return true
		}
		return c == '{' && s.push(false)
	case mValue, mValueOrEnd:
		if isSpace(c) {
			return true
		}
		if c == ']' && s.mode == mValueOrEnd {
			return s.pop(c)
		}
		return s.startValue(c)
	case mKeyOrEnd, mKey:
		switch {
		case isSpace(c):
			return true
		case c == '"':
			s.mode, s.key = mString, true
			return true
		case c == '}' && s.mode == mKeyOrEnd:
			return s.pop(c)
		}
		return false
	case mColon:
		if isSpace(c) {
			return true
		}
		if c == ':' {
			s.mode = mValue
			return true
		}
		return false
	case mAfter:
		switch {
		case isSpace(c):
			return true
		case c == ',':
			if s.inArray() {
				s.mode = mValue
			} else {
				s.mode = mKey
			}
			return true
		case c == '}' || c == ']':
			return s.pop(c)
		}
		return false
	case mString:
		return s.stringByte(c)
	case mEscape:
		switch c {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			s.mode = mString
			return true
		case 'u':
			s.mode, s.n = mHex, 4
			return true
		}
		return false
	case mHex:
		if !isHex(c) {
			return false
		}
		if s.n--; s.n == 0 {
			s.mode = mString
		}
		return true
	case mUTF8:
		if c < s.lo || c > s.hi {
			return false
		}
		s.lo, s.hi = 0x80, 0xBF
		if s.n--; s.n == 0 {
			s.mode = mString
		}
		return true
	case mNumMinus:
		switch {
		case c == '0':
			s.mode = mNumZero
		case c >= '1' && c <= '9':
			s.mode = mNumInt
		default:
			return false
		}
		return true
	case mNumZero, mNumInt:
		switch {
		case c >= '0' && c <= '9' && s.mode == mNumInt:
		case c == '.':
			s.mode = mNumDot
		case c == 'e' || c == 'E':
			s.mode = mNumE
		default:
			return s.endNumber(c)
		}
		return true
	case mNumDot:
		if c >= '0' && c <= '9' {
			s.mode = mNumFrac
			return true
		}
		return false
	case mNumFrac:
		switch {
		case c >= '0' && c <= '9':
		case c == 'e' || c == 'E':
			s.mode = mNumE
		default:
			return s.endNumber(c)
		}
		return true
	case mNumE:
		switch {
		case c == '+' || c == '-':
			s.mode = mNumESign
		case c >= '0' && c <= '9':
			s.mode = mNumExp
		default:
			return false
		}
		return true
	case mNumESign:
		if c >= '0' && c <= '9' {
			s.mode = mNumExp
			return true
		}
		return false
	case mNumExp:
		if c >= '0' && c <= '9' {
			return true
		}
		return s.endNumber(c)
	case mLiteral:
		l := literals[s.lit]
		if c != l[s.n] {
			return false
		}
		if s.n++; int(s.n) == len(l) {
			s.valueDone()
		}
		return true
	case mDone:
		return isSpace(c)
	}
	return false
}

// startValue begins a value with c.
func (s *State) startValue(c byte) bool {
	switch {
	case c == '{':
		return s.push(false)
	case c == '[':
		return s.push(true)
	case c == '"':
		s.mode, s.key = mString, false
	case c == '-':
		s.mode = mNumMinus
	case c == '0':
		s.mode = mNumZero
	case c >= '1' && c <= '9':
		s.mode = mNumInt
	case c == 't':
		s.mode, s.lit, s.n = mLiteral, 0, 1
	case c == 'f':
		s.mode, s.lit, s.n = mLiteral, 1, 1
	case c == 'n':
		s.mode, s.lit, s.n = mLiteral, 2, 1
	default:
		return false
	}
	return true
}

// endNumber ends a number at c, which must then follow the value. A number
// is never the top-level value, so a container is open.
func (s *State) endNumber(c byte) bool {
	s.mode = mAfter
	return s.next(c)
}

// stringByte takes one byte inside a string.
func (s *State) stringByte(c byte) bool {
	switch {
	case c == '"':
		if s.key {
			s.mode = mColon
		} else {
			s.valueDone()
		}
	case c == '\\':
		s.mode = mEscape
	case c < 0x20:
		return false
	case c < 0x80:
	case c >= 0xC2 && c <= 0xDF:
		s.utf8(1, 0x80, 0xBF)
	case c == 0xE0:
		s.utf8(2, 0xA0, 0xBF)
	case c == 0xED: // no UTF-16 surrogates
		s.utf8(2, 0x80, 0x9F)
	case c >= 0xE1 && c <= 0xEF:
		s.utf8(2, 0x80, 0xBF)
	case c == 0xF0:
		s.utf8(3, 0x90, 0xBF)
	case c >= 0xF1 && c <= 0xF3:
		s.utf8(3, 0x80, 0xBF)
	case c == 0xF4:
		s.utf8(3, 0x80, 0x8F)
	default:
		return false
	}
	return true
}

func (s *State) utf8(n, lo, hi uint8) { s.mode, s.n, s.lo, s.hi = mUTF8, n, lo, hi }
