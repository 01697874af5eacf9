package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/dlclark/regexp2/v2"
	"github.com/matryer/is"
)

// regexSplit applies Hugging Face Split(behavior=Isolated) with each regex
// in turn: matches and the text between them all become pieces.
func regexSplit(t *testing.T, res []*regexp2.Regexp, s string) []string {
	pieces := []string{s}
	for _, re := range res {
		var next []string
		for _, p := range pieces {
			idx, err := re.FindAllStringIndex(p, -1)
			if err != nil {
				t.Fatalf("regexp2: %v", err)
			}
			last := 0
			for _, m := range idx {
				if m[0] > last {
					next = append(next, p[last:m[0]])
				}
				if m[1] > m[0] {
					next = append(next, p[m[0]:m[1]])
				}
				last = m[1]
			}
			if last < len(p) {
				next = append(next, p[last:])
			}
		}
		pieces = next
	}
	return pieces
}

func scannerSplit(pt preTokenizer, s string) []string {
	var out []string
	pt.split(s, func(p string) { out = append(out, p) })
	return out
}

// fuzzChars draws characters from every class the regexes distinguish, and
// from the edges of the DeepSeek kana ranges.
var fuzzChars = []rune{
	'a', 'Z', 's', 'S', 't', 'r', 'e', 'E', 'v', 'm', 'l', 'L', 'd', 'D', 'x',
	'\'', '"', '.', ',', '!', '?', '-', '(', '[', '\\', '`', '~', '$', '+', '<', '^', '|', '_', '@', '#', '%',
	' ', ' ', ' ', '\t', '\n', '\r', '\v', '\f', 0x85, 0xa0, 0x1680, 0x2000, 0x2003, 0x200a, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000,
	0x200b, 0x200d, 0xfeff, 0x00ad, 0x061c, // format characters (Cf), not \s
	0x00, 0x07, 0x1b, 0x7f, 0x9f, // controls
	'0', '5', '9', 0x0663, 0xff11, 0x00b2, 0x2163, 0x2460, 0x1d7ce, // numbers Nd, No, Nl
	0xe9, 0xdf, 0x130, 0x3a9, 0x416, 0x5d0, 0x627, 0x915, 0xe01, 0x1780, 0xac00, 0x10400, // letters
	0x301, 0x308, 0x93f, 0x94d, 0xe31, 0xe48, 0x17d2, 0x20dd, 0xfe0f, 0x1f3fd, // marks (and a skin-tone modifier, Sk)
	0xab, 0xbb, 0x2014, 0x2026, 0x201c, 0x3001, 0x3002, 0xff01, 0x30fb, 0x30a0, // punctuation
	0xa9, 0x20ac, 0x2192, 0x221a, 0x309b, 0x1f600, 0x1f44d, 0x2764, // symbols
	0x4e00, 0x4e2d, 0x9fa5, 0x9fa6, 0x3400, 0x3040, 0x3041, 0x309f, 0x30a1, 0x30fc, 0x30ff, 0x3100, 0x3005, // CJK edges
	0xe000, 0x10ffff - 2, 0x0378, // private use, unassigned
}

func fuzzString(r *rand.Rand) string {
	var b strings.Builder
	for k := r.IntN(40); k > 0; k-- {
		b.WriteRune(fuzzChars[r.IntN(len(fuzzChars))])
	}
	return b.String()
}

// The hand-written scanners split exactly as a backtracking regex engine
// does with the original patterns.
func TestPreTokenizerMatchesRegex(t *testing.T) {
	initClasses()
	for name, patterns := range preTokenizerRegexes {
		t.Run(name, func(t *testing.T) {
			is := is.New(t)
			var res []*regexp2.Regexp
			for _, p := range patterns {
				re, err := regexp2.Compile(p)
				is.NoErr(err)
				res = append(res, re)
			}
			pt, _, err := preTokenizerFor(name)
			is.NoErr(err)
			fixed := []string{
				"Hello world", "I'M here, you'RE 'll'", "  two\n\n  lines \r\n\t end  ", "a   ", "   ", "x \n",
				"12345678 3.3 3..3", "中文テスト123ひらがな・カタカナー", "e\u0301 \u0301x \u0301", "😀 👍🏽", "'s's", "\u00a0x\u3000y",
			}
			r := rand.New(rand.NewPCG(42, uint64(len(name))))
			bad := 0
			for i := 0; i < 4000; i++ {
				var s string
				if i < len(fixed) {
					s = fixed[i]
				} else {
					s = fuzzString(r)
				}
				want := regexSplit(t, res, s)
				got := scannerSplit(pt, s)
				if strings.Join(got, "\x00|") != strings.Join(want, "\x00|") {
					bad++
					if bad <= 5 {
						t.Errorf("%q:\n got %q\nwant %q", s, got, want)
					}
				}
			}
			is.Equal(bad, 0)
		})
	}
}

// JavaScript's \s (used by the reference npm packages) differs from
// Unicode White_Space on U+0085 and U+FEFF; we follow White_Space like the
// Rust tokenizers and llama.cpp.
func TestWhitespaceIsUnicodeWhiteSpace(t *testing.T) {
	is := is.New(t)
	initClasses()
	pt, _, _ := preTokenizerFor("qwen2")
	is.Equal(scannerSplit(pt, "a\u0085\u0085b"), []string{"a", "\u0085", "\u0085b"})
	is.Equal(scannerSplit(pt, "a\ufeff\ufeffb"), []string{"a", "\ufeff\ufeff", "b"})
}

func TestPreTokenizerNames(t *testing.T) {
	is := is.New(t)
	for _, name := range SupportedPreTokenizers() {
		_, _, err := preTokenizerFor(name)
		is.NoErr(err)
	}
	ds4, _, _ := preTokenizerFor("joyai-llm") // DeepSeek V4 Flash GGUFs
	is.Equal(scannerSplit(ds4, "x 12345 中文"), []string{"x", " ", "123", "45", " ", "中文"})
	_, _, err := preTokenizerFor("gpt-2")
	is.True(err != nil)
	is.True(strings.Contains(err.Error(), "supported: "))
}
