package tokenizer

import "unicode/utf8"

const replacementChar = "\uFFFD"

// illFormedLen returns how many bytes at the start of p form one maximal
// ill-formed subsequence (the longest prefix of a well-formed sequence, or a
// single byte), given that p does not start with a valid character. This is
// the unit that Unicode's "best practice", WHATWG TextDecoder and Python's
// errors="replace" turn into one U+FFFD.
func illFormedLen[T string | []byte](p T) int {
	if len(p) == 0 {
		return 0
	}
	lo, hi := byte(0x80), byte(0xbf)
	need := 0
	switch b := p[0]; {
	case b >= 0xc2 && b <= 0xdf:
		need = 1
	case b == 0xe0:
		need, lo = 2, 0xa0
	case b == 0xed:
		need, hi = 2, 0x9f
	case b >= 0xe1 && b <= 0xef:
		need = 2
	case b == 0xf0:
		need, lo = 3, 0x90
	case b == 0xf4:
		need, hi = 3, 0x8f
	case b >= 0xf1 && b <= 0xf3:
		need = 3
	default:
		return 1
	}
	n := 1
	for ; n <= need && n < len(p); n++ {
		if p[n] < lo || p[n] > hi {
			break
		}
		lo, hi = 0x80, 0xbf
	}
	return n
}

// incompleteTail reports whether p is a proper prefix of some well-formed
// character, i.e. more bytes could still make it valid.
func incompleteTail(p []byte) bool {
	if len(p) == 0 || len(p) >= utf8.UTFMax {
		return false
	}
	if utf8.FullRune(p) {
		return false
	}
	return illFormedLen(p) == len(p)
}

// appendValidUTF8 appends s to dst, replacing each maximal ill-formed
// subsequence with U+FFFD.
func appendValidUTF8[T string | []byte](dst []byte, s T) []byte {
	for i := 0; i < len(s); {
		if s[i] < utf8.RuneSelf {
			dst = append(dst, s[i])
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(string(s[i:min(i+utf8.UTFMax, len(s))]))
		if r == utf8.RuneError && size <= 1 {
			dst = append(dst, replacementChar...)
			i += illFormedLen(s[i:])
			continue
		}
		dst = append(dst, s[i:i+size]...)
		i += size
	}
	return dst
}

// validUTF8 returns s with every maximal ill-formed subsequence replaced by
// U+FFFD; valid input is returned unchanged without copying.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return string(appendValidUTF8(make([]byte, 0, len(s)+8), s))
}
