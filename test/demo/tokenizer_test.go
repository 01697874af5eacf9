// Package demo holds the scripts that train the demo model pair (see
// README.md); this test checks that sdk/tokenizer encodes text exactly as
// the Python tokenizer the models were trained with (demotok.py).
package demo

import (
	"encoding/json"
	"os"
	"slices"
	"testing"

	"github.com/dflash/dflash_server/sdk/tokenizer"
)

type golden struct {
	Text string  `json:"text"`
	IDs  []int32 `json:"ids"`
}

func load(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	md, err := tokenizer.HFMetadata("tokenizer")
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.FromMetadata(func(k string) (any, bool) { v, ok := md[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	if got := md["tokenizer.ggml.pre"]; got != "qwen2" {
		t.Errorf("tokenizer.ggml.pre = %v, want qwen2", got)
	}
	return tok
}

func check(t *testing.T, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cases []golden
	if err := json.Unmarshal(b, &cases); err != nil {
		t.Fatal(err)
	}
	tok := load(t)
	if tok.VocabSize() != 4096 {
		t.Errorf("vocab %d, want 4096", tok.VocabSize())
	}
	bad, total := 0, 0
	for _, c := range cases {
		got := tok.Encode(c.Text, false, true)
		total += len(c.IDs)
		if !slices.Equal(got, c.IDs) {
			bad++
			if bad <= 3 {
				n := min(len(c.Text), 80)
				t.Errorf("%q...: Go %v..., Python %v...", c.Text[:n], got[:min(len(got), 20)], c.IDs[:min(len(c.IDs), 20)])
			}
		}
	}
	t.Logf("%s: %d texts, %d tokens, %d differ", path, len(cases), total, bad)
}

func TestTokenizerGolden(t *testing.T) { check(t, "testdata/tokenizer_golden.json") }

// TestTokenizerCorpus compares a larger file written by
// make_golden.py --text .gpu-demo/heldout.txt.xz --out FILE.
func TestTokenizerCorpus(t *testing.T) {
	p := os.Getenv("DEMO_TOK_GOLDEN")
	if p == "" {
		t.Skip("DEMO_TOK_GOLDEN not set")
	}
	check(t, p)
}
