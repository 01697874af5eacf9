package tokenizer

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// TokenType is the GGUF tokenizer.ggml.token_type of a token.
type TokenType int32

// Token types as llama.cpp defines them.
const (
	TypeUndefined   TokenType = 0
	TypeNormal      TokenType = 1
	TypeUnknown     TokenType = 2
	TypeControl     TokenType = 3
	TypeUserDefined TokenType = 4
	TypeUnused      TokenType = 5
	TypeByte        TokenType = 6
)

// Tokenizer is a byte-level BPE tokenizer. It is safe for concurrent use.
type Tokenizer struct {
	pre    string
	split  preTokenizer
	nfc    bool
	ignore bool // ignore_merges: a piece that is a token is emitted as is

	tokens []string
	types  []TokenType
	pieces [][]byte // raw bytes each token decodes to; nil for unused ids

	vocab  map[string]int32 // raw bytes of normal tokens → id
	byteID [256]int32
	merges *mergeTable
	// selfMerge caches, per token, whether BPE on the token's own bytes
	// yields that single token: 0 unknown, 1 yes, 2 no.
	selfMerge []atomic.Uint32

	specials  specialMatcher
	byText    map[string]int32 // special (control, user-defined, unknown) tokens by text
	bos, eos  int32
	addBOS    bool
	addEOS    bool
	eog       map[int32]bool
	nMergesIn int // merges in the metadata
	nMerges   int // merges usable (both sides and result are tokens)
}

// eogTexts are token texts that end generation whatever the metadata says
// (llama.cpp's list, plus the FIM pad/repo/file-separator tokens that it
// detects by text).
var eogTexts = []string{
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>", "<end_of_turn>", "<|end_of_text|>",
	"<|eom_id|>", "<EOT>", "<|return|>", "<|call|>", "</s>", "<eos>", "<｜end▁of▁sentence｜>",
	"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<|repo_name|>", "<fim-repo>", "<reponame>",
	"<|file_sep|>", "<file_sep>", "<|file_separator|>",
}

// FromMetadata builds a tokenizer from GGUF metadata. get returns the value
// of a key; integers may be of any Go integer type, arrays []T of any
// integer type or []any.
func FromMetadata(get func(key string) (any, bool)) (*Tokenizer, error) {
	initClasses()
	m := metadata{get: get}
	model, ok, err := m.str("tokenizer.ggml.model")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("metadata has no tokenizer.ggml.model")
	}
	if model != "gpt2" {
		return nil, fmt.Errorf("tokenizer.ggml.model %q is not supported (only \"gpt2\", byte-level BPE)", model)
	}
	t := &Tokenizer{bos: -1, eos: -1}
	pre, ok, err := m.str("tokenizer.ggml.pre")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("metadata has no tokenizer.ggml.pre")
	}
	t.pre = pre
	if t.split, t.nfc, err = preTokenizerFor(pre); err != nil {
		return nil, fmt.Errorf("tokenizer.ggml.pre: %w", err)
	}
	switch pre {
	case "llama3", "llama-v3", "llama-bpe":
		t.ignore, t.addBOS = true, true
	}

	if t.tokens, ok, err = m.strs("tokenizer.ggml.tokens"); err != nil {
		return nil, err
	}
	if !ok || len(t.tokens) == 0 {
		return nil, fmt.Errorf("metadata has no tokenizer.ggml.tokens")
	}
	n := len(t.tokens)
	types, ok, err := m.ints("tokenizer.ggml.token_type")
	if err != nil {
		return nil, err
	}
	t.types = make([]TokenType, n)
	if ok {
		if len(types) != n {
			return nil, fmt.Errorf("tokenizer.ggml.token_type has %d entries, tokenizer.ggml.tokens %d", len(types), n)
		}
		for i, v := range types {
			t.types[i] = TokenType(v)
		}
	} else {
		for i := range t.types {
			t.types[i] = TypeNormal
		}
	}
	if err := t.buildVocab(); err != nil {
		return nil, err
	}
	merges, ok, err := m.strs("tokenizer.ggml.merges")
	if err != nil {
		return nil, err
	}
	if !ok && !t.ignore {
		return nil, fmt.Errorf("metadata has no tokenizer.ggml.merges")
	}
	if err := t.buildMerges(merges); err != nil {
		return nil, err
	}

	ids := map[string]*int32{"bos": &t.bos, "eos": &t.eos}
	for _, role := range []string{"bos", "eos"} {
		key := "tokenizer.ggml." + role + "_token_id"
		v, ok, err := m.id(key, n)
		if err != nil {
			return nil, err
		}
		if ok {
			*ids[role] = v
		}
	}
	for key, dst := range map[string]*bool{"tokenizer.ggml.add_bos_token": &t.addBOS, "tokenizer.ggml.add_eos_token": &t.addEOS} {
		v, ok, err := m.boolean(key)
		if err != nil {
			return nil, err
		}
		if ok {
			*dst = v
		}
	}

	t.eog = map[int32]bool{}
	if t.eos >= 0 {
		t.eog[t.eos] = true
	}
	for _, key := range []string{"eot", "eom", "fim_pad", "fim_rep", "fim_sep"} {
		v, ok, err := m.id("tokenizer.ggml."+key+"_token_id", n)
		if err != nil {
			return nil, err
		}
		if ok {
			t.eog[v] = true
		}
	}
	for _, text := range eogTexts {
		if id, ok := t.byText[text]; ok {
			t.eog[id] = true
		}
	}
	return t, nil
}

// buildVocab derives the raw bytes of every token and the lookup tables.
func (t *Tokenizer) buildVocab() error {
	n := len(t.tokens)
	t.pieces = make([][]byte, n)
	t.vocab = make(map[string]int32, n)
	t.byText = map[string]int32{}
	t.selfMerge = make([]atomic.Uint32, n)
	var specials []specialEntry
	for i, text := range t.tokens {
		id := int32(i)
		switch t.types[i] {
		case TypeNormal, TypeUndefined:
			raw, ok := byteLevelDecode(text)
			t.pieces[i] = raw
			if !ok {
				continue // not reachable from byte-level pieces
			}
			if _, dup := t.vocab[string(raw)]; !dup {
				t.vocab[string(raw)] = id
			}
		case TypeControl, TypeUserDefined, TypeUnknown:
			t.pieces[i] = []byte(text)
			if text == "" || !utf8.ValidString(text) {
				continue
			}
			if _, dup := t.byText[text]; !dup {
				t.byText[text] = id
				specials = append(specials, specialEntry{text: text, id: id, control: t.types[i] != TypeUserDefined})
			}
		}
	}
	for b := 0; b < 256; b++ {
		id, ok := t.vocab[string([]byte{byte(b)})]
		if !ok {
			return fmt.Errorf("tokenizer.ggml.tokens: no token for byte 0x%02x (%q), not a byte-level BPE vocabulary", b, string(byteToRune[b]))
		}
		t.byteID[b] = id
	}
	t.specials = newSpecialMatcher(specials)
	return nil
}

// buildMerges resolves "LEFT RIGHT" merges to token ids.
func (t *Tokenizer) buildMerges(merges []string) error {
	t.merges = newMergeTable(len(merges))
	t.nMergesIn = len(merges)
	var buf []byte
	for rank, mg := range merges {
		sp := strings.IndexByte(mg[min(1, len(mg)):], ' ')
		if sp < 0 {
			return fmt.Errorf("tokenizer.ggml.merges[%d] = %q: no space between the two parts", rank, mg)
		}
		sp += min(1, len(mg))
		left, ok1 := byteLevelDecode(mg[:sp])
		right, ok2 := byteLevelDecode(mg[sp+1:])
		if !ok1 || !ok2 {
			continue
		}
		l, okl := t.vocab[string(left)]
		r, okr := t.vocab[string(right)]
		buf = append(append(buf[:0], left...), right...)
		res, okres := t.vocab[string(buf)]
		if !okl || !okr || !okres {
			continue // cannot fire, or its result could not be emitted
		}
		t.merges.add(l, r, int32(rank), res)
		t.nMerges++
	}
	return nil
}

// Encode tokenizes text. addSpecial adds BOS/EOS as the metadata asks;
// parseSpecial lets control tokens written in the text (such as
// <|im_start|>) become their ids; user-defined tokens (such as <think>)
// are always recognised. Invalid UTF-8 is replaced by U+FFFD first.
func (t *Tokenizer) Encode(text string, addSpecial bool, parseSpecial bool) []int32 {
	text = validUTF8(text)
	e := encoder{t: t, ids: make([]int32, 0, len(text)/3+4)}
	if addSpecial && t.addBOS && t.bos >= 0 {
		e.ids = append(e.ids, t.bos)
	}
	emit := e.piece
	t.specials.partition(text, parseSpecial, func(frag string) {
		if t.nfc && !isASCII(frag) {
			frag = norm.NFC.String(frag)
		}
		t.split.split(frag, emit)
	}, func(id int32) {
		e.ids = append(e.ids, id)
	})
	if addSpecial && t.addEOS && t.eos >= 0 {
		e.ids = append(e.ids, t.eos)
	}
	return e.ids
}

type encoder struct {
	t   *Tokenizer
	ids []int32
	sc  bpeScratch
}

// piece appends the tokens of one pre-tokenized piece.
func (e *encoder) piece(p string) {
	t := e.t
	if len(p) == 1 {
		e.ids = append(e.ids, t.byteID[p[0]])
		return
	}
	id, ok := t.vocab[p]
	if ok {
		if t.ignore {
			e.ids = append(e.ids, id)
			return
		}
		switch t.selfMerge[id].Load() {
		case 1:
			e.ids = append(e.ids, id)
			return
		case 2:
		default:
			n := len(e.ids)
			e.ids = t.bpe(p, e.ids, &e.sc)
			if len(e.ids) == n+1 && e.ids[n] == id {
				t.selfMerge[id].Store(1)
			} else {
				t.selfMerge[id].Store(2)
			}
			return
		}
	}
	e.ids = t.bpe(p, e.ids, &e.sc)
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// Decode returns the text of ids: normal tokens through the byte-level
// alphabet, control and user-defined tokens as their text, unused ids as
// nothing. Byte sequences that do not form valid UTF-8 (a character cut
// between tokens at the end, say) become U+FFFD.
func (t *Tokenizer) Decode(ids []int32) string {
	var raw []byte
	for _, id := range ids {
		if id >= 0 && int(id) < len(t.pieces) {
			raw = append(raw, t.pieces[id]...)
		}
	}
	if utf8.Valid(raw) {
		return string(raw)
	}
	return string(appendValidUTF8(nil, raw))
}

// TokenText returns the text of a token as stored in the vocabulary
// (byte-level form for normal tokens, e.g. "Ġhello"), or "" for an id out
// of range.
func (t *Tokenizer) TokenText(id int32) string {
	if id < 0 || int(id) >= len(t.tokens) {
		return ""
	}
	return t.tokens[id]
}

// TokenBytes returns the raw bytes a token decodes to (possibly part of a
// UTF-8 character); nil for unused or out-of-range ids. Do not modify.
func (t *Tokenizer) TokenBytes(id int32) []byte {
	if id < 0 || int(id) >= len(t.pieces) {
		return nil
	}
	return t.pieces[id]
}

// TokenType returns the type of a token, TypeUndefined when out of range.
func (t *Tokenizer) TokenType(id int32) TokenType {
	if id < 0 || int(id) >= len(t.types) {
		return TypeUndefined
	}
	return t.types[id]
}

// VocabSize is the number of token ids (embedding rows).
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// PreTokenizer is the tokenizer.ggml.pre name.
func (t *Tokenizer) PreTokenizer() string { return t.pre }

// BOS is the beginning-of-sequence id, -1 if none.
func (t *Tokenizer) BOS() int32 { return t.bos }

// EOS is the end-of-sequence id, -1 if none.
func (t *Tokenizer) EOS() int32 { return t.eos }

// AddBOS reports whether Encode with addSpecial prepends BOS.
func (t *Tokenizer) AddBOS() bool { return t.addBOS && t.bos >= 0 }

// AddEOS reports whether Encode with addSpecial appends EOS.
func (t *Tokenizer) AddEOS() bool { return t.addEOS && t.eos >= 0 }

// EOG reports whether id ends generation: EOS, EOT, EOM, the FIM
// pad/repo/separator tokens and the special tokens whose text marks an end
// (<|im_end|>, <|endoftext|>, <｜end▁of▁sentence｜>, ...).
func (t *Tokenizer) EOG(id int32) bool { return t.eog[id] }

// EOGTokens lists the end-of-generation ids.
func (t *Tokenizer) EOGTokens() []int32 {
	out := make([]int32, 0, len(t.eog))
	for id := range t.eog {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// Special looks up a control, user-defined or unknown token by its text.
func (t *Tokenizer) Special(text string) (int32, bool) {
	id, ok := t.byText[text]
	return id, ok
}
