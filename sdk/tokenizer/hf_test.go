package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/matryer/is"
)

// tinyHF writes a small Hugging Face tokenizer folder and returns its path.
func tinyHF(t *testing.T, edit func(tj, tc, cfg map[string]any)) string {
	t.Helper()
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(byteToRune[b])] = b
	}
	vocab["he"], vocab["ll"], vocab["Ġw"] = 256, 257, 258
	tj := map[string]any{
		"added_tokens": []map[string]any{
			{"id": 259, "content": "<|endoftext|>", "special": true, "normalized": false},
			{"id": 260, "content": "<|im_end|>", "special": false, "normalized": false},
			{"id": 261, "content": "<tool▁call>", "special": false, "normalized": false},
		},
		"normalizer": map[string]any{"type": "NFC"},
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": preTokenizerRegexes["qwen2"][0]}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
		}},
		"post_processor": map[string]any{"type": "ByteLevel"},
		"model":          map[string]any{"type": "BPE", "vocab": vocab, "merges": [][]string{{"h", "e"}, {"l", "l"}, {"Ġ", "w"}}},
	}
	tc := map[string]any{
		"eos_token":     "<|im_end|>",
		"pad_token":     map[string]any{"content": "<|endoftext|>"},
		"add_bos_token": false,
		"chat_template": "{{ messages }}",
	}
	cfg := map[string]any{"vocab_size": 264, "bos_token_id": 259}
	if edit != nil {
		edit(tj, tc, cfg)
	}
	dir := t.TempDir()
	for name, v := range map[string]any{"tokenizer.json": tj, "tokenizer_config.json": tc, "config.json": cfg} {
		data, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestHFMetadata(t *testing.T) {
	is := is.New(t)
	md, err := HFMetadata(tinyHF(t, nil))
	is.NoErr(err)
	is.Equal(md["tokenizer.ggml.model"], "gpt2")
	is.Equal(md["tokenizer.ggml.pre"], "qwen2")
	tokens := md["tokenizer.ggml.tokens"].([]string)
	types := md["tokenizer.ggml.token_type"].([]int32)
	is.Equal(len(tokens), 264) // padded to config.json vocab_size
	is.Equal(len(types), 264)
	is.Equal(tokens[256], "he")
	is.Equal(types[256], int32(TypeNormal))
	is.Equal(tokens[259], "<|endoftext|>")
	is.Equal(types[259], int32(TypeControl))
	is.Equal(types[260], int32(TypeControl)) // not flagged special but looks special
	is.Equal(tokens[261], "<tool call>")     // user-defined: ▁ becomes a space
	is.Equal(types[261], int32(TypeUserDefined))
	is.Equal(tokens[263], "[PAD263]")
	is.Equal(types[263], int32(TypeUnused))
	is.Equal(md["tokenizer.ggml.merges"], []string{"h e", "l l", "Ġ w"})
	is.Equal(md["tokenizer.ggml.eos_token_id"], uint32(260))
	is.Equal(md["tokenizer.ggml.padding_token_id"], uint32(259))
	is.Equal(md["tokenizer.ggml.bos_token_id"], uint32(259)) // from config.json
	is.Equal(md["tokenizer.ggml.add_bos_token"], false)
	_, ok := md["tokenizer.ggml.add_eos_token"]
	is.True(!ok)
	is.Equal(md["tokenizer.chat_template"], "{{ messages }}")

	tok, err := FromMetadata(getter(md))
	is.NoErr(err)
	is.Equal(tok.Decode(tok.Encode("hello world<|im_end|>", false, true)), "hello world<|im_end|>")
	is.Equal(tok.EOS(), int32(260))
}

func TestHFMetadataVariants(t *testing.T) {
	t.Run("file path, string merges, named templates, template processing", func(t *testing.T) {
		is := is.New(t)
		dir := tinyHF(t, func(tj, tc, cfg map[string]any) {
			tj["model"].(map[string]any)["merges"] = []string{"h e", "l l"}
			tj["post_processor"] = map[string]any{"type": "TemplateProcessing", "single": []any{
				map[string]any{"SpecialToken": map[string]any{"id": "<|endoftext|>"}},
				map[string]any{"Sequence": map[string]any{"id": "A"}},
			}}
			delete(tc, "add_bos_token")
			tc["chat_template"] = []any{
				map[string]any{"name": "default", "template": "D"},
				map[string]any{"name": "tool_use", "template": "T"},
			}
		})
		md, err := HFMetadata(filepath.Join(dir, "tokenizer.json"))
		is.NoErr(err)
		is.Equal(len(md["tokenizer.ggml.tokens"].([]string)), 262) // config.json is read only for folders
		is.Equal(md["tokenizer.ggml.merges"], []string{"h e", "l l"})
		is.Equal(md["tokenizer.ggml.add_bos_token"], true)
		is.Equal(md["tokenizer.ggml.add_eos_token"], false)
		is.Equal(md["tokenizer.chat_template"], "D")
		is.Equal(md["tokenizer.chat_template.tool_use"], "T")
		is.Equal(md["tokenizer.chat_templates"], []string{"tool_use"})
	})
	t.Run("deepseek regexes with literal CR LF", func(t *testing.T) {
		is := is.New(t)
		dir := tinyHF(t, func(tj, tc, cfg map[string]any) {
			var pts []any
			for _, re := range preTokenizerRegexes["deepseek-v3"] {
				re = strings.ReplaceAll(strings.ReplaceAll(re, `\r`, "\r"), `\n`, "\n")
				pts = append(pts, map[string]any{"type": "Split", "pattern": map[string]any{"Regex": re}, "behavior": "Isolated"})
			}
			tj["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": pts}
		})
		md, err := HFMetadata(dir)
		is.NoErr(err)
		is.Equal(md["tokenizer.ggml.pre"], "deepseek-v3")
	})

	errs := []struct {
		name string
		edit func(tj, tc, cfg map[string]any)
		want string
	}{
		{"unknown regex", func(tj, tc, cfg map[string]any) {
			tj["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `\w+`}, "behavior": "Isolated"}
		}, "pre-tokenizer not recognised"},
		{"lowercase normalizer", func(tj, tc, cfg map[string]any) {
			tj["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{map[string]any{"type": "Lowercase"}}}
		}, `normalizer "Lowercase" is not supported`},
		{"not bpe", func(tj, tc, cfg map[string]any) { tj["model"].(map[string]any)["type"] = "Unigram" }, `model type "Unigram"`},
		{"vocab_size too small", func(tj, tc, cfg map[string]any) { cfg["vocab_size"] = 100 }, "vocab_size 100 is smaller"},
		{"bad merge pair", func(tj, tc, cfg map[string]any) { tj["model"].(map[string]any)["merges"] = [][]string{{"a"}} }, "merges[0]: want 2 parts"},
	}
	for _, tt := range errs {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			_, err := HFMetadata(tinyHF(t, tt.edit))
			is.True(err != nil)
			is.True(strings.Contains(err.Error(), tt.want))
		})
	}
	t.Run("missing path", func(t *testing.T) {
		is := is.New(t)
		_, err := HFMetadata(filepath.Join(t.TempDir(), "nope"))
		is.True(err != nil)
	})
}
