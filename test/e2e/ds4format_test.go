package e2e

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// llamaModelLoad is test/llamacpp/loadmodel.mjs's answer.
type llamaModelLoad struct {
	Loaded       bool      `json:"loaded"`
	Error        string    `json:"error"`
	Vocab        int       `json:"vocab"`
	Embd         int       `json:"embd"`
	Context      bool      `json:"context"`
	ContextError string    `json:"contextError"`
	Evaluated    bool      `json:"evaluated"`
	EvalError    string    `json:"evalError"`
	Top          []float64 `json:"top"`
	Log          []string  `json:"log"`
}

// TestLlamaCppLoadsDeepseek4 checks that upstream llama.cpp (the prebuilt
// CPU build of node-llama-cpp) loads a tiny deepseek4 file from dflash-model
// mk (loading validates every deepseek4 key and tensor), creates a context
// and evaluates one token. No output is compared.
func TestLlamaCppLoadsDeepseek4(t *testing.T) {
	dir := llamacppDir(t)
	model := filepath.Join(t.TempDir(), "ds4.gguf")
	tok := filepath.Join(env.root, "cmd", "dflash-model", "testdata", "tok")
	if b, err := exec.Command(env.modelTool, "mk", "deepseek4", model, "--tokenizer", tok, "--vocab", "40", "--type", "q8_0").CombinedOutput(); err != nil {
		t.Fatalf("dflash-model mk deepseek4: %v\n%s", err, b)
	}
	in, _ := json.Marshal(map[string]string{"model": model})
	cmd := exec.Command("node", "loadmodel.mjs")
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("loadmodel.mjs: %v\n%s", err, tail(stderr.String(), 40))
	}
	var got llamaModelLoad
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("loadmodel.mjs output %q: %v", out, err)
	}
	log := strings.Join(got.Log, "\n")
	if !got.Loaded {
		t.Fatalf("llama.cpp did not load the deepseek4 file: %s\n%s", got.Error, log)
	}
	if got.Vocab != 40 || got.Embd != 4*64 { // llama.cpp reports hc × n_embd
		t.Errorf("llama.cpp read vocab %d, embedding %d; want 40, 256", got.Vocab, got.Embd)
	}
	if !got.Context {
		t.Fatalf("llama.cpp loaded the file but refused a context: %s\n%s", got.ContextError, log)
	}
	if !got.Evaluated || len(got.Top) != 2 {
		t.Fatalf("llama.cpp did not evaluate a token: %s\n%s", got.EvalError, log)
	}
	t.Logf("llama.cpp evaluated a token: most likely next %v", got.Top)
}
