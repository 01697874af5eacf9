package tokenizer

import "unicode/utf8"

// GPT-2 byte-level alphabet: every byte maps to one printable code point so
// that vocabulary entries are plain strings. Printable Latin-1 bytes map to
// themselves, the other 68 to U+0100 upwards in byte order.
var (
	byteToRune [256]rune
	runeToByte [0x144]int16 // inverse of byteToRune, -1 where none
)

func init() {
	for i := range runeToByte {
		runeToByte[i] = -1
	}
	next := rune(0x100)
	for b := 0; b < 256; b++ {
		printable := (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)
		if printable {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = next
			next++
		}
		runeToByte[byteToRune[b]] = int16(b)
	}
}

// byteLevelDecode maps a byte-level string back to raw bytes. ok is false
// when s holds a character outside the alphabet; such characters are kept
// as their own UTF-8 so that nothing is lost.
func byteLevelDecode(s string) (raw []byte, ok bool) {
	raw = make([]byte, 0, len(s))
	ok = true
	for _, r := range s {
		if r < rune(len(runeToByte)) && runeToByte[r] >= 0 {
			raw = append(raw, byte(runeToByte[r]))
			continue
		}
		ok = false
		raw = utf8.AppendRune(raw, r)
	}
	return raw, ok
}
