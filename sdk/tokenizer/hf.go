package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// hfTokenizerJSON is the part of a Hugging Face tokenizer.json we read.
type hfTokenizerJSON struct {
	AddedTokens []struct {
		ID         int    `json:"id"`
		Content    string `json:"content"`
		Special    bool   `json:"special"`
		Normalized bool   `json:"normalized"`
	} `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Model         struct {
		Type   string          `json:"type"`
		Vocab  map[string]int  `json:"vocab"`
		Merges json.RawMessage `json:"merges"`
	} `json:"model"`
}

// hfPreTokenizer covers Sequence, Split and ByteLevel pre-tokenizers.
type hfPreTokenizer struct {
	Type          string           `json:"type"`
	PreTokenizers []hfPreTokenizer `json:"pretokenizers"`
	Pattern       struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	} `json:"pattern"`
	Behavior string `json:"behavior"`
	Invert   bool   `json:"invert"`
	UseRegex *bool  `json:"use_regex"`
}

// gpt2Regex is what a ByteLevel pre-tokenizer with use_regex splits by.
const gpt2Regex = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// splitRegexes lists the regexes a pre-tokenizer splits by, in order.
func (p hfPreTokenizer) splitRegexes() ([]string, error) {
	switch p.Type {
	case "Sequence":
		var out []string
		for _, sub := range p.PreTokenizers {
			res, err := sub.splitRegexes()
			if err != nil {
				return nil, err
			}
			out = append(out, res...)
		}
		return out, nil
	case "Split":
		if p.Pattern.Regex == nil {
			return nil, fmt.Errorf("split pre-tokenizer without a regex pattern")
		}
		if p.Invert || !strings.EqualFold(p.Behavior, "Isolated") {
			return nil, fmt.Errorf("split pre-tokenizer with behavior %q invert %v (only Isolated is supported)", p.Behavior, p.Invert)
		}
		return []string{*p.Pattern.Regex}, nil
	case "ByteLevel":
		if p.UseRegex == nil || *p.UseRegex {
			return []string{gpt2Regex}, nil
		}
		return nil, nil
	}
	return nil, fmt.Errorf("pre-tokenizer type %q is not supported", p.Type)
}

// checkNormalizer accepts what the supported tokenizers use: none or NFC
// (which FromMetadata applies by pre-tokenizer name). Anything else would
// change the text in ways GGUF metadata cannot carry.
func checkNormalizer(raw json.RawMessage) error {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var n struct {
		Type        string            `json:"type"`
		Normalizers []json.RawMessage `json:"normalizers"`
	}
	if err := json.Unmarshal(raw, &n); err != nil {
		return fmt.Errorf("normalizer: %w", err)
	}
	switch n.Type {
	case "NFC":
		return nil
	case "Sequence":
		for _, sub := range n.Normalizers {
			if err := checkNormalizer(sub); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("normalizer %q is not supported (only NFC)", n.Type)
}

// hfConfig is the part of tokenizer_config.json / config.json we read.
type hfConfig map[string]json.RawMessage

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("parse %s: %w", path, err)
	}
	return nil
}

// optionalJSON reads path into v; a missing file is not an error.
func optionalJSON(path string, v any) (bool, error) {
	err := readJSON(path, v)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// tokenContent reads a tokenizer_config.json special-token entry: a string
// or an object with "content".
func tokenContent(raw json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, s != ""
	}
	var obj struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Content != "" {
		return obj.Content, true
	}
	return "", false
}

// looksSpecial is the converter's test for added tokens that are control
// tokens even when not flagged special.
func looksSpecial(s string) bool {
	switch s {
	case "<pad>", "<mask>", "<2mass>", "[@BOS@]":
		return true
	}
	return (strings.HasPrefix(s, "<|") && strings.HasSuffix(s, "|>")) ||
		(strings.HasPrefix(s, "<｜") && strings.HasSuffix(s, "｜>")) ||
		(strings.HasPrefix(s, "<unused") && strings.HasSuffix(s, ">"))
}

// HFMetadata converts a Hugging Face byte-level BPE tokenizer into GGUF
// tokenizer metadata, as llama.cpp's converter does. path is a
// tokenizer.json file or a folder holding one (and optionally
// tokenizer_config.json, config.json for the padded vocabulary size and
// special ids, chat_template.jinja). Values are string, []string, []int32,
// uint32 or bool.
func HFMetadata(path string) (map[string]any, error) {
	dir, file := path, path
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("hf tokenizer: %w", err)
	}
	folder := st.IsDir()
	if folder {
		file = filepath.Join(path, "tokenizer.json")
	} else {
		dir = filepath.Dir(path)
	}
	var tj hfTokenizerJSON
	if err := readJSON(file, &tj); err != nil {
		return nil, fmt.Errorf("hf tokenizer: %w", err)
	}
	if tj.Model.Type != "BPE" {
		return nil, fmt.Errorf("%s: model type %q is not supported (only BPE)", file, tj.Model.Type)
	}
	if err := checkNormalizer(tj.Normalizer); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	var tc hfConfig
	if _, err := optionalJSON(filepath.Join(dir, "tokenizer_config.json"), &tc); err != nil {
		return nil, fmt.Errorf("hf tokenizer: %w", err)
	}
	var cfg hfConfig
	if folder {
		if _, err := optionalJSON(filepath.Join(dir, "config.json"), &cfg); err != nil {
			return nil, fmt.Errorf("hf tokenizer: %w", err)
		}
	}

	var pt hfPreTokenizer
	if len(tj.PreTokenizer) == 0 || string(tj.PreTokenizer) == "null" {
		return nil, fmt.Errorf("%s: no pre_tokenizer", file)
	}
	if err := json.Unmarshal(tj.PreTokenizer, &pt); err != nil {
		return nil, fmt.Errorf("%s: pre_tokenizer: %w", file, err)
	}
	res, err := pt.splitRegexes()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	pre, ok := preTokenizerName(res)
	if !ok {
		return nil, fmt.Errorf("%s: pre-tokenizer not recognised (split regexes %q); supported: qwen2, qwen35, deepseek-v3, llama-bpe", file, res)
	}

	// Vocabulary size: the tokenizer's, or config.json's embedding rows.
	size := 0
	for _, id := range tj.Model.Vocab {
		size = max(size, id+1)
	}
	for _, at := range tj.AddedTokens {
		size = max(size, at.ID+1)
	}
	if n, ok := configInt(cfg, "vocab_size"); ok {
		if n < size {
			return nil, fmt.Errorf("%s: config.json vocab_size %d is smaller than the tokenizer's %d tokens", dir, n, size)
		}
		size = n
	}

	tokens := make([]string, size)
	types := make([]int32, size)
	have := make([]bool, size)
	for text, id := range tj.Model.Vocab {
		if id < 0 {
			return nil, fmt.Errorf("%s: token %q has negative id %d", file, text, id)
		}
		tokens[id], types[id], have[id] = text, int32(TypeNormal), true
	}
	byContent := map[string]int{}
	for _, at := range tj.AddedTokens {
		if at.ID < 0 {
			return nil, fmt.Errorf("%s: added token %q has negative id %d", file, at.Content, at.ID)
		}
		byContent[at.Content] = at.ID
		text, typ := at.Content, TypeControl
		if !at.Special && !looksSpecial(text) {
			text, typ = strings.ReplaceAll(text, "▁", " "), TypeUserDefined
		}
		tokens[at.ID], types[at.ID], have[at.ID] = text, int32(typ), true
	}
	for i := range tokens {
		if !have[i] {
			tokens[i], types[i] = fmt.Sprintf("[PAD%d]", i), int32(TypeUnused)
		}
	}

	merges, err := hfMerges(tj.Model.Merges)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	md := map[string]any{
		"tokenizer.ggml.model":      "gpt2",
		"tokenizer.ggml.pre":        pre,
		"tokenizer.ggml.tokens":     tokens,
		"tokenizer.ggml.token_type": types,
		"tokenizer.ggml.merges":     merges,
	}

	// Special ids: tokenizer_config.json by content, then config.json ids.
	roles := []string{"bos", "eos", "unk", "sep", "pad", "cls", "mask"}
	ids := map[string]int{}
	for _, role := range roles {
		if content, ok := tokenContent(tc[role+"_token"]); ok {
			if id, ok := byContent[content]; ok {
				ids[role] = id
			} else if id, ok := tj.Model.Vocab[content]; ok {
				ids[role] = id
			}
		}
	}
	for _, role := range roles {
		if _, set := ids[role]; set {
			continue
		}
		if id, ok := configInt(cfg, role+"_token_id"); ok && id >= 0 && id < size {
			ids[role] = id
		}
	}
	if _, ok := ids["bos"]; !ok {
		if id, ok := ids["cls"]; ok {
			ids["bos"] = id
		}
	}
	if _, ok := ids["eos"]; !ok {
		if id, ok := ids["sep"]; ok {
			ids["eos"] = id
		}
	}
	keyOf := map[string]string{"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id",
		"sep": "seperator_token_id", "pad": "padding_token_id", "cls": "cls_token_id", "mask": "mask_token_id"}
	for role, id := range ids {
		md["tokenizer.ggml."+keyOf[role]] = uint32(id)
	}

	addBOS, addEOS, haveBOS, haveEOS := templateAddFlags(tj.PostProcessor)
	for _, f := range []struct {
		key string
		dst *bool
		set *bool
	}{{"add_bos_token", &addBOS, &haveBOS}, {"add_eos_token", &addEOS, &haveEOS}} {
		var b bool
		if raw, ok := tc[f.key]; ok && json.Unmarshal(raw, &b) == nil {
			*f.dst, *f.set = b, true
		}
		if *f.set {
			md["tokenizer.ggml."+f.key] = *f.dst
		}
	}

	if err := addChatTemplates(md, tc, dir, folder); err != nil {
		return nil, fmt.Errorf("hf tokenizer: %w", err)
	}
	return md, nil
}

// configInt reads an integer (or the first of a list) from config.json,
// looking into text_config for multimodal checkpoints.
func configInt(cfg hfConfig, key string) (int, bool) {
	raw, ok := cfg[key]
	if !ok {
		var text hfConfig
		if json.Unmarshal(cfg["text_config"], &text) == nil {
			raw, ok = text[key]
		}
	}
	if !ok {
		return 0, false
	}
	var n int
	if json.Unmarshal(raw, &n) == nil {
		return n, true
	}
	var list []int
	if json.Unmarshal(raw, &list) == nil && len(list) > 0 {
		return list[0], true
	}
	return 0, false
}

// hfMerges reads model.merges: "a b" strings, or [a, b] pairs (where a
// literal space inside a part is written as Ġ, as the converter does).
func hfMerges(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, fmt.Errorf("model has no merges")
	}
	var strs []string
	if json.Unmarshal(raw, &strs) == nil {
		return strs, nil
	}
	var pairs [][]string
	if err := json.Unmarshal(raw, &pairs); err != nil {
		return nil, fmt.Errorf("model.merges: %w", err)
	}
	out := make([]string, len(pairs))
	for i, p := range pairs {
		if len(p) != 2 {
			return nil, fmt.Errorf("model.merges[%d]: want 2 parts, got %d", i, len(p))
		}
		out[i] = strings.ReplaceAll(p[0], " ", "Ġ") + " " + strings.ReplaceAll(p[1], " ", "Ġ")
	}
	return out, nil
}

// templateAddFlags infers add_bos / add_eos from a TemplateProcessing
// post-processor: a special token before or after the sequence.
func templateAddFlags(raw json.RawMessage) (addBOS, addEOS, haveBOS, haveEOS bool) {
	var pp struct {
		Type   string `json:"type"`
		Single []struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
			Sequence *struct {
				ID string `json:"id"`
			} `json:"Sequence"`
		} `json:"single"`
	}
	if json.Unmarshal(raw, &pp) != nil || pp.Type != "TemplateProcessing" || len(pp.Single) == 0 {
		return false, false, false, false
	}
	addBOS = pp.Single[0].SpecialToken != nil
	addEOS = len(pp.Single) > 1 && pp.Single[len(pp.Single)-1].SpecialToken != nil
	return addBOS, addEOS, true, true
}

// addChatTemplates copies the chat template(s) into md.
func addChatTemplates(md map[string]any, tc hfConfig, dir string, folder bool) error {
	if raw, ok := tc["chat_template"]; ok {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			md["tokenizer.chat_template"] = s
			return nil
		}
		var named []struct {
			Name     string `json:"name"`
			Template string `json:"template"`
		}
		if err := json.Unmarshal(raw, &named); err != nil {
			return fmt.Errorf("tokenizer_config.json chat_template: want a string or a list of {name, template}: %w", err)
		}
		var names []string
		for _, t := range named {
			if t.Name == "default" {
				md["tokenizer.chat_template"] = t.Template
				continue
			}
			md["tokenizer.chat_template."+t.Name] = t.Template
			names = append(names, t.Name)
		}
		if len(names) > 0 {
			slices.Sort(names)
			md["tokenizer.chat_templates"] = names
		}
		return nil
	}
	if !folder {
		return nil
	}
	data, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	md["tokenizer.chat_template"] = string(data)
	return nil
}
