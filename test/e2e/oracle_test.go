package e2e

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/dflash/dflash_server/sdk/tokenizer"
)

// oraclePrompts are user messages; each is rendered the way the Qwen3
// template renders it with thinking off, so llama.cpp sees the very prompt
// the server's template makes.
var oraclePrompts = []string{
	"The capital of France is",
	"Write one line of Go code.",
	"Grüße aus Zürich, 日本語で答えて 👋",
}

func qwenNoThinkPrompt(user string) string {
	return "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
}

// oracleAnswer is llama.cpp's answer for one prompt (test/llamacpp/nexttoken.mjs).
type oracleAnswer struct {
	IDs []int32      `json:"ids"`
	Top [][2]float64 `json:"top"` // [token id, natural-log probability]
}

// TestLlamaCppOracle compares the server's next-token top-5
// log-probabilities with upstream llama.cpp (the prebuilt CPU build in the
// npm package node-llama-cpp) on the same tiny GGUF files and the same
// token ids. Random weights make the distributions nearly flat, so the
// comparison is by token, not by rank: each of our top 5 must have
// llama.cpp's log-probability within tol, and each of llama.cpp's top 5
// must be in ours unless it is within tol of our fifth.
func TestLlamaCppOracle(t *testing.T) {
	qwen3, qwen35 := tinyModels(t)
	dir := llamacppDir(t)
	s := startServer(t, serverOpts{plugins: []string{"backend-qwen-dflash", "policy-by-name"}, args: realPairArgs(qwen3, qwen35)})

	tests := []struct {
		model string
		path  string
		// tol bounds |ours - llama.cpp| per token. Both run q8_0 weights
		// with an f16 KV cache, but llama.cpp also rounds activations to
		// q8_0 (measured: about 2e-3 on qwen3); qwen35's recurrent layers
		// may add more.
		tol float64
	}{
		{"qwen3", qwen3, 3e-3},
		{"qwen35", qwen35, 1e-2},
	}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			tok := openTokenizer(t, tt.path)
			answers := llamaNextTokens(t, dir, tt.path, 20)
			var worst float64
			for i, user := range oraclePrompts {
				is := is.New(t)
				want := answers[i]

				c := s.post(t, "/tokenize", map[string]any{"model": tt.model, "content": qwenNoThinkPrompt(user)})
				is.Equal(c.status, 200)
				ours := decode[struct{ Tokens []int32 }](t, c.bodyBytes())
				is.Equal(ours.Tokens, want.IDs) // both tokenize the prompt alike

				body := chatReq(tt.model, user, 1, false)
				body["temperature"] = 0
				body["logprobs"] = true
				body["top_logprobs"] = 5
				body["chat_template_kwargs"] = map[string]any{"enable_thinking": false}
				c = s.post(t, pathChat, body)
				if c.status != 200 {
					t.Fatalf("status %d: %s", c.status, c.bodyBytes())
				}
				r := decode[logprobsResult](t, c.bodyBytes())
				is.Equal(r.Usage.PromptTokens, len(want.IDs)) // the template made the same prompt

				byBytes := map[string]float64{}
				for _, p := range want.Top {
					byBytes[string(tok.TokenBytes(int32(p[0])))] = p[1]
				}
				top := r.Choices[0].Logprobs.Content[0].Top
				is.Equal(len(top), 5)
				var ourTop []string
				var diffs []float64
				for _, o := range top {
					b := string(intsToBytes(o.Bytes))
					ourTop = append(ourTop, b)
					theirs, ok := byBytes[b]
					if !ok {
						t.Fatalf("prompt %d: our top token %q is not in llama.cpp's top 20", i, b)
					}
					diffs = append(diffs, o.Logprob-theirs)
				}
				for j, d := range diffs {
					worst = max(worst, math.Abs(d))
					if math.Abs(d) > tt.tol {
						t.Errorf("prompt %d token %q: logprob %.6f, llama.cpp %.6f (|difference| %.2g > %g)",
							i, ourTop[j], top[j].Logprob, top[j].Logprob-d, math.Abs(d), tt.tol)
					}
				}
				fifth := top[4].Logprob
				for _, p := range want.Top[:5] {
					b := string(tok.TokenBytes(int32(p[0])))
					if !slices.Contains(ourTop, b) && p[1] > fifth+tt.tol {
						t.Errorf("prompt %d: llama.cpp's top-5 token %q (%.6f) is missing from ours (fifth %.6f)", i, b, p[1], fifth)
					}
				}
			}
			t.Logf("%s: largest |logprob - llama.cpp| over %d prompts x top 5: %.2g (tolerance %g)", tt.model, len(oraclePrompts), worst, tt.tol)
		})
	}
}

func openTokenizer(t *testing.T, path string) *tokenizer.Tokenizer {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	tok, err := tokenizer.FromMetadata(f.Meta)
	if err != nil {
		t.Fatalf("tokenizer of %s: %v", path, err)
	}
	return tok
}

// llamaNextTokens runs test/llamacpp/nexttoken.mjs on model for every
// oracle prompt.
func llamaNextTokens(t *testing.T, dir, model string, top int) []oracleAnswer {
	t.Helper()
	prompts := make([]string, len(oraclePrompts))
	for i, p := range oraclePrompts {
		prompts[i] = qwenNoThinkPrompt(p)
	}
	in, err := json.Marshal(map[string]any{"model": model, "prompts": prompts, "top": top})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", "nexttoken.mjs")
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("llama.cpp oracle on %s: %v\n%s", model, err, tail(stderr.String(), 40))
	}
	var answers []oracleAnswer
	if err := json.Unmarshal(out, &answers); err != nil {
		t.Fatalf("llama.cpp oracle output %q: %v", out, err)
	}
	if len(answers) != len(prompts) {
		t.Fatalf("llama.cpp oracle answered %d prompts, want %d", len(answers), len(prompts))
	}
	for i, a := range answers {
		if len(a.Top) < 5 {
			t.Fatalf("prompt %d: llama.cpp gave %d top tokens", i, len(a.Top))
		}
	}
	return answers
}

// llamacppDir is test/llamacpp with its npm packages (node-llama-cpp's prebuilt llama.cpp) installed; the test is
// reported unavailable where npm cannot install them.
func llamacppDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(env.root, "test", "llamacpp")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "node-llama-cpp")); err != nil {
		skip, err := npmCI(dir)
		if skip != "" {
			unavailable(t, skip)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
