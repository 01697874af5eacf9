package jinja

import (
	"fmt"
	"strings"
)

// segKind is a piece of template source: literal text or one tag.
type segKind uint8

const (
	segText segKind = iota
	segOutput
	segBlock
)

type segment struct {
	kind segKind
	text string // literal text, or the tag's inner source
	line int
}

// split cuts source into text and tags and applies whitespace control the
// way Jinja2 does with trim_blocks and lstrip_blocks on.
func split(src string) ([]segment, error) {
	type rawTag struct {
		kind                    segKind
		comment                 bool
		start, end              int // source span of the whole tag
		inner                   string
		stripBefore, stripAfter bool // '-' modifiers
		keepBefore, keepAfter   bool // '+' modifiers
		line                    int
	}
	var tags []rawTag
	pos := 0
	for {
		i := indexTagStart(src, pos)
		if i < 0 {
			break
		}
		t := rawTag{start: i, line: 1 + strings.Count(src[:i], "\n")}
		open := src[i+1]
		j := i + 2
		if j < len(src) && src[j] == '-' {
			t.stripBefore = true
			j++
		} else if j < len(src) && src[j] == '+' {
			t.keepBefore = true
			j++
		}
		var closeAt int
		switch open {
		case '#':
			t.comment = true
			t.kind = segBlock
			k := strings.Index(src[j:], "#}")
			if k < 0 {
				return nil, fmt.Errorf("line %d: unclosed comment", t.line)
			}
			closeAt = j + k
		case '{', '%':
			if open == '{' {
				t.kind = segOutput
			} else {
				t.kind = segBlock
			}
			end := "}}"
			if open == '%' {
				end = "%}"
			}
			k := findTagEnd(src, j, end)
			if k < 0 {
				return nil, fmt.Errorf("line %d: unclosed tag", t.line)
			}
			closeAt = k
		}
		inner := src[j:closeAt]
		if strings.HasSuffix(inner, "-") {
			t.stripAfter = true
			inner = inner[:len(inner)-1]
		} else if strings.HasSuffix(inner, "+") && t.kind == segBlock {
			t.keepAfter = true
			inner = inner[:len(inner)-1]
		}
		t.inner = strings.TrimSpace(inner)
		t.end = closeAt + 2
		tags = append(tags, t)
		pos = t.end
	}

	var segs []segment
	prevEnd := 0
	for n := 0; n <= len(tags); n++ {
		textEnd := len(src)
		if n < len(tags) {
			textEnd = tags[n].start
		}
		text := src[prevEnd:textEnd]
		if n > 0 {
			prev := tags[n-1]
			switch {
			case prev.stripAfter:
				text = strings.TrimLeft(text, " \t\r\n")
			case prev.kind == segBlock && !prev.keepAfter:
				// trim_blocks: drop the first newline after a block tag.
				if strings.HasPrefix(text, "\r\n") {
					text = text[2:]
				} else if strings.HasPrefix(text, "\n") {
					text = text[1:]
				}
			}
		}
		if n < len(tags) {
			next := tags[n]
			switch {
			case next.stripBefore:
				text = strings.TrimRight(text, " \t\r\n")
			case next.kind == segBlock && !next.keepBefore:
				// lstrip_blocks: drop spaces and tabs between the line start
				// and a block tag.
				raw := src[prevEnd:textEnd]
				nl := strings.LastIndexByte(raw, '\n')
				atLineStart := nl >= 0 || prevEnd == 0
				if atLineStart && strings.Trim(raw[nl+1:], " \t") == "" {
					cut := len(raw) - (nl + 1)
					if cut <= len(text) {
						text = text[:len(text)-cut]
					}
				}
			}
		}
		if text != "" {
			segs = append(segs, segment{kind: segText, text: text})
		}
		if n < len(tags) && !tags[n].comment {
			segs = append(segs, segment{kind: tags[n].kind, text: tags[n].inner, line: tags[n].line})
		}
		if n < len(tags) {
			prevEnd = tags[n].end
		}
	}
	return segs, nil
}

func indexTagStart(src string, from int) int {
	for i := from; i+1 < len(src); i++ {
		if src[i] == '{' && (src[i+1] == '{' || src[i+1] == '%' || src[i+1] == '#') {
			return i
		}
	}
	return -1
}

// findTagEnd finds end ("}}" or "%}") outside string literals.
func findTagEnd(src string, from int, end string) int {
	var quote byte
	for i := from; i < len(src); i++ {
		c := src[i]
		switch {
		case quote != 0:
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case strings.HasPrefix(src[i:], end):
			return i
		}
	}
	return -1
}

// Expression tokens.
type tokKind uint8

const (
	tkEOF tokKind = iota
	tkName
	tkString
	tkInt
	tkFloat
	tkOp
)

type token struct {
	kind tokKind
	s    string // name, operator, or decoded string
	i    int64
	f    float64
}

func (t token) is(op string) bool    { return t.kind == tkOp && t.s == op }
func (t token) isName(n string) bool { return t.kind == tkName && t.s == n }

var ops3 = []string{"**", "//", "==", "!=", "<=", ">="}

func tokenize(src string) ([]token, error) {
	var toks []token
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '_' || isLetter(c):
			j := i + 1
			for j < len(src) && (src[j] == '_' || isLetter(src[j]) || isDigit(src[j])) {
				j++
			}
			toks = append(toks, token{kind: tkName, s: src[i:j]})
			i = j
		case isDigit(c):
			j := i
			for j < len(src) && (isDigit(src[j]) || src[j] == '_') {
				j++
			}
			isFloat := false
			if j+1 < len(src) && src[j] == '.' && isDigit(src[j+1]) {
				isFloat = true
				j++
				for j < len(src) && isDigit(src[j]) {
					j++
				}
			}
			if j < len(src) && (src[j] == 'e' || src[j] == 'E') {
				k := j + 1
				if k < len(src) && (src[k] == '+' || src[k] == '-') {
					k++
				}
				if k < len(src) && isDigit(src[k]) {
					isFloat = true
					for k < len(src) && isDigit(src[k]) {
						k++
					}
					j = k
				}
			}
			lit := strings.ReplaceAll(src[i:j], "_", "")
			if isFloat {
				var f float64
				if _, err := fmt.Sscan(lit, &f); err != nil {
					return nil, fmt.Errorf("bad number %q", lit)
				}
				toks = append(toks, token{kind: tkFloat, f: f})
			} else {
				var n int64
				if _, err := fmt.Sscan(lit, &n); err != nil {
					return nil, fmt.Errorf("bad number %q", lit)
				}
				toks = append(toks, token{kind: tkInt, i: n})
			}
			i = j
		case c == '\'' || c == '"':
			s, n, err := unquote(src[i:])
			if err != nil {
				return nil, err
			}
			toks = append(toks, token{kind: tkString, s: s})
			i += n
		default:
			op := string(c)
			for _, o := range ops3 {
				if strings.HasPrefix(src[i:], o) {
					op = o
					break
				}
			}
			if !strings.Contains("+-*/%~=!<>()[]{}.,:|", string(c)) {
				return nil, fmt.Errorf("unexpected character %q", c)
			}
			toks = append(toks, token{kind: tkOp, s: op})
			i += len(op)
		}
	}
	return append(toks, token{kind: tkEOF}), nil
}

func isLetter(c byte) bool { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') }
func isDigit(c byte) bool  { return c >= '0' && c <= '9' }

// unquote reads a Python string literal at the start of s and returns it
// and the number of bytes it spans.
func unquote(s string) (string, int, error) {
	q := s[0]
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		if c == q {
			return b.String(), i + 1, nil
		}
		if c != '\\' || i+1 >= len(s) {
			b.WriteByte(c)
			continue
		}
		i++
		switch e := s[i]; e {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'v':
			b.WriteByte('\v')
		case '0':
			b.WriteByte(0)
		case '\\', '\'', '"':
			b.WriteByte(e)
		case '\n':
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if i+n >= len(s) {
				return "", 0, fmt.Errorf("bad escape in string literal")
			}
			var r rune
			if _, err := fmt.Sscanf(s[i+1:i+1+n], "%x", &r); err != nil {
				return "", 0, fmt.Errorf("bad escape in string literal")
			}
			b.WriteRune(r)
			i += n
		default:
			b.WriteByte('\\')
			b.WriteByte(e)
		}
	}
	return "", 0, fmt.Errorf("unterminated string literal")
}
