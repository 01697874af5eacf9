package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/matryer/is"
)

// realPairArgs serves the tiny qwen3 and qwen35 models by name.
func realPairArgs(qwen3, qwen35 string) []string {
	return []string{"--routing-policy", "by-name",
		"--model", qwen3, "--model-name", "qwen3", "--target-device", "cpu:0", "--max-ctx", "1024", "--max-concurrency", "2",
		"--model", qwen35, "--model-name", "qwen35", "--target-device", "cpu:0", "--max-ctx", "1024", "--max-concurrency", "2"}
}

// TestRealModelTextIsItsTokens: with logprobs on, the answer a tiny real
// model gives is exactly the bytes of the tokens it sampled. Random weights
// sample byte tokens that split multi-byte characters (which once failed
// the whole request at the plugin boundary) and tokens with leading
// whitespace (which the output parser once dropped).
func TestRealModelTextIsItsTokens(t *testing.T) {
	qwen3, qwen35 := tinyModels(t)
	s := startServer(t, serverOpts{plugins: []string{"backend-qwen-dflash", "policy-by-name"}, args: realPairArgs(qwen3, qwen35)})

	var partial, leadingSpace int
	for _, model := range []string{"qwen3", "qwen35"} {
		for seed := 1; seed <= 6; seed++ {
			t.Run(fmt.Sprintf("%s seed %d", model, seed), func(t *testing.T) {
				is := is.New(t)
				body := chatReq(model, "Write one line of code.", 12, false)
				body["logprobs"] = true
				body["top_logprobs"] = 20
				body["seed"] = seed
				body["temperature"] = 1.5
				body["chat_template_kwargs"] = map[string]any{"enable_thinking": false}
				c := s.post(t, pathChat, body)
				if c.status != 200 {
					t.Fatalf("status %d: %s", c.status, c.bodyBytes()) // a model's bytes never fail the request
				}
				r := decode[logprobsResult](t, c.bodyBytes())
				ch := r.Choices[0]
				var gen []byte
				special := false
				for i, lp := range ch.Logprobs.Content {
					b := intsToBytes(lp.Bytes)
					is.True(utf8.ValidString(lp.Token)) // token text is valid JSON text
					if !utf8.Valid(b) {
						partial++
					}
					if i == 0 && len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\n') {
						leadingSpace++
					}
					for _, top := range lp.Top {
						if !utf8.Valid(intsToBytes(top.Bytes)) {
							partial++
						}
					}
					if strings.HasPrefix(lp.Token, "<|") || strings.Contains(lp.Token, "think>") || strings.Contains(lp.Token, "tool_call>") {
						special = true // markup the parser interprets
					}
					gen = append(gen, b...)
				}
				if special || ch.Message.ReasoningContent != "" {
					t.Skipf("the model sampled markup (%q): content is not its raw text", gen)
				}
				want := strings.ToValidUTF8(string(gen), "\uFFFD")
				is.Equal(oneReplacement(ch.Message.Content), want) // content is exactly the sampled tokens

				// The same request streamed (same seed, same tokens): the
				// deltas concatenate to the same text.
				body["stream"] = true
				c = s.post(t, pathChat, body)
				is.Equal(c.status, 200)
				var streamed strings.Builder
				for _, e := range c.events() {
					if e.data == "[DONE]" {
						continue
					}
					var chunk struct {
						Choices []struct {
							Delta struct {
								Content *string `json:"content"`
							} `json:"delta"`
						} `json:"choices"`
					}
					is.NoErr(json.Unmarshal([]byte(e.data), &chunk))
					if len(chunk.Choices) == 1 && chunk.Choices[0].Delta.Content != nil {
						streamed.WriteString(*chunk.Choices[0].Delta.Content)
					}
				}
				is.Equal(oneReplacement(streamed.String()), want) // streamed deltas are the same text
			})
		}
	}
	t.Logf("tokens or alternatives that were part of a character: %d; answers starting with whitespace: %d", partial, leadingSpace)
	if partial == 0 {
		t.Error("no sampled or top-20 token split a character: the test no longer covers the plugin boundary")
	}
	s.waitIdle(t)
}

// logprobsResult is a Chat Completions body with logprobs.
type logprobsResult struct {
	Choices []struct {
		Message struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
		} `json:"message"`
		Logprobs struct {
			Content []struct {
				Token   string  `json:"token"`
				Logprob float64 `json:"logprob"`
				Bytes   []int   `json:"bytes"`
				Top     []struct {
					Token   string  `json:"token"`
					Logprob float64 `json:"logprob"`
					Bytes   []int   `json:"bytes"`
				} `json:"top_logprobs"`
			} `json:"content"`
		} `json:"logprobs"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens int `json:"prompt_tokens"`
	} `json:"usage"`
}

func intsToBytes(v []int) []byte {
	b := make([]byte, len(v))
	for i, x := range v {
		b[i] = byte(x)
	}
	return b
}

// oneReplacement collapses runs of U+FFFD into one, as strings.ToValidUTF8 writes a run of invalid bytes: the server
// may replace two adjacent broken sequences separately (each token's bytes are decoded as they come).
func oneReplacement(s string) string {
	for strings.Contains(s, "\uFFFD\uFFFD") {
		s = strings.ReplaceAll(s, "\uFFFD\uFFFD", "\uFFFD")
	}
	return s
}
