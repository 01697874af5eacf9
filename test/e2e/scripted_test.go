package e2e

import (
	"strconv"
	"strings"
	"testing"
)

// The two scripted models most tests serve. a (cpu:0) has two slots and a
// KV pool that holds two holders; b (cpu:1) has one slot and more room.
const (
	aSlots, aKV = 2, 1500
	bSlots, bKV = 1, 2000
	// tokenDelay keeps a holder's capacity for holdTokens × tokenDelay
	// (a minute), far longer than any subtest looks at it; every holder
	// is cancelled by its test.
	tokenDelay = "100ms"
	holdTokens = 600
	// holdNeed is a holder's KV need: its prompt "user: hold\n" plus
	// holdTokens.
	holdNeed = len("user: hold\n") + holdTokens
)

// twoModels writes a.gguf and b.gguf into a fresh directory and returns the
// two model blocks, with extra options appended to both.
func twoModels(t *testing.T, extra ...string) []string {
	t.Helper()
	return twoModelsIn(t, t.TempDir(), extra...)
}

// twoModelsIn is twoModels with the model files in dir.
func twoModelsIn(t *testing.T, dir string, extra ...string) []string {
	t.Helper()
	a := scriptedModel(t, dir, "a")
	b := scriptedModel(t, dir, "b")
	blocks := []string{
		"--model", a, "--model-name", "a", "--target-device", "cpu:0",
		"--max-concurrency", itoa(aSlots), "--kv-pool-tokens", itoa(aKV), "--max-ctx", itoa(aKV),
		"--scripted-token-delay", tokenDelay,
	}
	blocks = append(blocks, extra...)
	blocks = append(blocks,
		"--model", b, "--model-name", "b", "--target-device", "cpu:1",
		"--max-concurrency", itoa(bSlots), "--kv-pool-tokens", itoa(bKV), "--max-ctx", itoa(bKV),
		"--scripted-token-delay", tokenDelay,
	)
	return append(blocks, extra...)
}

// holdReq is a streaming request that keeps its slot and holdNeed KV
// tokens until it is cancelled.
func holdReq(model string) map[string]any {
	b := chatReq(model, "hold", holdTokens, true)
	b["ignore_eos"] = true
	return b
}

// hold starts a holder and waits until a model admitted it (the SSE
// headers arrive only after admission); want is the model it must land on
// ("" for any).
func (s *server) hold(t *testing.T, model, want string) *call {
	t.Helper()
	return s.holdWith(t, holdReq(model), want)
}

// holdWith is hold with a body of the caller's: a streaming request long
// enough to keep its slot while the test looks (the real models' holders
// generate thousands of tokens; every holder is cancelled by its test).
func (s *server) holdWith(t *testing.T, body map[string]any, want string) *call {
	t.Helper()
	c := s.start(t, pathChat, body)
	c.waitHead(t)
	if c.status != 200 {
		c.wait(t)
		t.Fatalf("holder: status %d: %s", c.status, c.bodyBytes())
	}
	if want != "" && c.model() != want {
		t.Fatalf("holder landed on %q, want %q", c.model(), want)
	}
	return c
}

// quick is a request that finishes after one token.
func quick(model string) map[string]any { return chatReq(model, "hi", 1, false) }

// release cancels calls (client disconnects).
func release(calls ...*call) {
	for _, c := range calls {
		c.cancel()
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func contains(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}
