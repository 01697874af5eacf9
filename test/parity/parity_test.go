package parity

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dflash/dflash_server/native/engine"
)

// maxRelErr is the tolerance of the brief: max |ours - hf| / max |hf| over each logits row, in f32 on the CPU.
// gpuRelErr bounds a GPU device, whose prefill products use half-precision tensor-core operands (bf16 bounds).
const (
	maxRelErr = 1e-4
	gpuRelErr = 3e-2
)

// testDevice is the device the goldens are checked on: $DFLASH_TEST_DEVICE (e.g. cuda:0 on the GPU machine), else cpu.
func testDevice() string {
	if d := os.Getenv("DFLASH_TEST_DEVICE"); d != "" {
		return d
	}
	return "cpu"
}

// bound is the tolerance for the device under test.
func bound() float64 {
	if kind, _, _ := engine.ParseDevice(testDevice()); kind != "cpu" {
		return gpuRelErr
	}
	return maxRelErr
}

type golden struct {
	Case         string `json:"case"`
	Transformers string `json:"transformers"`
	Vocab        int    `json:"vocab"`
	Prompts      []struct {
		IDs    []int32 `json:"ids"`
		Logits []byte  `json:"logits"` // base64 little-endian f32 [len(IDs)][Vocab]
	} `json:"prompts"`
	Decode struct {
		Prompt int     `json:"prompt"`
		Tokens []int32 `json:"tokens"` // greedy: Tokens[0] from the prefill, Tokens[k+1] after feeding Tokens[k]
		Logits []byte  `json:"logits"` // [len(Tokens)-1][Vocab]
	} `json:"decode"`
}

func floats(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func relErr(got, want []float32) float64 {
	var d, m float64
	for i := range want {
		d = math.Max(d, math.Abs(float64(got[i])-float64(want[i])))
		m = math.Max(m, math.Abs(float64(want[i])))
	}
	return d / m
}

func argmax(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}

func libDir(t *testing.T) string {
	dir := os.Getenv("DFLASH_LIB_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "bin", "lib")
	}
	if _, err := os.Stat(filepath.Join(dir, engine.LibName("cpu"))); err != nil {
		t.Fatalf("%s not found in %s: build it first (make, or make -C native OUT=../bin/lib), or set DFLASH_LIB_DIR",
			engine.LibName("cpu"), dir)
	}
	return dir
}

func goldenDir() string {
	if d := os.Getenv("DFLASH_PARITY_DIR"); d != "" {
		return d
	}
	return "testdata"
}

func TestParityWithTransformers(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(goldenDir(), "*.json"))
	if len(files) == 0 {
		t.Fatalf("no goldens in %s: run test/parity/run.sh on a machine with PyTorch and transformers", goldenDir())
	}
	lib, err := engine.Open(libDir(t), testDevice())
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		t.Run(name, func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var g golden
			if err := json.Unmarshal(raw, &g); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			m, err := lib.LoadGGUF(strings.TrimSuffix(f, ".json")+".gguf", engine.Options{
				KVPoolTokens: 1024, MaxSeqs: 4, CacheK: engine.CacheF32, CacheV: engine.CacheF32, Threads: 2,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if m.Info().Vocab != g.Vocab {
				t.Fatalf("vocab %d, golden %d", m.Info().Vocab, g.Vocab)
			}
			checkParity(t, m, &g)
		})
	}
}

func checkParity(t *testing.T, m *engine.Model, g *golden) {
	V := g.Vocab
	worst := 0.0
	check := func(what string, got, want []float32) {
		t.Helper()
		e := relErr(got, want)
		worst = math.Max(worst, e)
		if e > bound() || e != e {
			t.Errorf("%s: max relative error %.3g > %.0e", what, e, bound())
		}
	}
	row := func(b []float32, i int) []float32 { return b[i*V : (i+1)*V] }

	// prefill in one forward: every position
	seqs := make([]engine.Seq, len(g.Prompts))
	for p, pr := range g.Prompts {
		want := floats(pr.Logits)
		s, err := m.NewSeq()
		if err != nil {
			t.Fatal(err)
		}
		seqs[p] = s
		r, err := m.Forward(engine.Batch{Entries: []engine.Entry{{Seq: s, Tokens: pr.IDs, Logits: engine.LogitsAll}}})
		if err != nil {
			t.Fatal(err)
		}
		for i := range pr.IDs {
			check("prefill prompt "+strconv.Itoa(p)+" position "+strconv.Itoa(i), r.Row(0, i), row(want, i))
		}
	}

	// the same prompt prefilled in uneven chunks
	last := g.Prompts[len(g.Prompts)-1]
	want := floats(last.Logits)
	s, err := m.NewSeq()
	if err != nil {
		t.Fatal(err)
	}
	for at, chunk := 0, 37; at < len(last.IDs); chunk += 4 {
		n := min(chunk, len(last.IDs)-at)
		r, err := m.Forward(engine.Batch{Entries: []engine.Entry{{Seq: s, Tokens: last.IDs[at : at+n], Logits: engine.LogitsAll}}})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			check("chunked prefill position "+strconv.Itoa(at+i), r.Row(0, i), row(want, at+i))
		}
		at += n
	}
	if err := m.FreeSeq(s); err != nil {
		t.Fatal(err)
	}

	// decode, fed transformers' greedy tokens: logits of every step, and our greedy choice
	d := g.Decode
	dl := floats(d.Logits)
	prefill := floats(g.Prompts[d.Prompt].Logits)
	if got := argmax(row(prefill, len(g.Prompts[d.Prompt].IDs)-1)); got != d.Tokens[0] {
		t.Fatalf("golden inconsistent: prefill argmax %d, token %d", got, d.Tokens[0])
	}
	for k := 0; k+1 < len(d.Tokens); k++ {
		r, err := m.Forward(engine.Batch{Entries: []engine.Entry{{Seq: seqs[d.Prompt], Tokens: d.Tokens[k : k+1], Logits: engine.LogitsLast}}})
		if err != nil {
			t.Fatal(err)
		}
		check("decode step "+strconv.Itoa(k), r.Row(0, 0), row(dl, k))
		if got := argmax(r.Row(0, 0)); got != d.Tokens[k+1] {
			t.Errorf("decode step %d: greedy token %d, transformers %d", k, got, d.Tokens[k+1])
		}
	}
	for _, s := range seqs {
		_ = m.FreeSeq(s)
	}

	// free-running greedy decode of every prompt in one batch gives transformers' tokens for the decode prompt
	var b engine.Batch
	for _, pr := range g.Prompts {
		s, err := m.NewSeq()
		if err != nil {
			t.Fatal(err)
		}
		b.Entries = append(b.Entries, engine.Entry{Seq: s, Tokens: pr.IDs, Logits: engine.LogitsLast})
	}
	var tokens []int32
	for step := 0; step < len(d.Tokens); step++ {
		r, err := m.Forward(b)
		if err != nil {
			t.Fatal(err)
		}
		for e := range b.Entries {
			next := argmax(r.Row(e, 0))
			if e == d.Prompt {
				tokens = append(tokens, next)
			}
			b.Entries[e].Tokens = []int32{next}
		}
	}
	for i := range d.Tokens {
		if tokens[i] != d.Tokens[i] {
			t.Fatalf("batched greedy decode: tokens %v, transformers %v", tokens, d.Tokens)
		}
	}
	t.Logf("%s (transformers %s): max relative error %.3g over %d prompts and %d decode steps", g.Case,
		g.Transformers, worst, len(g.Prompts), len(d.Tokens)-1)
}
