package engine

import (
	"bytes"
	"fmt"
	"unicode/utf8"

	"github.com/dflash/dflash_server/sdk/jsonprefix"
	"math"
	"slices"
)

const (
	// maxRejections is how many sampled tokens a constrained request
	// throws away before it masks every token that does not fit and
	// samples once more: a model that follows the format costs one
	// sample, one that fights it at most this many plus a vocabulary scan.
	maxRejections = 8
	// jsonMaxSpace caps whitespace runs in constrained JSON (as llama.cpp's
	// JSON grammar does), enough for an indented object a dozen levels
	// deep: without it a model fond of newlines could pad forever.
	jsonMaxSpace = 40
)

// constraint is where the visible text of a JSON format stands: any
// object (*jsonprefix.State) or an object of a schema
// (*jsonprefix.SchemaState).
type constraint interface {
	Feed(b []byte) bool
	Accepts(b []byte) bool
	AcceptsByte(c byte) bool
	Complete() bool
	Started() bool
	PlainString() (ok bool, room int)
}

func newConstraint(req *Request) constraint {
	if req.Format == FormatJSONSchema {
		return jsonprefix.NewSchemaState(req.Schema, jsonMaxSpace)
	}
	st := jsonprefix.WithMaxSpace(jsonMaxSpace)
	return &st
}

// constrained reports whether the sequence's next token is held to its
// format: a JSON request outside its reasoning section.
func (e *Engine) constrained(s *sequence) bool {
	return s.req.Format != FormatText && !s.parser.InReasoning()
}

// opensReasoning reports whether tok opens the reasoning section a
// constrained request may begin with.
func (e *Engine) opensReasoning(s *sequence, tok int32) bool {
	return len(s.req.OpenReasoning) > 0 && !s.json.Started() && s.reasoning == 0 && slices.Contains(s.req.OpenReasoning, tok)
}

func (e *Engine) isSpecial(tok int32) bool {
	return e.special != nil && tok >= 0 && int(tok) < len(e.special) && e.special[tok]
}

// fits reports whether tok may come next in a constrained sequence.
func (e *Engine) fits(s *sequence, tok int32) bool {
	if e.opensReasoning(s, tok) {
		return true
	}
	if e.isSpecial(tok) || e.vocab.EOG(tok) {
		return false
	}
	b := e.vocab.TokenBytes(tok)
	return len(b) > 0 && s.json.Accepts(b)
}

// sampleJSON samples a token that keeps the visible text a JSON object's
// prefix: it samples as usual and throws a misfit away (its logit becomes
// -inf) up to maxRejections times, then masks every misfit at once and
// samples from the rest. End-of-generation is never sampled: the sequence
// finishes as soon as the object is closed.
func (e *Engine) sampleJSON(s *sequence, row []float32) (int32, error) {
	inf := float32(math.Inf(-1))
	for _, id := range e.eog {
		if int(id) < len(row) {
			row[id] = inf
		}
	}
	for range maxRejections {
		tok, err := e.m.Sample(row, &s.req.Sampling, s.generated, &s.rng)
		if err != nil {
			return 0, err
		}
		if e.fits(s, tok) {
			return tok, nil
		}
		row[tok] = inf
	}
	if e.maskMisfits(s, row) == 0 {
		return 0, fmt.Errorf("no token of the vocabulary continues the JSON object after %d generated tokens", len(s.generated))
	}
	tok, err := e.m.Sample(row, &s.req.Sampling, s.generated, &s.rng)
	if err != nil {
		return 0, err
	}
	if !e.fits(s, tok) {
		return 0, fmt.Errorf("sampler picked token %d, which was masked out", tok)
	}
	return tok, nil
}

// maskMisfits sets the logit of every token that may not come next to
// -inf and returns how many are left.
func (e *Engine) maskMisfits(s *sequence, row []float32) int {
	inf := float32(math.Inf(-1))
	// Inside a string most of the vocabulary is plain text that fits
	// whatever came before: a table built once answers for those tokens
	// without stepping the state.
	plain, room := s.json.PlainString()
	var chars []int32
	if plain {
		chars = e.plainTable()
	}
	// Most tokens start with a byte that cannot come next: one table of
	// the 256 first bytes rules them out without stepping the state.
	var first [256]bool
	for c := range first {
		first[c] = s.json.AcceptsByte(byte(c))
	}
	left := 0
	for id, v := range row {
		if v == inf {
			continue
		}
		tok := int32(id)
		if id < len(chars) {
			if n := chars[id]; n >= 0 && (room < 0 || int(n) <= room) {
				left++
				continue
			}
		}
		b := e.vocab.TokenBytes(tok)
		ok := e.opensReasoning(s, tok) || len(b) > 0 && first[b[0]] && !e.isSpecial(tok) && s.json.Accepts(b) && !e.vocab.EOG(tok)
		if !ok {
			row[id] = inf
			continue
		}
		left++
	}
	return left
}

// plainTable is, per token, the number of characters of its text when it
// is plain string text (complete UTF-8, no quote, backslash or control
// character, not special, not end-of-generation), else -1.
func (e *Engine) plainTable() []int32 {
	e.plainOnce.Do(func() {
		n := 0
		if e.special != nil {
			n = len(e.special)
		}
		// The vocabulary size is the row length; TokenBytes answers for
		// every id below it.
		n = max(n, e.nv)
		t := make([]int32, n)
		for id := range t {
			t[id] = -1
			tok := int32(id)
			b := e.vocab.TokenBytes(tok)
			if len(b) == 0 || e.isSpecial(tok) || e.vocab.EOG(tok) || !utf8.Valid(b) || bytes.ContainsAny(b, "\"\\") || hasControl(b) {
				continue
			}
			t[id] = int32(utf8.RuneCount(b))
		}
		e.plainChars = t
	})
	return e.plainChars
}

func hasControl(b []byte) bool {
	for _, c := range b {
		if c < 0x20 {
			return true
		}
	}
	return false
}
