package qwendflash

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/dflash/dflash_server/plugins/nativebackend/nativetest"
)

// libDirForTests finds libdflash_cpu.so (nativetest.LibDir).
func libDirForTests(t testing.TB) string { return nativetest.LibDir(t) }

// modelTool finds the dflash-model binary (nativetest.ModelTool).
func modelTool(t testing.TB) string { return nativetest.ModelTool(t) }

// testTemplate is a Qwen3.5-style ChatML template: the generation prompt
// opens <think> unless enable_thinking is false.
const testTemplate = `{%- for message in messages %}{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}{%- endfor %}` +
	`{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}` +
	`{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- else %}{{- '<think>\n' }}{%- endif %}{%- endif %}`

// byteLevel is GPT-2's byte-to-printable-character table.
func byteLevel() [256]rune {
	var table [256]rune
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			table[b] = rune(b)
		} else {
			table[b] = rune(256 + n)
			n++
		}
	}
	return table
}

// writeTokenizer writes a small byte-level BPE tokenizer (the 256 bytes, a
// few merges, Qwen's special tokens) and testTemplate as a Hugging Face
// tokenizer folder.
func writeTokenizer(dir string) error {
	bl := byteLevel()
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(bl[b])] = b
	}
	merges := [][2]string{{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"}, {"Ġ", "a"}, {"e", "r"}, {"Ċ", "Ċ"}}
	var mergeList []string
	for _, m := range merges {
		vocab[m[0]+m[1]] = len(vocab)
		mergeList = append(mergeList, m[0]+" "+m[1])
	}
	type added struct {
		ID         int    `json:"id"`
		Content    string `json:"content"`
		Special    bool   `json:"special"`
		Normalized bool   `json:"normalized"`
	}
	var specials []added
	for _, s := range []struct {
		text    string
		special bool
	}{{"<|endoftext|>", true}, {"<|im_start|>", true}, {"<|im_end|>", true}, {"<think>", false}, {"</think>", false}, {"<tool_call>", false}, {"</tool_call>", false}} {
		specials = append(specials, added{ID: len(vocab) + len(specials), Content: s.text, Special: s.special})
	}
	tok := map[string]any{
		"version":      "1.0",
		"added_tokens": specials,
		"normalizer":   map[string]any{"type": "NFC"},
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "behavior": "Isolated", "invert": false, "pattern": map[string]any{
				"Regex": `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`}},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
		}},
		"model": map[string]any{"type": "BPE", "vocab": vocab, "merges": mergeList},
	}
	cfg := map[string]any{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": false, "chat_template": testTemplate}
	for name, v := range map[string]any{"tokenizer.json": tok, "tokenizer_config.json": cfg} {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

var (
	fixtureOnce sync.Once
	fixtureDir  string
	fixtureErr  error
)

// tinyModels makes (once per test binary) a tiny random-weight qwen3 and
// qwen35 model with dflash-model mk and returns their paths.
func tinyModels(t testing.TB) (qwen3, qwen35 string) {
	t.Helper()
	tool := modelTool(t)
	fixtureOnce.Do(func() {
		fixtureDir, fixtureErr = os.MkdirTemp("", "qwendflash-test-")
		if fixtureErr != nil {
			return
		}
		tokDir := filepath.Join(fixtureDir, "tok")
		if fixtureErr = os.Mkdir(tokDir, 0o755); fixtureErr != nil {
			return
		}
		if fixtureErr = writeTokenizer(tokDir); fixtureErr != nil {
			return
		}
		shape := []string{"--tokenizer", tokDir, "--type", "f32", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
			"--head-dim", "16", "--ffn", "128", "--context", "1024", "--seed", "7"}
		for _, m := range []struct{ arch, file, layers string }{{"qwen3", "qwen3.gguf", "2"}, {"qwen35", "qwen35.gguf", "4"}} {
			args := append([]string{"mk", m.arch, filepath.Join(fixtureDir, m.file), "--layers", m.layers}, shape...)
			if out, err := exec.Command(tool, args...).CombinedOutput(); err != nil {
				fixtureErr = fmt.Errorf("dflash-model %v: %v\n%s", args, err, out)
				return
			}
		}
	})
	if fixtureErr != nil {
		t.Fatalf("make tiny models: %v", fixtureErr)
	}
	return filepath.Join(fixtureDir, "qwen3.gguf"), filepath.Join(fixtureDir, "qwen35.gguf")
}

var (
	benchOnce sync.Once
	benchPath string
	benchErr  error
)

// benchModel makes (once) a small qwen3 shape for benchmarks: 4 layers,
// hidden 256, q8_0 weights, the test tokenizer.
func benchModel(t testing.TB) string {
	t.Helper()
	q3, _ := tinyModels(t)
	tool := modelTool(t)
	benchOnce.Do(func() {
		benchPath = filepath.Join(fixtureDir, "qwen3-small.gguf")
		args := []string{"mk", "qwen3", benchPath, "--tokenizer", filepath.Join(filepath.Dir(q3), "tok"), "--type", "q8_0",
			"--layers", "4", "--hidden", "256", "--heads", "8", "--kv-heads", "4", "--head-dim", "32", "--ffn", "768", "--seed", "3"}
		if out, err := exec.Command(tool, args...).CombinedOutput(); err != nil {
			benchErr = fmt.Errorf("dflash-model %v: %v\n%s", args, err, out)
		}
	})
	if benchErr != nil {
		t.Fatalf("make bench model: %v", benchErr)
	}
	return benchPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if fixtureDir != "" {
		_ = os.RemoveAll(fixtureDir)
	}
	os.Exit(code)
}
