package tokenizer

import (
	"os"
	"strings"
	"testing"
)

// Benchmarks need the reference tokenizer.json files (test/tokenizer,
// installed by npm ci on first use).
//
//	go test ./sdk/tokenizer -run '^$' -bench . -benchtime 2s
func benchTokenizers(b *testing.B) map[string]*Tokenizer {
	paths := referenceTokenizers(b)
	toks := map[string]*Tokenizer{}
	for name, p := range paths {
		toks[name] = tokenizerFromHF(b, p)
	}
	return toks
}

func benchTexts(b *testing.B) map[string]string {
	english, err := os.ReadFile("testdata/english.txt")
	if err != nil {
		b.Fatal(err)
	}
	code, err := os.ReadFile("pretok.go")
	if err != nil {
		b.Fatal(err)
	}
	cjk := strings.Repeat("中文分词测试：我们今天去公园散步，天气非常好。日本語のテキスト、ひらがなとカタカナ。", 40)
	return map[string]string{
		"english": strings.Repeat(string(english), 40), // ≈200 KB
		"code":    strings.Repeat(string(code), 4),
		"cjk":     cjk,
	}
}

func BenchmarkEncode(b *testing.B) {
	toks := benchTokenizers(b)
	texts := benchTexts(b)
	for _, model := range []string{"qwen3", "deepseek_v3"} {
		tok := toks[model]
		for _, kind := range []string{"english", "code", "cjk"} {
			text := texts[kind]
			b.Run(model+"/"+kind, func(b *testing.B) {
				b.SetBytes(int64(len(text)))
				for b.Loop() {
					tok.Encode(text, false, true)
				}
			})
		}
	}
}

// Cold: the per-token merge cache is emptied before every pass, as for the
// first request a backend serves.
func BenchmarkEncodeCold(b *testing.B) {
	toks := benchTokenizers(b)
	text := benchTexts(b)["english"]
	tok := toks["qwen3"]
	b.Run("qwen3/english", func(b *testing.B) {
		b.SetBytes(int64(len(text)))
		for b.Loop() {
			b.StopTimer()
			for i := range tok.selfMerge {
				tok.selfMerge[i].Store(0)
			}
			b.StartTimer()
			tok.Encode(text, false, true)
		}
	})
}

func BenchmarkDecode(b *testing.B) {
	toks := benchTokenizers(b)
	text := benchTexts(b)["english"]
	tok := toks["qwen3"]
	ids := tok.Encode(text, false, true)
	b.Run("qwen3/english/batch", func(b *testing.B) {
		b.SetBytes(int64(len(text)))
		for b.Loop() {
			tok.Decode(ids)
		}
	})
	b.Run("qwen3/english/stream", func(b *testing.B) {
		b.SetBytes(int64(len(text)))
		for b.Loop() {
			d := NewStreamDecoder(tok)
			for _, id := range ids {
				d.Add(id)
			}
			d.Flush()
		}
	})
}

func BenchmarkLoad(b *testing.B) {
	paths := referenceTokenizers(b)
	md, err := HFMetadata(paths["qwen3"])
	if err != nil {
		b.Fatal(err)
	}
	get := getter(md)
	b.Run("qwen3/FromMetadata", func(b *testing.B) {
		for b.Loop() {
			if _, err := FromMetadata(get); err != nil {
				b.Fatal(err)
			}
		}
	})
}
