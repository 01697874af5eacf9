package enginetest

import (
	"strings"
	"unicode/utf8"

	"github.com/dflash/dflash_server/sdk/engine"
)

// ByteVocab is the vocabulary of FakeModel: ids 0..255 are bytes, then EOG,
// <think> and </think>.
type ByteVocab struct{}

var _ engine.Vocab = ByteVocab{}

func (ByteVocab) EOG(id int32) bool  { return id == EOG }
func (ByteVocab) EOGTokens() []int32 { return []int32{EOG} }
func (ByteVocab) TokenBytes(id int32) []byte {
	switch {
	case id >= 0 && id < 256:
		return []byte{byte(id)}
	case id == EOG:
		return []byte("<eog>")
	case id == ThinkOpen:
		return []byte("<think>")
	case id == ThinkClose:
		return []byte("</think>")
	}
	return nil
}

// Encode turns text into ByteVocab ids; "<think>" and "</think>" become
// their special tokens.
func Encode(text string) []int32 {
	var ids []int32
	for len(text) > 0 {
		switch {
		case strings.HasPrefix(text, "<think>"):
			ids, text = append(ids, ThinkOpen), text[len("<think>"):]
		case strings.HasPrefix(text, "</think>"):
			ids, text = append(ids, ThinkClose), text[len("</think>"):]
		default:
			ids, text = append(ids, int32(text[0])), text[1:]
		}
	}
	return ids
}

// Detokenizer is an incremental detokenizer for ByteVocab that holds back
// an incomplete UTF-8 character.
type Detokenizer struct{ pending []byte }

var _ engine.Detokenizer = (*Detokenizer)(nil)

func (d *Detokenizer) Add(id int32) string {
	d.pending = append(d.pending, ByteVocab{}.TokenBytes(id)...)
	cut := len(d.pending)
	for i := max(0, cut-3); i < cut; i++ {
		if utf8.RuneStart(d.pending[i]) && !utf8.FullRune(d.pending[i:]) {
			cut = i
			break
		}
	}
	out := string(d.pending[:cut])
	d.pending = append(d.pending[:0], d.pending[cut:]...)
	return out
}

func (d *Detokenizer) Flush() string {
	out := string(d.pending)
	d.pending = d.pending[:0]
	return out
}

// ThinkParser is a minimal engine.Parser: text between <think> and
// </think> is reasoning, the rest visible text. Tags arrive whole (they are
// special tokens).
type ThinkParser struct{ In bool }

var _ engine.Parser = (*ThinkParser)(nil)

func (p *ThinkParser) Feed(text string) engine.Output {
	var o engine.Output
	for text != "" {
		tag := "<think>"
		if p.In {
			tag = "</think>"
		}
		i := strings.Index(text, tag)
		if i < 0 {
			i = len(text)
		}
		if p.In {
			o.Reasoning += text[:i]
		} else {
			o.Text += text[:i]
		}
		if i == len(text) {
			break
		}
		p.In = !p.In
		text = text[i+len(tag):]
	}
	return o
}

func (p *ThinkParser) Close() engine.Output { return engine.Output{} }
func (p *ThinkParser) InReasoning() bool    { return p.In }
