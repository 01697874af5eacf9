package e2e

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/matryer/is"
)

// TestCLIErrors runs launches that must fail through the real binary: each
// exits with status 2 and one error line that names the culprit.
func TestCLIErrors(t *testing.T) {
	dir := t.TempDir()
	a := scriptedModel(t, dir, "a")
	b := scriptedModel(t, dir, "b")
	missing := filepath.Join(dir, "missing.gguf")
	tests := []struct {
		name string
		args []string
		want []string // parts of the one error line
	}{
		{"removed --primary-gpu",
			[]string{"--primary-gpu", "cpu:0", "--model", a},
			[]string{"--primary-gpu was removed", "--load-balancing-primary-gpu"}},
		{"removed --next-model",
			[]string{"--model", a, "--next-model", b},
			[]string{"--model #1 (" + a + ")", "--next-model was removed", "--model <path>"}},
		{"removed --load-balancing-next-model",
			[]string{"--load-balancing-next-model", b, "--model", a},
			[]string{"--load-balancing-next-model was removed"}},
		{"listener flag in block 2",
			[]string{"--load-balancing", "--model", a, "--model-name", "a", "--model", b, "--model-name", "b", "--port", "9"},
			[]string{"--model #2 (" + b + ")", "--port is a listener option"}},
		{"missing model file",
			[]string{"--model", missing},
			[]string{"--model #1 (" + missing + ")", "failed to detect architecture from " + missing}},
		{"missing second model file",
			[]string{"--load-balancing", "--model", a, "--model", missing},
			[]string{"--model #2 (" + missing + ")", "failed to detect architecture from " + missing}},
		{"load balancing with one block",
			[]string{"--load-balancing", "--model", a},
			[]string{"--load-balancing needs at least two model blocks"}},
		{"duplicate names with balancing",
			[]string{"--load-balancing", "--model", a, "--model-name", "x", "--model", b, "--model-name", "x"},
			[]string{"--model #2 (" + b + ")", `model name "x" is already used by --model #1`}},
		{"primary gpu matching no block",
			[]string{"--load-balancing", "--load-balancing-primary-gpu", "cpu:7", "--model", a, "--model-name", "a",
				"--model", b, "--model-name", "b", "--target-device", "cpu:1"},
			[]string{"--load-balancing-primary-gpu cpu:7 matches no model block"}},
		{"option of no backend in block 2",
			[]string{"--load-balancing", "--model", a, "--model-name", "a", "--model", b, "--model-name", "b", "--ds4-fused-decode"},
			[]string{"--model #2 (" + b + ")", "unknown flag --ds4-fused-decode"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			code, _, stderr := runCLI(t, []string{"backend-scripted", "policy-primary-first"}, tt.args...)
			is.Equal(code, 2) // usage errors exit 2
			lines := errorLines(stderr)
			is.Equal(len(lines), 1) // one error line
			if len(lines) == 1 && !contains(lines[0], tt.want...) {
				t.Errorf("error line %q lacks %q", lines[0], tt.want)
			}
		})
	}
}

// TestHelp lists the options of every backend found, the real qwen-dflash
// and ds4 backends' included, and exits 0.
func TestHelp(t *testing.T) {
	is := is.New(t)
	if env.plugins["backend-qwen-dflash"] == "" {
		unavailable(t, "needs the dflash-backend-qwen-dflash plugin")
	}
	if env.plugins["backend-ds4"] == "" {
		unavailable(t, "needs the dflash-backend-ds4 plugin")
	}
	code, stdout, _ := runCLI(t, []string{"backend-qwen-dflash", "backend-ds4", "backend-scripted", "policy-primary-first"}, "--help")
	is.Equal(code, 0)
	for _, want := range []string{
		"--load-balancing", "--load-balancing-primary-gpu", "--routing-queue-limit", "--model-name", "--target-device",
		"Backend qwen-dflash (architectures: qwen3, qwen35)", "--cache-type-k", "--draft", "--fa-window",
		"Backend ds4 (architectures: deepseek4)", "--ds4-fused-decode", "--ds4-expert-top-k", "--ds4-prefill",
		"Backend scripted", "--scripted-token-delay",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
	for _, removed := range []string{"--primary-gpu=", "--next-model"} {
		is.True(!strings.Contains(stdout, removed)) // removed spellings stay hidden
	}
}
