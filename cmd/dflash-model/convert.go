package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/dflash/dflash_server/sdk/safetensors"
	"github.com/hashicorp/go-multierror"
)

type convertCmd struct {
	HFDir       string `arg:"" name:"HF_DIR" type:"existingdir" help:"Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer.json)."`
	Out         string `arg:"" name:"OUT" help:"Output GGUF file."`
	Type        string `default:"f16" help:"Weight type: ${types}." placeholder:"TYPE"`
	Name        string `help:"general.name (default: the folder's name)."`
	NoMTP       bool   `name:"no-mtp" help:"qwen35: leave out the MTP layers even when the checkpoint has them."`
	Tokenizer   string `help:"Tokenizer folder or tokenizer.json to use instead of HF_DIR's (a DFlash draft has none: give its target's to embed one)."`
	Target      string `type:"existingfile" help:"DFlash drafts: the target model's GGUF file, whose tokenizer is copied into the draft (as llama.cpp's converter does) and whose shape is checked." placeholder:"FILE"`
	NoTokenizer bool   `help:"Write no tokenizer metadata (weights-only files, e.g. for numeric parity tests of tiny models)."`
	Verbose     bool   `short:"v" help:"Print each tensor as it is written."`
}

// hfArchs maps config.json model_type to a GGUF architecture.
var hfArchs = map[string]string{
	"qwen3":        "qwen3",
	"qwen3_5":      "qwen35",
	"qwen3_5_text": "qwen35",
	"deepseek_v4":  "deepseek4",
}

func (c *convertCmd) Run(out io.Writer) error {
	want, fileType, err := parseOutputType(c.Type)
	if err != nil {
		return fmt.Errorf("--type: %w", err)
	}
	cfg, err := readHFConfig(filepath.Join(c.HFDir, "config.json"))
	if err != nil {
		return err
	}
	arch, err := cfg.arch()
	if err != nil {
		return err
	}
	l, err := layoutFor(arch)
	if err != nil {
		return err
	}
	hp, err := l.fromHF(cfg)
	if err != nil {
		return err
	}
	if w := upstreamWarning(arch, hp); w != "" {
		fmt.Fprintln(os.Stderr, "warning:", w)
	}
	ck, err := safetensors.Open(c.HFDir)
	if err != nil {
		return err
	}
	defer ck.Close()
	prefix := ""
	if arch != draftArch { // drafts keep their tensors at the top level
		if prefix, err = textPrefix(ck); err != nil {
			return err
		}
	}
	if hp.NextN > 0 {
		if _, ok := ck.Tensor("mtp.fc.weight"); !ok || c.NoMTP {
			hp.NextN = 0 // HF's own classes drop the MTP weights when saving
		}
	}
	tokPath := c.Tokenizer
	if tokPath == "" {
		if _, err := os.Stat(filepath.Join(c.HFDir, "tokenizer.json")); err == nil || arch != draftArch {
			tokPath = c.HFDir
		}
	}
	if c.NoTokenizer {
		tokPath = ""
	}
	var tok map[string]any
	if c.Target != "" {
		if arch != draftArch {
			return fmt.Errorf("--target is for DFlash drafts, not %s", arch)
		}
		if c.Tokenizer != "" || c.NoTokenizer {
			return fmt.Errorf("--target gives the tokenizer: leave out --tokenizer and --no-tokenizer")
		}
		tgt, err := readTarget(c.Target)
		if err != nil {
			return err
		}
		if tgt.vocab != hp.Vocab {
			return fmt.Errorf("--target %s has %d tokens, config.json vocab_size is %d", c.Target, tgt.vocab, hp.Vocab)
		}
		if tgt.hidden != hp.TargetHidden {
			return fmt.Errorf("--target %s has hidden size %d, the draft expects %d", c.Target, tgt.hidden, hp.TargetHidden)
		}
		for _, id := range hp.TargetLayerIDs {
			if int(id) >= tgt.layers {
				return fmt.Errorf("--target %s has %d layers, the draft captures layer %d", c.Target, tgt.layers, id)
			}
		}
		tok, tokPath = tgt.tok, ""
	}
	if tokPath != "" { // a draft without a tokenizer shares its target's
		var vocab int
		if tok, vocab, err = tokenizerFor(tokPath, hp.Vocab); err != nil {
			return err
		}
		if vocab != hp.Vocab {
			return fmt.Errorf("tokenizer has %d tokens, config.json vocab_size is %d", vocab, hp.Vocab)
		}
	}
	if err := l.validate(hp); err != nil {
		return fmt.Errorf("config.json: %w", err)
	}
	plans := l.tensors(hp)
	for _, p := range plans {
		if p.Name != "output.weight" {
			continue
		}
		if name := p.HF.sources(ck, prefix)[0]; !has(ck, name) {
			return fmt.Errorf("checkpoint has no tensor %q and config.json does not tie the embeddings", name)
		}
	}
	if err := checkCheckpoint(ck, prefix, plans, hp, arch == draftArch); err != nil {
		return err
	}
	name := c.Name
	if name == "" {
		name = filepath.Base(filepath.Clean(c.HFDir))
	}
	m := &modelFile{
		arch: arch, name: name, fileType: fileType, want: want,
		keys: l.keys(hp), tok: tok, plans: plans,
		rows: func(p tensorPlan) (rowFunc, error) {
			var ts []*safetensors.Tensor
			for _, name := range p.HF.sources(ck, prefix) {
				t, _ := ck.Tensor(name)
				ts = append(ts, t)
			}
			return hfRows(ts, p), nil
		},
	}
	var log io.Writer
	if c.Verbose {
		log = out
	}
	if err := m.write(c.Out, log); err != nil {
		return fmt.Errorf("convert %s: %w", c.HFDir, err)
	}
	fmt.Fprintf(out, "wrote %s: %s, %d tensors, %s\n", c.Out, arch, len(plans), c.Type)
	return nil
}

// arch picks the GGUF architecture for a config.json. DFlash drafts say
// model_type "qwen3" too, so they are recognised by class or dflash_config
// first.
func (c hfConfig) arch() (string, error) {
	var classes []string
	_ = json.Unmarshal(c.top["architectures"], &classes)
	for _, cl := range classes {
		switch cl {
		case "DFlashDraftModel", "DFlash2DraftModel":
			return draftArch, nil
		}
	}
	if _, ok := c.top["dflash_config"]; ok {
		return draftArch, nil
	}
	mt := c.modelType()
	if arch, ok := hfArchs[mt]; ok {
		return arch, nil
	}
	return "", fmt.Errorf("config.json: model_type %q is not supported (supported: qwen3, qwen3_5, deepseek_v4, DFlash drafts)", mt)
}

// sources returns the full checkpoint names a rule reads, in row order: its
// Parts, else Name (or Alt when only Alt is there).
func (r hfRule) sources(ck *safetensors.Checkpoint, prefix string) []string {
	full := func(n string) string {
		if r.Top {
			return n
		}
		return prefix + n
	}
	if r.Parts != nil {
		out := make([]string, len(r.Parts))
		for i, n := range r.Parts {
			out[i] = full(n)
		}
		return out
	}
	name := full(r.Name)
	if r.Alt != "" && !has(ck, name) && has(ck, r.Alt) {
		return []string{r.Alt}
	}
	return []string{name}
}

func has(ck *safetensors.Checkpoint, name string) bool {
	_, ok := ck.Tensor(name)
	return ok
}

// textPrefix finds where the text model's tensors live: "model." in a
// *ForCausalLM checkpoint, "model.language_model." in a vision-language one,
// "" in the official DeepSeek layout (embed.weight, layers.N.…).
func textPrefix(ck *safetensors.Checkpoint) (string, error) {
	for _, p := range []string{"model.language_model.", "model."} {
		if has(ck, p+"embed_tokens.weight") {
			return p, nil
		}
	}
	if has(ck, "embed.weight") {
		return "", nil
	}
	return "", fmt.Errorf("checkpoint has no %q or %q", "model.embed_tokens.weight", "model.language_model.embed_tokens.weight")
}

// ignoredPrefixes are checkpoint tensors a text-only GGUF leaves out.
var ignoredPrefixes = []string{"model.visual.", "visual.", "model.vision_tower.", "mtp."}

// checkCheckpoint verifies that every planned tensor (every part of a
// concatenated one) is in the checkpoint with the expected shape and a float
// dtype, and that the checkpoint holds nothing the layout would silently
// drop (biases, say).
func checkCheckpoint(ck *safetensors.Checkpoint, prefix string, plans []tensorPlan, hp hparams, draft bool) error {
	var errs *multierror.Error
	used := map[string]bool{}
	quantized := map[string]bool{} // non-float weights: their .scale companions are not reported again
	for _, p := range plans {
		for _, name := range p.HF.sources(ck, prefix) {
			used[name] = true
			t, ok := ck.Tensor(name)
			if !ok {
				alt := ""
				if p.HF.Alt != "" {
					alt = fmt.Sprintf(" or %q", p.HF.Alt)
				}
				errs = multierror.Append(errs, fmt.Errorf("missing tensor %q%s (for %s)", name, alt, p.Name))
				continue
			}
			if fmt.Sprint(t.Shape) != fmt.Sprint(p.HF.Shape) {
				errs = multierror.Append(errs, fmt.Errorf("tensor %q has shape %v, want %v", name, t.Shape, p.HF.Shape))
			}
			switch {
			case p.I32 && (t.DType == "I64" || t.DType == "I32"):
			case p.I32:
				errs = multierror.Append(errs, fmt.Errorf("tensor %q has dtype %s, want an integer table (I64 or I32)", name, t.DType))
			case !safetensors.IsFloat(t.DType):
				hint := ""
				if strings.HasPrefix(t.DType, "F8_") || has(ck, strings.TrimSuffix(name, ".weight")+".scale") {
					hint = "; FP8/FP4 checkpoints with .scale companions must be dequantized to BF16 first"
				}
				quantized[name] = true
				errs = multierror.Append(errs, fmt.Errorf("tensor %q has unsupported dtype %s (F32, F16, BF16 or F64 needed%s)", name, t.DType, hint))
			}
		}
	}
	for _, n := range ck.Names() {
		if used[n] || (hp.Tied && n == "lm_head.weight") || strings.HasSuffix(n, "rotary_emb.inv_freq") {
			continue
		}
		if base, ok := strings.CutSuffix(n, ".scale"); ok && quantized[base+".weight"] {
			continue
		}
		ignored := false
		for _, p := range ignoredPrefixes {
			ignored = ignored || strings.HasPrefix(n, p) || strings.HasPrefix(strings.TrimPrefix(n, prefix), p)
		}
		if strings.HasPrefix(n, "mtp.") && hp.NextN > 0 {
			ignored = false
		}
		if draft { // shared with the target, or vocabulary maps the draft does not need
			switch n {
			case "embed_tokens.weight", "model.embed_tokens.weight", "lm_head.weight", "d2t", "t2d":
				ignored = true
			}
		}
		if !ignored {
			errs = multierror.Append(errs, fmt.Errorf("checkpoint tensor %q has no place in the GGUF layout", n))
		}
	}
	return errs.ErrorOrNil()
}

// hfRows reads checkpoint tensors row by row, applying the rule's
// reordering and value changes. A torch [out, in] tensor's row o is ggml
// row o; a conv weight [C, 1, K] has C rows of K. Several tensors (the
// rule's Parts, all of one shape) are read as one whose rows are theirs
// concatenated.
func hfRows(ts []*safetensors.Tensor, p tensorPlan) rowFunc {
	r := p.HF
	ne0 := int(p.Dims[0])
	partRows := int(ts[0].Elements()) / ne0
	var rows, cols []int
	if r.Rows != nil {
		rows = r.Rows()
	}
	if r.Cols != nil {
		cols = r.Cols()
	}
	return func(row int, dst []float32) error {
		src := row
		if rows != nil {
			src = rows[row]
		}
		buf := dst
		if cols != nil {
			buf = make([]float32, ne0)
		}
		if err := ts[src/partRows].ReadFloat32(int64(src%partRows)*int64(ne0), buf); err != nil {
			return err
		}
		for i, c := range cols {
			dst[i] = buf[c]
		}
		for i, v := range dst {
			if r.PlusOne {
				v++
			}
			if r.NegExp {
				v = float32(-math.Exp(float64(v)))
			}
			dst[i] = v
		}
		return nil
	}
}

// hfConfig reads config.json, looking into text_config first for
// vision-language checkpoints.
type hfConfig struct {
	top, text map[string]json.RawMessage
}

func readHFConfig(path string) (hfConfig, error) {
	var c hfConfig
	b, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c.top); err != nil {
		return c, fmt.Errorf("parse %s: %w", path, err)
	}
	if raw, ok := c.top["text_config"]; ok {
		if err := json.Unmarshal(raw, &c.text); err != nil {
			return c, fmt.Errorf("parse %s text_config: %w", path, err)
		}
	}
	return c, nil
}

func (c hfConfig) modelType() string {
	var s string
	_ = json.Unmarshal(c.top["model_type"], &s)
	return s
}

func (c hfConfig) raw(key string) (json.RawMessage, bool) {
	if v, ok := c.text[key]; ok && string(v) != "null" {
		return v, true
	}
	v, ok := c.top[key]
	return v, ok && string(v) != "null"
}

func (c hfConfig) int(key string, errs **multierror.Error) int {
	raw, ok := c.raw(key)
	if !ok {
		*errs = multierror.Append(*errs, fmt.Errorf("config.json: missing %q", key))
		return 0
	}
	var v int
	if err := json.Unmarshal(raw, &v); err != nil {
		*errs = multierror.Append(*errs, fmt.Errorf("config.json: %q = %s is not an integer", key, raw))
	}
	return v
}

func (c hfConfig) intOr(key string, def int) int {
	raw, ok := c.raw(key)
	var v int
	if !ok || json.Unmarshal(raw, &v) != nil {
		return def
	}
	return v
}

func (c hfConfig) floatOr(key string, def float64) float64 {
	raw, ok := c.raw(key)
	var v float64
	if !ok || json.Unmarshal(raw, &v) != nil {
		return def
	}
	return v
}

func (c hfConfig) boolOr(key string, def bool) bool {
	raw, ok := c.raw(key)
	var v bool
	if !ok || json.Unmarshal(raw, &v) != nil {
		return def
	}
	return v
}

func (c hfConfig) strings(key string) []string {
	raw, ok := c.raw(key)
	var v []string
	if !ok || json.Unmarshal(raw, &v) != nil {
		return nil
	}
	return v
}

// rope finds a RoPE setting: in rope_parameters (transformers 5), then
// rope_scaling, then at the top level (older configs).
func (c hfConfig) rope(key string) (json.RawMessage, bool) {
	for _, section := range []string{"rope_parameters", "rope_scaling"} {
		raw, ok := c.raw(section)
		if !ok {
			continue
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(raw, &m) == nil {
			if v, ok := m[key]; ok && string(v) != "null" {
				return v, true
			}
		}
	}
	return c.raw(key)
}

func (c hfConfig) ropeFloat(key string, def float64) float64 {
	raw, ok := c.rope(key)
	var v float64
	if !ok || json.Unmarshal(raw, &v) != nil {
		return def
	}
	return v
}

func (c hfConfig) ropeInts(key string) []int {
	raw, ok := c.rope(key)
	var v []int
	if !ok || json.Unmarshal(raw, &v) != nil {
		return nil
	}
	return v
}

// plainRope notes a RoPE scaling type other than the default, which no
// layout supports yet.
func (c hfConfig) plainRope(errs **multierror.Error) {
	if t := c.ropeString("rope_type"); t != "" && t != "default" {
		*errs = multierror.Append(*errs, fmt.Errorf("config.json: rope type %q is not supported yet", t))
	}
}

func (c hfConfig) ropeString(key string) string {
	raw, ok := c.rope(key)
	var v string
	if !ok || json.Unmarshal(raw, &v) != nil {
		return ""
	}
	return v
}
