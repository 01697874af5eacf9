package tokenizer

import "strings"

// Split regexes of the supported pre-tokenizers exactly as Hugging Face
// tokenizer.json files spell them (after JSON decoding). HFMetadata uses
// them to name a tokenizer's pre-tokenizer; the scanners in pretok.go are
// their hand-written equivalents.
var preTokenizerRegexes = map[string][]string{
	"qwen2": {
		`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
	},
	"qwen35": {
		`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
	},
	"llama-bpe": {
		`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
	},
	"deepseek-v3": {
		`\p{N}{1,3}`,
		"[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
		`[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_` + "`" + `{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
	},
}

// canonicalRegex writes literal CR and LF as escapes, the form some
// tokenizer.json files use and others do not.
func canonicalRegex(re string) string {
	return strings.NewReplacer("\r", `\r`, "\n", `\n`).Replace(re)
}

// preTokenizerName names the pre-tokenizer whose Split regexes are res.
func preTokenizerName(res []string) (string, bool) {
	for name, want := range preTokenizerRegexes {
		if len(want) != len(res) {
			continue
		}
		same := true
		for i := range want {
			if canonicalRegex(want[i]) != canonicalRegex(res[i]) {
				same = false
				break
			}
		}
		if same {
			return name, true
		}
	}
	return "", false
}
