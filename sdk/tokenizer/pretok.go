package tokenizer

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// preTokenizer splits text into the pieces that BPE merges independently.
// The scanners below are hand-written equivalents of the regexes in
// regexes.go (leftmost-first alternation, greedy quantifiers); the tests
// compare them with a backtracking regex engine on fuzzed input.
type preTokenizer interface {
	split(s string, emit func(piece string))
}

// preTokenizerFor maps a tokenizer.ggml.pre value to its scanner and says
// whether the original tokenizer NFC-normalises its input first.
func preTokenizerFor(name string) (pt preTokenizer, nfc bool, err error) {
	switch name {
	case "qwen2":
		return qwenSplitter{letters: clsL, punctExcl: clsW | clsL | clsN, maxDigits: 1}, true, nil
	case "deepseek-r1-qwen":
		return qwenSplitter{letters: clsL, punctExcl: clsW | clsL | clsN, maxDigits: 1}, false, nil
	case "qwen35":
		return qwenSplitter{letters: clsL | clsM, punctExcl: clsW | clsL | clsM | clsN, maxDigits: 1}, true, nil
	case "llama3", "llama-v3", "llama-bpe":
		return qwenSplitter{letters: clsL, punctExcl: clsW | clsL | clsN, maxDigits: 3}, false, nil
	case "deepseek-v3", "joyai-llm": // DeepSeek V4 GGUFs say joyai-llm; llama.cpp maps both to one regex set
		return deepseekSplitter{}, false, nil
	}
	return nil, false, fmt.Errorf("unsupported pre-tokenizer %q (supported: %s)", name, strings.Join(SupportedPreTokenizers(), ", "))
}

// SupportedPreTokenizers lists the tokenizer.ggml.pre values this package
// can tokenize.
func SupportedPreTokenizers() []string {
	names := []string{"qwen2", "deepseek-r1-qwen", "qwen35", "llama3", "llama-v3", "llama-bpe", "deepseek-v3", "joyai-llm"}
	slices.Sort(names)
	return names
}

// matchSpace matches \s*[\r\n]+|\s+(?!\S)|\s+ at i, where s[i] is
// whitespace: up to the last CR/LF of the run; else the whole run at the end
// of the text; else all but the run's last character (which then joins the
// next word); else the single character.
func matchSpace(s string, i int) int {
	j, lastStart, crlfEnd := i, i, -1
	for j < len(s) {
		c, n := classAt(s, j)
		if c&clsW == 0 {
			break
		}
		if c&clsCRLF != 0 {
			crlfEnd = j + n
		}
		lastStart = j
		j += n
	}
	switch {
	case crlfEnd >= 0:
		return crlfEnd
	case j == len(s):
		return j
	case lastStart > i:
		return lastStart
	}
	return j
}

// runNotEnd returns the end of the run of characters from i whose class
// does not intersect mask.
func runNotEnd(s string, i int, mask uint8) int {
	for i < len(s) {
		c, n := classAt(s, i)
		if c&mask != 0 {
			break
		}
		i += n
	}
	return i
}

// contraction returns the length of 's 't 're 've 'm 'll 'd (any case)
// after the apostrophe at the start of t, or 0.
func contraction(t string) int {
	if len(t) == 0 {
		return 0
	}
	switch t[0] | 0x20 {
	case 's', 't', 'm', 'd':
		return 1
	case 'r', 'v':
		if len(t) > 1 && t[1]|0x20 == 'e' {
			return 2
		}
	case 'l':
		if len(t) > 1 && t[1]|0x20 == 'l' {
			return 2
		}
	}
	return 0
}

// qwenSplitter implements the Qwen2/Qwen3.5/Llama-3 family:
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?LETTERS+|\p{N}{1,maxDigits}|
//	 ?[^\s LETTERS \p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// where LETTERS is \p{L} (qwen2, llama3) or [\p{L}\p{M}] (qwen35). Every
// character is matched by some alternative, so there are no gaps.
type qwenSplitter struct {
	letters   uint8 // classes of the letter run
	punctExcl uint8 // classes excluded from the punctuation run
	maxDigits int
}

func (p qwenSplitter) split(s string, emit func(string)) {
	for i := 0; i < len(s); {
		j := p.match(s, i)
		emit(s[i:j])
		i = j
	}
}

func (p qwenSplitter) match(s string, i int) int {
	if s[i] == '\'' {
		if n := contraction(s[i+1:]); n > 0 {
			return i + 1 + n
		}
	}
	c, n := classAt(s, i)
	if c&p.letters != 0 {
		return runEnd(s, i+n, p.letters)
	}
	if c&(clsCRLF|clsL|clsN) == 0 && i+n < len(s) {
		if c2, n2 := classAt(s, i+n); c2&p.letters != 0 {
			return runEnd(s, i+n+n2, p.letters)
		}
	}
	if c&clsN != 0 {
		j := i + n
		for k := 1; k < p.maxDigits && j < len(s); k++ {
			c2, n2 := classAt(s, j)
			if c2&clsN == 0 {
				break
			}
			j += n2
		}
		return j
	}
	if s[i] == ' ' && i+1 < len(s) {
		if c2, n2 := classAt(s, i+1); c2&p.punctExcl == 0 {
			return runEnd(s, runNotEnd(s, i+1+n2, p.punctExcl), clsCRLF)
		}
	}
	if c&p.punctExcl == 0 {
		return runEnd(s, runNotEnd(s, i+n, p.punctExcl), clsCRLF)
	}
	return matchSpace(s, i)
}

// deepseekSplitter implements the DeepSeek V3 sequence of three splits:
// \p{N}{1,3}, then [一-龥぀-ゟ゠-ヿ]+, then
//
//	[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//	 ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// each splitting every piece of the previous one and keeping unmatched text
// as pieces of its own.
type deepseekSplitter struct{}

func (deepseekSplitter) split(s string, emit func(string)) {
	seg := 0
	for i := 0; i < len(s); {
		c, n := classAt(s, i)
		if c&clsN == 0 {
			i += n
			continue
		}
		if seg < i {
			splitCJK(s[seg:i], emit)
		}
		for i < len(s) {
			j, k := i, 0
			for ; k < 3 && j < len(s); k++ {
				c2, n2 := classAt(s, j)
				if c2&clsN == 0 {
					break
				}
				j += n2
			}
			if k == 0 {
				break
			}
			emit(s[i:j])
			i = j
		}
		seg = i
	}
	if seg < len(s) {
		splitCJK(s[seg:], emit)
	}
}

func isDeepseekCJK(r rune) bool {
	return (r >= 0x4e00 && r <= 0x9fa5) || (r >= 0x3040 && r <= 0x309f) || (r >= 0x30a0 && r <= 0x30ff)
}

// splitCJK is the second DeepSeek split: runs of CJK ideographs and kana.
func splitCJK(t string, emit func(string)) {
	seg, inCJK := 0, false
	for i := 0; i < len(t); {
		cjk := false
		n := 1
		if t[i] >= 0xe3 { // everything in the ranges is ≥ U+3040, whose UTF-8 starts with 0xE3
			var r rune
			r, n = utf8.DecodeRuneInString(t[i:])
			cjk = isDeepseekCJK(r)
		}
		if cjk != inCJK && i > seg {
			deepseekWords(t[seg:i], emit)
			seg = i
		}
		inCJK = cjk
		i += n
	}
	if seg < len(t) {
		deepseekWords(t[seg:], emit)
	}
}

func isASCIIPunct(b byte) bool {
	return (b >= '!' && b <= '/') || (b >= ':' && b <= '@') || (b >= '[' && b <= '`') || (b >= '{' && b <= '~')
}

func isASCIILetter(b byte) bool { return (b|0x20) >= 'a' && (b|0x20) <= 'z' }

// deepseekWords is the third DeepSeek split.
func deepseekWords(t string, emit func(string)) {
	gap := -1
	for i := 0; i < len(t); {
		j := deepseekMatch(t, i)
		if j < 0 {
			if gap < 0 {
				gap = i
			}
			_, n := classAt(t, i)
			i += n
			continue
		}
		if gap >= 0 {
			emit(t[gap:i])
			gap = -1
		}
		emit(t[i:j])
		i = j
	}
	if gap >= 0 {
		emit(t[gap:])
	}
}

func deepseekMatch(t string, i int) int {
	if b := t[i]; isASCIIPunct(b) && i+1 < len(t) && isASCIILetter(t[i+1]) {
		j := i + 2
		for j < len(t) && isASCIILetter(t[j]) {
			j++
		}
		return j
	}
	const letters = clsL | clsM
	c, n := classAt(t, i)
	if c&letters != 0 {
		return runEnd(t, i+n, letters)
	}
	if c&(clsCRLF|clsL|clsP|clsS) == 0 && i+n < len(t) {
		if c2, n2 := classAt(t, i+n); c2&letters != 0 {
			return runEnd(t, i+n+n2, letters)
		}
	}
	if t[i] == ' ' && i+1 < len(t) {
		if c2, n2 := classAt(t, i+1); c2&(clsP|clsS) != 0 {
			return runEnd(t, runEnd(t, i+1+n2, clsP|clsS), clsCRLF)
		}
	}
	if c&(clsP|clsS) != 0 {
		return runEnd(t, runEnd(t, i+n, clsP|clsS), clsCRLF)
	}
	if c&clsW != 0 {
		return matchSpace(t, i)
	}
	return -1
}
