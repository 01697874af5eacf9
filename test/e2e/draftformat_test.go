package e2e

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk/gguf"
)

// llamaDraftLoad is test/llamacpp/loaddraft.mjs's answer.
type llamaDraftLoad struct {
	Loaded       bool     `json:"loaded"`
	Error        string   `json:"error"`
	Vocab        int      `json:"vocab"`
	Embd         int      `json:"embd"`
	Context      bool     `json:"context"`
	ContextError string   `json:"contextError"`
	Log          []string `json:"log"`
}

// TestLlamaCppLoadsDraft checks that upstream llama.cpp (the prebuilt CPU
// build of node-llama-cpp) loads the DFlash drafts dflash-model mk writes:
// loading validates every dflash key and tensor (names, shapes, the copied
// tokenizer). llama.cpp refuses a context for a draft alone, because the
// draft borrows the target's embedding and head through the target's
// context (llama_context_params.ctx_other, which node-llama-cpp does not
// pass), so the test asserts that it is refused for exactly that reason.
// Controls: the pre-merge spelling and the Lucebox dialect are refused at
// load, as the dflash spec §2.3 says.
func TestLlamaCppLoadsDraft(t *testing.T) {
	dir := llamacppDir(t)
	tmp := t.TempDir()
	tok := filepath.Join(env.root, "cmd", "dflash-model", "testdata", "tok")
	mk := func(args ...string) {
		t.Helper()
		if b, err := exec.Command(env.modelTool, append([]string{"mk"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("dflash-model mk %v: %v\n%s", args, err, b)
		}
	}
	target := filepath.Join(tmp, "target.gguf")
	mk("qwen3", target, "--tokenizer", tok, "--layers", "8", "--hidden", "64", "--heads", "2", "--kv-heads", "1", "--ffn", "128", "--vocab", "32")
	draftShape := []string{"--target", target, "--layers", "2", "--heads", "2", "--kv-heads", "1", "--ffn", "128", "--type", "q8_0"}
	v1 := filepath.Join(tmp, "v1.gguf")
	mk(append([]string{"dflash", v1, "--sliding-window", "32"}, draftShape...)...)
	v2 := filepath.Join(tmp, "dflash2.gguf")
	mk(append([]string{"dflash", v2, "--dflash2", "--selector-top-k", "4", "--selector-rank", "16"}, draftShape...)...)
	lucebox := filepath.Join(tmp, "lucebox.gguf")
	mk(append([]string{"dflash-draft", lucebox}, draftShape...)...)
	premerge := filepath.Join(tmp, "premerge.gguf")
	rewriteGGUF(t, v1, premerge,
		map[string]string{"dflash.target_layers": "dflash.target_layer_ids", "tokenizer.ggml.mask_token_id": "dflash.mask_token_id"},
		map[string]string{"enc.output_norm.weight": "hidden_norm.weight"})

	tests := []struct {
		name, path string
		refusal    string // "" when the file must load
	}{
		{"v1", v1, ""},
		{"dflash2", v2, ""},
		{"premerge", premerge, "target_layers"},
		{"lucebox", lucebox, "unknown model architecture: 'dflash-draft'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			got := llamaLoadDraft(t, dir, tt.path)
			log := strings.Join(got.Log, "\n")
			if tt.refusal != "" {
				is.True(!got.Loaded)
				if !strings.Contains(log, tt.refusal) {
					t.Fatalf("llama.cpp refused %s, but not for %q:\n%s", tt.name, tt.refusal, log)
				}
				return
			}
			if !got.Loaded {
				t.Fatalf("llama.cpp did not load %s: %s\n%s", tt.path, got.Error, log)
			}
			is.Equal(got.Vocab, 32) // the target's tokenizer, copied
			is.Equal(got.Embd, 64)
			if !got.Context && !strings.Contains(log, "dflash requires ctx_other") {
				t.Fatalf("llama.cpp refused a context for another reason than the missing target context: %s\n%s", got.ContextError, log)
			}
		})
	}
}

func llamaLoadDraft(t *testing.T, dir, model string) llamaDraftLoad {
	t.Helper()
	in, _ := json.Marshal(map[string]string{"model": model})
	cmd := exec.Command("node", "loaddraft.mjs")
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("loaddraft.mjs on %s: %v\n%s", model, err, tail(stderr.String(), 40))
	}
	var got llamaDraftLoad
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("loaddraft.mjs output %q: %v", out, err)
	}
	return got
}

// rewriteGGUF copies src to dst with metadata keys and tensors renamed (to
// make the other spellings of a draft from one mk file).
func rewriteGGUF(t *testing.T, src, dst string, keys, tensors map[string]string) {
	t.Helper()
	f, err := gguf.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := gguf.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	rename := func(m map[string]string, s string) string {
		if r, ok := m[s]; ok {
			return r
		}
		return s
	}
	check := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("rewrite %s: %s: %v", src, what, err)
		}
	}
	for _, kv := range f.KVs() {
		v, ok := f.Meta(kv.Key)
		if !ok {
			t.Fatalf("rewrite %s: key %s unreadable", src, kv.Key)
		}
		check(kv.Key, w.AddKV(rename(keys, kv.Key), v))
	}
	for _, ti := range f.Tensors() {
		check(ti.Name, w.AddTensor(rename(tensors, ti.Name), ti.Type, ti.Dims))
	}
	for _, ti := range f.Tensors() {
		data, err := f.TensorData(ti.Name)
		check(ti.Name, err)
		check(ti.Name, w.WriteTensorData(rename(tensors, ti.Name), data))
	}
	check("close", w.Close())
}
