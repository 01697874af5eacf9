package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/matryer/is"
)

// tinyMetadata is a small byte-level vocabulary: the 256 byte tokens, a
// few merges, special tokens and an unused filler.
func tinyMetadata() map[string]any {
	var tokens []string
	var types []int32
	for b := 0; b < 256; b++ {
		tokens = append(tokens, string(byteToRune[b]))
		types = append(types, int32(TypeNormal))
	}
	merges := []string{"h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o", "Ġwo r", "Ġwor l", "Ġworl d", "a a", "aa a", "b b", "Ġ Ġ", "ĠĠ ĠĠ", "Ċ Ċ"}
	for _, m := range merges {
		tokens = append(tokens, strings.Replace(m, " ", "", 1))
		types = append(types, int32(TypeNormal))
	}
	for _, s := range []struct {
		text string
		typ  TokenType
	}{{"<|im_start|>", TypeControl}, {"<|im_end|>", TypeControl}, {"<think>", TypeUserDefined}, {"[PAD999]", TypeUnused}, {"<|endoftext|>", TypeControl}} {
		tokens = append(tokens, s.text)
		types = append(types, int32(s.typ))
	}
	return map[string]any{
		"tokenizer.ggml.model":         "gpt2",
		"tokenizer.ggml.pre":           "qwen2",
		"tokenizer.ggml.tokens":        tokens,
		"tokenizer.ggml.token_type":    types,
		"tokenizer.ggml.merges":        merges,
		"tokenizer.ggml.eos_token_id":  uint32(272), // <|im_end|>
		"tokenizer.ggml.bos_token_id":  uint32(275), // <|endoftext|>
		"tokenizer.ggml.add_bos_token": false,
	}
}

func getter(md map[string]any) func(string) (any, bool) {
	return func(k string) (any, bool) { v, ok := md[k]; return v, ok }
}

func tiny(t *testing.T, edit func(map[string]any)) *Tokenizer {
	t.Helper()
	md := tinyMetadata()
	if edit != nil {
		edit(md)
	}
	tok, err := FromMetadata(getter(md))
	if err != nil {
		t.Fatalf("FromMetadata: %v", err)
	}
	return tok
}

func (t *Tokenizer) ids(texts ...string) []int32 {
	var out []int32
	for _, s := range texts {
		id, ok := t.vocab[s]
		if !ok {
			id, ok = t.byText[s]
		}
		if !ok {
			panic("no token " + s)
		}
		out = append(out, id)
	}
	return out
}

func TestEncode(t *testing.T) {
	tok := tiny(t, nil)
	tests := []struct {
		name         string
		text         string
		addSpecial   bool
		parseSpecial bool
		want         []string // raw token texts
	}{
		{"merges", "hello world", false, false, []string{"hello", " world"}},
		{"leftmost on equal rank", "bbb", false, false, []string{"bb", "b"}},
		{"rank order", "aaaa", false, false, []string{"aa", "aa"}},
		{"partial merges", "hel", false, false, []string{"he", "l"}},
		{"whitespace run before word", "   world", false, false, []string{"  ", " world"}},
		{"newlines", "\n\n\nx", false, false, []string{"\n\n", "\n", "x"}},
		{"control parsed", "<|im_start|>hello<|im_end|>", false, true, []string{"<|im_start|>", "hello", "<|im_end|>"}},
		{"control as text", "<|im_end|>", false, false, []string{"<", "|", "im", "_", "end", "|>"}},
		{"user-defined always", "<think>hello", false, false, []string{"<think>", "hello"}},
		{"unused never matched", "[PAD999]", false, true, []string{"[", "PAD", "999", "]"}},
		{"invalid utf-8 becomes U+FFFD", "a\xffb", false, false, []string{"a", "\xef\xbf\xbd", "b"}},
		{"empty", "", false, false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			got := tok.Encode(tt.text, tt.addSpecial, tt.parseSpecial)
			var want []int32
			for _, w := range tt.want {
				if id, ok := tok.vocab[w]; ok {
					want = append(want, id)
				} else if id, ok := tok.byText[w]; ok {
					want = append(want, id)
				} else {
					for i := 0; i < len(w); i++ {
						want = append(want, tok.byteID[w[i]])
					}
				}
			}
			if len(want) == 0 {
				is.Equal(len(got), 0)
				return
			}
			is.Equal(got, want)
		})
	}
}

func TestAddSpecial(t *testing.T) {
	is := is.New(t)
	tok := tiny(t, func(md map[string]any) {
		md["tokenizer.ggml.add_bos_token"] = true
		md["tokenizer.ggml.add_eos_token"] = true
	})
	got := tok.Encode("hello", true, false)
	is.Equal(got, []int32{tok.BOS(), tok.ids("hello")[0], tok.EOS()})
	is.Equal(tok.Encode("hello", false, false), tok.ids("hello"))

	none := tiny(t, func(md map[string]any) {
		delete(md, "tokenizer.ggml.bos_token_id")
		md["tokenizer.ggml.add_bos_token"] = true
	})
	is.Equal(none.BOS(), int32(-1))
	is.Equal(none.Encode("hello", true, false), tok.ids("hello")) // no BOS to add
}

func TestDecode(t *testing.T) {
	is := is.New(t)
	tok := tiny(t, nil)
	ids := tok.Encode("<|im_start|>hello <think>\n", false, true)
	is.Equal(tok.Decode(ids), "<|im_start|>hello <think>\n")
	pad := int32(slices.Index(tok.tokens, "[PAD999]"))
	is.Equal(tok.Decode(append(tok.ids("he"), pad)), "he") // unused renders nothing
	// A character cut at the end or in the middle becomes U+FFFD.
	euro := []byte("€")
	cut := []int32{tok.byteID[euro[0]], tok.byteID[euro[1]]}
	is.Equal(tok.Decode(cut), "\uFFFD")
	is.Equal(tok.Decode(append(cut, tok.ids("he")...)), "\uFFFDhe")
	is.Equal(tok.Decode([]int32{-1, 1 << 30}), "")
	is.Equal(tok.TokenText(tok.ids(" world")[0]), "Ġworld")
	is.Equal(string(tok.TokenBytes(tok.ids(" world")[0])), " world")
}

func TestEOG(t *testing.T) {
	is := is.New(t)
	tok := tiny(t, func(md map[string]any) { md["tokenizer.ggml.eot_token_id"] = int64(271) })
	imEnd, _ := tok.Special("<|im_end|>")
	eot, _ := tok.Special("<|endoftext|>")
	start, _ := tok.Special("<|im_start|>")
	is.True(tok.EOG(imEnd))
	is.True(tok.EOG(eot)) // by text
	is.True(tok.EOG(271)) // eot_token_id (<|im_start|> here, by id)
	is.Equal(start, int32(271))
	is.True(!tok.EOG(tok.ids("he")[0]))
	is.Equal(tok.EOGTokens(), []int32{271, 272, 275})
	_, ok := tok.Special("hello")
	is.True(!ok)
}

func TestFromMetadataErrors(t *testing.T) {
	tests := []struct {
		name string
		edit func(map[string]any)
		want string
	}{
		{"no model", func(md map[string]any) { delete(md, "tokenizer.ggml.model") }, "no tokenizer.ggml.model"},
		{"spm", func(md map[string]any) { md["tokenizer.ggml.model"] = "llama" }, `"llama" is not supported`},
		{"no pre", func(md map[string]any) { delete(md, "tokenizer.ggml.pre") }, "no tokenizer.ggml.pre"},
		{"unknown pre", func(md map[string]any) { md["tokenizer.ggml.pre"] = "gpt-4o" }, `unsupported pre-tokenizer "gpt-4o"`},
		{"types length", func(md map[string]any) { md["tokenizer.ggml.token_type"] = []int32{1} }, "token_type has 1 entries"},
		{"tokens type", func(md map[string]any) { md["tokenizer.ggml.tokens"] = []int32{1} }, "tokenizer.ggml.tokens: want an array of strings"},
		{"eos range", func(md map[string]any) { md["tokenizer.ggml.eos_token_id"] = uint32(5000) }, "eos_token_id = 5000: out of range"},
		{"eos type", func(md map[string]any) { md["tokenizer.ggml.eos_token_id"] = "x" }, "eos_token_id: want an integer"},
		{"merge format", func(md map[string]any) { md["tokenizer.ggml.merges"] = []string{"ab"} }, `merges[0] = "ab"`},
		{"no merges", func(md map[string]any) { delete(md, "tokenizer.ggml.merges") }, "no tokenizer.ggml.merges"},
		{"missing byte", func(md map[string]any) {
			md["tokenizer.ggml.tokens"].([]string)[65] = "xyz"
		}, "no token for byte 0x41"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			md := tinyMetadata()
			tt.edit(md)
			_, err := FromMetadata(getter(md))
			is.True(err != nil)
			is.True(strings.Contains(err.Error(), tt.want)) // error names the culprit
		})
	}
}

func TestFromMetadataLenientIntegers(t *testing.T) {
	is := is.New(t)
	md := tinyMetadata()
	types := md["tokenizer.ggml.token_type"].([]int32)
	u := make([]uint32, len(types))
	a := make([]any, len(types))
	for i, v := range types {
		u[i], a[i] = uint32(v), int64(v)
	}
	for _, tt := range []any{u, a} {
		md["tokenizer.ggml.token_type"] = tt
		md["tokenizer.ggml.eos_token_id"] = int(272)
		tok, err := FromMetadata(getter(md))
		is.NoErr(err)
		is.Equal(tok.EOS(), int32(272))
		is.Equal(tok.TokenType(273), TypeUserDefined)
	}
}

// bpeLong must give what the short-piece algorithm gives.
func TestBPELongMatchesShort(t *testing.T) {
	is := is.New(t)
	tok := tiny(t, nil)
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := "aahellowrd  \n"
	var sc bpeScratch
	for range 500 {
		b := make([]byte, r.IntN(60)+2)
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		short := tok.bpe(string(b), nil, &sc)
		long := tok.bpeLong(string(b), nil, &sc)
		is.Equal(short, long)
	}
}

func TestStreamDecoder(t *testing.T) {
	tok := tiny(t, nil)
	bytesOf := func(s string) []int32 {
		var ids []int32
		for i := 0; i < len(s); i++ {
			ids = append(ids, tok.byteID[s[i]])
		}
		return ids
	}
	tests := []struct {
		name  string
		ids   []int32
		steps []string // what each Add returns
		flush string
	}{
		{"ascii", tok.ids("he", "ll"), []string{"he", "ll"}, ""},
		{"emoji across tokens", bytesOf("😀"), []string{"", "", "", "😀"}, ""},
		{"cut at end", bytesOf("\xe2\x82"), []string{"", ""}, "\uFFFD"},
		{"invalid continuation", append(bytesOf("\xe2\x82"), tok.ids("he")...), []string{"", "", "\uFFFDhe"}, ""},
		{"invalid byte", bytesOf("\xffa"), []string{"\uFFFD", "a"}, ""},
		{"special after cut", append(bytesOf("\xc3"), tok.ids("<|im_end|>")...), []string{"", "\uFFFD<|im_end|>"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			d := NewStreamDecoder(tok)
			for i, id := range tt.ids {
				is.Equal(d.Add(id), tt.steps[i])
			}
			is.Equal(d.Flush(), tt.flush)
			is.Equal(d.Flush(), "")
		})
	}
}

// Streaming any id sequence gives Decode's text, in valid UTF-8 pieces.
func TestStreamDecoderMatchesDecode(t *testing.T) {
	is := is.New(t)
	tok := tiny(t, nil)
	r := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		ids := make([]int32, r.IntN(12))
		for i := range ids {
			if r.IntN(3) == 0 {
				ids[i] = int32(r.IntN(tok.VocabSize()))
			} else {
				ids[i] = tok.byteID[[]byte("é€😀\xff")[r.IntN(10)]]
			}
		}
		d := NewStreamDecoder(tok)
		var b strings.Builder
		for _, id := range ids {
			s := d.Add(id)
			is.True(utf8.ValidString(s))
			b.WriteString(s)
		}
		b.WriteString(d.Flush())
		is.Equal(b.String(), tok.Decode(ids))
	}
}

func TestValidUTF8(t *testing.T) {
	tests := []struct{ in, want string }{
		{"ok é 😀", "ok é 😀"},
		{"\xff", "\uFFFD"},
		{"\xe2\x82A", "\uFFFDA"},                         // maximal subpart: one U+FFFD for two bytes
		{"\xf0\x9f\x98", "\uFFFD"},                       // truncated 4-byte sequence
		{"\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"},           // surrogate: ED is not followed by A0 in well-formed text
		{"\xc0\xaf", "\uFFFD\uFFFD"},                     // overlong lead
		{"\xf4\x90\x80\x80", "\uFFFD\uFFFD\uFFFD\uFFFD"}, // above U+10FFFF
		{"a\x80\x80b", "a\uFFFD\uFFFDb"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			is := is.New(t)
			is.Equal(validUTF8(tt.in), tt.want)
		})
	}
}

// Encode is used from many goroutines at once (its per-token merge cache
// is shared).
func TestConcurrentEncode(t *testing.T) {
	text := strings.Repeat("hello world <think> aaa bbb\n", 20)
	want := tiny(t, nil).Encode(text, false, true)
	tok := tiny(t, nil) // cold merge cache, filled concurrently
	errs := make(chan string, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				if got := tok.Encode(text, false, true); !slices.Equal(got, want) {
					errs <- "concurrent Encode differs"
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
