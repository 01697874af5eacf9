package main

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/dflash/dflash_server/sdk/gguf"
)

type inspectCmd struct {
	File      string `arg:"" type:"existingfile" help:"GGUF file."`
	Template  bool   `help:"Print the whole chat template."`
	NoTensors bool   `help:"Do not list the tensors one by one."`
	Check     bool   `default:"true" negatable:"" help:"Check tensor names and shapes against the architecture's layout (qwen3, qwen35)."`
}

func (c *inspectCmd) Run(out io.Writer) error {
	f, err := gguf.Open(c.File)
	if err != nil {
		return err
	}
	defer f.Close()
	return inspect(out, c.File, f, c.Template, !c.NoTensors, c.Check)
}

// tokenTypeNames follows llama.cpp's token type ids.
var tokenTypeNames = []string{"undefined", "normal", "unknown", "control", "user-defined", "unused", "byte"}

var fileTypeNames = map[uint32]string{
	0: "ALL_F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 3: "MOSTLY_Q4_1", 7: "MOSTLY_Q8_0", 8: "MOSTLY_Q5_0",
	9: "MOSTLY_Q5_1", 10: "MOSTLY_Q2_K", 11: "MOSTLY_Q3_K_S", 12: "MOSTLY_Q3_K_M", 13: "MOSTLY_Q3_K_L",
	14: "MOSTLY_Q4_K_S", 15: "MOSTLY_Q4_K_M", 16: "MOSTLY_Q5_K_S", 17: "MOSTLY_Q5_K_M", 18: "MOSTLY_Q6_K",
	19: "MOSTLY_IQ2_XXS", 20: "MOSTLY_IQ2_XS", 21: "MOSTLY_Q2_K_S", 22: "MOSTLY_IQ3_XS", 23: "MOSTLY_IQ3_XXS",
	24: "MOSTLY_IQ1_S", 25: "MOSTLY_IQ4_NL", 26: "MOSTLY_IQ3_S", 27: "MOSTLY_IQ3_M", 28: "MOSTLY_IQ2_S",
	29: "MOSTLY_IQ2_M", 30: "MOSTLY_IQ4_XS", 31: "MOSTLY_IQ1_M", 32: "MOSTLY_BF16", 36: "MOSTLY_TQ1_0",
	37: "MOSTLY_TQ2_0", 38: "MOSTLY_MXFP4_MOE", 39: "MOSTLY_NVFP4", 40: "MOSTLY_Q1_0",
}

func inspect(out io.Writer, path string, f *gguf.File, fullTemplate, listTensors, check bool) error {
	shown := map[string]bool{}
	p := func(format string, a ...any) { fmt.Fprintf(out, format, a...) }

	size := int64(-1)
	if st, err := os.Stat(path); err == nil {
		size = st.Size()
	}
	p("file:          %s (%s)\n", path, human(uint64(size)))
	p("gguf:          version %d, alignment %d, %d metadata keys, %d tensors, data at offset %d\n",
		f.Version(), f.Alignment(), len(f.KVs()), len(f.Tensors()), f.DataStart())
	arch := f.Arch()
	if arch == "" {
		arch = "(missing general.architecture)"
	}
	p("architecture:  %s\n", arch)
	shown[gguf.KeyArchitecture] = true
	for _, k := range []string{"general.name", "general.basename", "general.size_label"} {
		if s, err := f.String(k); err == nil {
			p("%-14s %s\n", strings.TrimPrefix(k, "general.")+":", s)
			shown[k] = true
		}
	}
	if ft, err := f.Uint32("general.file_type"); err == nil {
		p("file type:     %s (%d)\n", fileTypeNames[ft], ft)
		shown["general.file_type"] = true
	}

	var kvs []gguf.KV
	prefix := f.Arch() + "."
	for _, kv := range f.KVs() {
		if f.Arch() != "" && strings.HasPrefix(kv.Key, prefix) {
			kvs = append(kvs, kv)
		}
	}
	if len(kvs) > 0 {
		p("\nhyperparameters:\n")
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		for _, kv := range kvs {
			fmt.Fprintf(tw, "  %s\t%s\n", strings.TrimPrefix(kv.Key, prefix), formatValue(f, kv))
			shown[kv.Key] = true
		}
		tw.Flush()
	}

	if isDraftArch(f.Arch()) {
		describeDraft(out, f)
	}

	inspectTokenizer(out, f, shown, fullTemplate)

	var rest []gguf.KV
	for _, kv := range f.KVs() {
		if !shown[kv.Key] {
			rest = append(rest, kv)
		}
	}
	if len(rest) > 0 {
		p("\nother metadata:\n")
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		for _, kv := range rest {
			fmt.Fprintf(tw, "  %s\t%s\n", kv.Key, formatValue(f, kv))
		}
		tw.Flush()
	}

	inspectTensors(out, f, listTensors)

	if check {
		extra, err := checkLayoutNotes(f)
		if err != nil {
			p("\nlayout check: FAILED\n%s\n", indent(err.Error(), "  "))
		} else if _, ok := layouts[f.Arch()]; ok {
			p("\nlayout check: ok (%s)\n", f.Arch())
		}
		if len(extra) > 0 {
			p("  %d tensors the %s layout does not use: %s\n", len(extra), f.Arch(), shorten(strings.Join(extra, ", "), 200))
		}
		if err != nil {
			return fmt.Errorf("%s does not match the %s layout", path, f.Arch())
		}
	}
	return nil
}

func inspectTokenizer(out io.Writer, f *gguf.File, shown map[string]bool, fullTemplate bool) {
	p := func(format string, a ...any) { fmt.Fprintf(out, format, a...) }
	var any bool
	for _, kv := range f.KVs() {
		if strings.HasPrefix(kv.Key, "tokenizer.") {
			any = true
		}
	}
	if !any {
		return
	}
	p("\ntokenizer:\n")
	model, _ := f.String("tokenizer.ggml.model")
	pre, _ := f.String("tokenizer.ggml.pre")
	p("  model %s, pre-tokenizer %s\n", orNone(model), orNone(pre))
	shown["tokenizer.ggml.model"], shown["tokenizer.ggml.pre"] = true, true
	tokens, err := f.Strings("tokenizer.ggml.tokens")
	if err == nil {
		shown["tokenizer.ggml.tokens"] = true
		counts := map[int32]int{}
		if types, err := f.Int32s("tokenizer.ggml.token_type"); err == nil {
			shown["tokenizer.ggml.token_type"] = true
			for _, t := range types {
				counts[t]++
			}
		}
		var parts []string
		for id, name := range tokenTypeNames {
			if n := counts[int32(id)]; n > 0 {
				parts = append(parts, fmt.Sprintf("%s %d", name, n))
			}
		}
		p("  tokens %d (%s)\n", len(tokens), strings.Join(parts, ", "))
	}
	if kv, ok := findKV(f, "tokenizer.ggml.merges"); ok {
		p("  merges %d\n", kv.Len)
		shown[kv.Key] = true
	}
	for _, kv := range f.KVs() {
		if !strings.HasPrefix(kv.Key, "tokenizer.ggml.") || shown[kv.Key] {
			continue
		}
		name := strings.TrimPrefix(kv.Key, "tokenizer.ggml.")
		if strings.HasSuffix(name, "_token_id") {
			id, err := f.Uint32(kv.Key)
			if err == nil {
				text := "(out of range)"
				if int(id) < len(tokens) {
					text = fmt.Sprintf("%q", tokens[id])
				}
				p("  %s %d %s\n", strings.TrimSuffix(name, "_token_id"), id, text)
				shown[kv.Key] = true
			}
			continue
		}
		if kv.Type == gguf.ValueBool {
			b, _ := f.Bool(kv.Key)
			p("  %s %v\n", name, b)
			shown[kv.Key] = true
		}
	}
	if tmpl, err := f.String("tokenizer.chat_template"); err == nil {
		shown["tokenizer.chat_template"] = true
		sum := sha256.Sum256([]byte(tmpl))
		p("  chat template %d bytes, sha256 %x\n", len(tmpl), sum[:8])
		if fullTemplate {
			p("%s\n", tmpl)
		} else if line, _, _ := strings.Cut(tmpl, "\n"); line != "" {
			p("    %s\n", shorten(line, 100))
		}
	}
}

func inspectTensors(out io.Writer, f *gguf.File, list bool) {
	ts := f.Tensors()
	var total uint64
	byType := map[gguf.Type][2]uint64{}
	var params uint64
	for _, t := range ts {
		total += t.Size
		c := byType[t.Type]
		byType[t.Type] = [2]uint64{c[0] + 1, c[1] + t.Size}
		params += t.Elements()
	}
	fmt.Fprintf(out, "\ntensors: %d, %s, %s parameters\n", len(ts), human(total), count(params))
	types := make([]gguf.Type, 0, len(byType))
	for t := range byType {
		types = append(types, t)
	}
	sort.Slice(types, func(i, j int) bool { return types[i] < types[j] })
	for _, t := range types {
		fmt.Fprintf(out, "  %-6s %5d tensors  %s\n", t, byType[t][0], human(byType[t][1]))
	}
	if !list {
		return
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for _, t := range ts {
		fmt.Fprintf(tw, "  %s\t%s\t%v\t%s\n", t.Name, t.Type, t.Dims, human(t.Size))
	}
	tw.Flush()
}

func findKV(f *gguf.File, key string) (gguf.KV, bool) {
	for _, kv := range f.KVs() {
		if kv.Key == key {
			return kv, true
		}
	}
	return gguf.KV{}, false
}

// formatValue renders a value on one line; long arrays are summarised.
func formatValue(f *gguf.File, kv gguf.KV) string {
	v, ok := f.Meta(kv.Key)
	if !ok {
		return "?"
	}
	switch x := v.(type) {
	case string:
		return fmt.Sprintf("%q", shorten(x, 100))
	case []string:
		q := make([]string, 0, 8)
		for i, s := range x {
			if i == 8 {
				q = append(q, "...")
				break
			}
			q = append(q, fmt.Sprintf("%q", shorten(s, 40)))
		}
		return fmt.Sprintf("%s[%d] [%s]", kv.ElemType, len(x), strings.Join(q, " "))
	}
	if kv.Type == gguf.ValueArray {
		s := fmt.Sprint(v)
		return fmt.Sprintf("%s[%d] %s", kv.ElemType, kv.Len, shorten(s, 100))
	}
	return fmt.Sprintf("%v (%s)", v, kv.Type)
}

func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func indent(s, pre string) string {
	return pre + strings.ReplaceAll(s, "\n", "\n"+pre)
}

func human(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.2f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func count(n uint64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.2fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}
