package tokenizer

import "unicode/utf8"

// StreamDecoder turns generated ids into text as they arrive without ever
// cutting a UTF-8 character: bytes of a character split across tokens are
// held back until it is complete. The concatenation of everything Add and
// Flush return equals Decode of all ids. Not safe for concurrent use.
type StreamDecoder struct {
	tok     *Tokenizer
	pending []byte
}

// NewStreamDecoder starts a stream for tok.
func NewStreamDecoder(tok *Tokenizer) *StreamDecoder {
	return &StreamDecoder{tok: tok}
}

// Add appends one token and returns the text that is now complete (often
// "", while a character is still incomplete).
func (d *StreamDecoder) Add(id int32) string {
	d.pending = append(d.pending, d.tok.TokenBytes(id)...)
	p := d.pending
	cut := 0
	for cut < len(p) {
		if p[cut] < utf8.RuneSelf {
			cut++
			continue
		}
		r, size := utf8.DecodeRune(p[cut:])
		if r != utf8.RuneError || size > 1 {
			cut += size
			continue
		}
		if incompleteTail(p[cut:]) {
			break // may still be completed by the next token
		}
		cut += illFormedLen(p[cut:])
	}
	if cut == 0 {
		return ""
	}
	out := string(appendValidUTF8(nil, p[:cut]))
	d.pending = append(d.pending[:0], p[cut:]...)
	return out
}

// Flush returns whatever is held back (an incomplete character becomes
// U+FFFD) and resets the stream.
func (d *StreamDecoder) Flush() string {
	if len(d.pending) == 0 {
		return ""
	}
	out := string(appendValidUTF8(nil, d.pending))
	d.pending = d.pending[:0]
	return out
}
