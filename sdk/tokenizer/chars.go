package tokenizer

import (
	"sync"
	"unicode"
	"unicode/utf8"
)

// Character classes used by the pre-tokenizer regexes. \s is Unicode
// White_Space, as in Oniguruma (Hugging Face tokenizers) and llama.cpp.
const (
	clsL    uint8 = 1 << iota // \p{L}
	clsN                      // \p{N}
	clsM                      // \p{M}
	clsP                      // \p{P}
	clsS                      // \p{S}
	clsW                      // \s
	clsCRLF                   // \r or \n
)

var (
	bmpClassOnce sync.Once
	bmpClass     []uint8 // class of every code point below U+10000
)

func classOfRune(r rune) uint8 {
	var c uint8
	switch {
	case unicode.IsLetter(r):
		c |= clsL
	case unicode.IsNumber(r):
		c |= clsN
	case unicode.IsMark(r):
		c |= clsM
	case unicode.IsPunct(r):
		c |= clsP
	case unicode.IsSymbol(r):
		c |= clsS
	}
	if unicode.IsSpace(r) {
		c |= clsW
	}
	if r == '\r' || r == '\n' {
		c |= clsCRLF
	}
	return c
}

func initClasses() {
	bmpClassOnce.Do(func() {
		t := make([]uint8, 0x10000)
		for r := range t {
			t[r] = classOfRune(rune(r))
		}
		bmpClass = t
	})
}

// classAt decodes the character at s[i] (s is valid UTF-8) and returns its
// classes and width in bytes.
func classAt(s string, i int) (uint8, int) {
	if b := s[i]; b < utf8.RuneSelf {
		return bmpClass[b], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	if r < 0x10000 {
		return bmpClass[r], n
	}
	return classOfRune(r), n
}

// runEnd returns the end of the run of characters from i whose class
// intersects mask.
func runEnd(s string, i int, mask uint8) int {
	for i < len(s) {
		c, n := classAt(s, i)
		if c&mask == 0 {
			break
		}
		i += n
	}
	return i
}
