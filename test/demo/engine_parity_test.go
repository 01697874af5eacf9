package demo

import (
	"encoding/json"
	"math"
	"os"
	"testing"

	"github.com/dflash/dflash_server/native/engine"
)

// TestEngineParity runs a target GGUF (best converted with --type f32) on
// the CPU engine and compares its logits and captured layer outputs with
// the PyTorch reference written by parity_ref.py:
//
//	DEMO_PARITY_GGUF=x.gguf DEMO_PARITY_REF=ref.json DFLASH_LIB_DIR=bin/lib go test ./test/demo -run Parity
func TestEngineParity(t *testing.T) {
	path, refPath := os.Getenv("DEMO_PARITY_GGUF"), os.Getenv("DEMO_PARITY_REF")
	if path == "" || refPath == "" {
		t.Skip("DEMO_PARITY_GGUF / DEMO_PARITY_REF not set")
	}
	var ref struct {
		Tokens  []int32       `json:"tokens"`
		Logits  [][]float32   `json:"logits"`
		Layers  []int         `json:"layers"`
		Capture [][][]float32 `json:"capture"`
	}
	b, err := os.ReadFile(refPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("DFLASH_LIB_DIR")
	if dir == "" {
		dir = "../../bin/lib"
	}
	lib, err := engine.Open(dir, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	m, err := lib.LoadGGUF(path, engine.Options{KVPoolTokens: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	s, err := m.NewSeq()
	if err != nil {
		t.Fatal(err)
	}
	r, err := m.Forward(engine.Batch{Entries: []engine.Entry{{Seq: s, Tokens: ref.Tokens, Logits: engine.LogitsAll}}, Capture: ref.Layers})
	if err != nil {
		t.Fatal(err)
	}
	var maxD, maxRef float64
	argmaxSame := 0
	for i := range ref.Tokens {
		row := r.Row(0, i)
		ga, ra := 0, 0
		for v := range row {
			maxD = math.Max(maxD, math.Abs(float64(row[v]-ref.Logits[i][v])))
			maxRef = math.Max(maxRef, math.Abs(float64(ref.Logits[i][v])))
			if row[v] > row[ga] {
				ga = v
			}
			if ref.Logits[i][v] > ref.Logits[i][ra] {
				ra = v
			}
		}
		if ga == ra {
			argmaxSame++
		}
	}
	var maxC, maxCRef float64
	for i := range ref.Tokens {
		for c := range ref.Layers {
			h := r.Hidden(0, i, c)
			for j, v := range h {
				maxC = math.Max(maxC, math.Abs(float64(v-ref.Capture[i][c][j])))
				maxCRef = math.Max(maxCRef, math.Abs(float64(ref.Capture[i][c][j])))
			}
		}
	}
	t.Logf("%d tokens: logits max |diff| %.4g (max |ref| %.4g), argmax equal %d/%d; capture max |diff| %.4g (max |ref| %.4g)",
		len(ref.Tokens), maxD, maxRef, argmaxSame, len(ref.Tokens), maxC, maxCRef)
	if maxD > 0.02*maxRef || maxC > 0.02*maxCRef || argmaxSame < len(ref.Tokens)*9/10 {
		t.Errorf("engine and PyTorch disagree")
	}
}
