package engine

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/dflash/dflash_server/sdk/gguf"
)

// testDevice is the GPU device the device tests compare with the CPU engine: $DFLASH_TEST_DEVICE (e.g. "cuda:0").
// Without it, or without the library or the GPU, they skip and say why: CI machines have no GPU.
func testDevice(t *testing.T) *Lib {
	t.Helper()
	dev := os.Getenv("DFLASH_TEST_DEVICE")
	if dev == "" || dev == "cpu" || dev == "cpu:0" {
		t.Skip("no GPU device under test: set DFLASH_TEST_DEVICE=cuda:0 on a machine with libdflash_cuda.so (make cuda)")
	}
	kind, _, err := ParseDevice(dev)
	if err != nil {
		t.Fatal(err)
	}
	dir := libDir(t)
	if _, err := os.Stat(filepath.Join(dir, LibName(kind))); err != nil {
		t.Skipf("%s not built in %s (make cuda)", LibName(kind), dir)
	}
	lib, err := Open(dir, dev)
	if err != nil {
		t.Skipf("device %s unavailable: %v", dev, err)
	}
	return lib
}

// deviceBound is the largest max-relative-error of a logits row the device may show against the CPU engine. The CPU
// computes in f32; the GPU's prefill products run on tensor cores with half-precision operands (8 bits of mantissa
// for bf16), which through a few layers of a random model moves logits by up to about 1e-2 of their range.
const deviceBound = 3e-2

// bf16Bound is the bound for the random qwen35 with bf16 weights, whose prefill products round the activations to
// bf16 (as llama.cpp's do): on this chaotic random model that rounding alone, emulated on the CPU, moves logits rows
// by up to 0.19 of their range (seen 2026-12-02), while the GPU shows 0.16.
const bf16Bound = 0.25

// int8Bound is the bound for q8_0, q4_K, q6_K (and q4_0, as q8_0) weights, whose products on the GPU quantize the activations to int8
// per block of 32 as llama.cpp's do (the op test bounds that product at 1.5e-2): through these random models' layers
// it moves logits rows by up to 0.15 of their range (seen 2026-12-02, H200; q6_K 0.08 on 12-03).
const int8Bound = 0.25

// TestDeviceMatchesCPU replays one script of engine calls on the CPU and on the device under test: batched prefill,
// batched decode, snapshot/rollback, recorded verify with truncation, hidden-state capture. Every logits row must
// agree within deviceBound and the captured hidden states likewise.
func TestDeviceMatchesCPU(t *testing.T) {
	dev := testDevice(t)
	cpu := openCPU(t)
	type variant struct {
		c              config
		cacheK, cacheV CacheType
	}
	var vs []variant
	// (Q4_0 last: the cache variants below take vs[1] and vs[6]) the CUDA engine multiplies q4_0 as q8_0 blocks
	for _, wt := range []gguf.Type{gguf.F32, gguf.F16, gguf.BF16, gguf.Q8_0, gguf.Q4_K, gguf.Q6_K, gguf.Q4_0} {
		q3 := tinyQwen3()
		q3.embd, q3.ff, q3.headDim, q3.vocab = 256, 512, 64, 512
		q35 := tinyQwen35()
		q35.embd, q35.ff, q35.headDim, q35.vocab, q35.dk, q35.dv, q35.ropeDim = 256, 512, 64, 512, 32, 64, 16
		q3.weight, q35.weight = wt, wt
		vs = append(vs, variant{q3, CacheF16, CacheF16})
		// Not qwen35 with q4_0: on that random model the activations' int8 rounding alone moves two rows by 0.55 and
		// 0.31 of their range (the CPU's own int8 path against its float path shows the same rows, 2026-12-04), so no
		// bound would tell a bug from the rounding. The device multiplies q4_0 as the q8_0 blocks of the same values,
		// which the qwen35 q8_0 model covers.
		if wt != gguf.Q4_0 {
			vs = append(vs, variant{q35, CacheF32, CacheF32})
		}
	}
	vs = append(vs, variant{vs[6].c, CacheQ8_0, CacheQ8_0}, variant{vs[1].c, CacheBF16, CacheQ8_0})
	for _, v := range vs {
		name := fmt.Sprintf("%s/%v/%s-%s", v.c.arch, v.c.weight, v.cacheK, v.cacheV)
		t.Run(name, func(t *testing.T) {
			spec := randomSpec(t, v.c)
			spec.Options = Options{KVPoolTokens: 1024, BlockSize: 16, MaxSeqs: 3, CacheK: v.cacheK, CacheV: v.cacheV, Threads: 2}
			want := replay(t, cpu, spec, v.c)
			got := replay(t, dev, spec, v.c)
			bound := deviceBound
			switch {
			case v.c.arch == "qwen35" && v.c.weight == gguf.BF16:
				bound = bf16Bound
			case v.c.weight == gguf.Q8_0 || v.c.weight == gguf.Q4_K || v.c.weight == gguf.Q6_K || v.c.weight == gguf.Q4_0:
				bound = int8Bound
			}
			checkReplay(t, got, want, bound)
		})
	}
}

type replayRow struct {
	what string
	v    []float32
}

// replayer runs a device test's script of engine calls on one model and keeps the rows the test compares.
type replayer struct {
	t     *testing.T
	kind  string
	m     *Model
	rng   *rand.Rand
	vocab int
	out   []replayRow
}

// newReplayer loads spec on lib; the caller closes r.m.
func newReplayer(t *testing.T, lib *Lib, spec ModelSpec, rng *rand.Rand, vocab int) *replayer {
	t.Helper()
	m, err := lib.LoadModel(spec)
	if err != nil {
		t.Fatalf("%s: %v", lib.Kind(), err)
	}
	return &replayer{t: t, kind: lib.Kind(), m: m, rng: rng, vocab: vocab}
}

func (p *replayer) must(r *Result, err error) *Result {
	p.t.Helper()
	if err != nil {
		p.t.Fatalf("%s: %v", p.kind, err)
	}
	return r
}

func (p *replayer) tokens(n int) []int32 { return randomTokens(p.rng, n, p.vocab) }

func (p *replayer) keepRow(what string, v []float32) {
	p.out = append(p.out, replayRow{what, append([]float32(nil), v...)})
}

func (p *replayer) keep(what string, r *Result, e, rows int) {
	for i := 0; i < rows; i++ {
		p.keepRow(fmt.Sprintf("%s row %d", what, i), r.Row(e, i))
	}
}

// twoSequences is the script's first part: batched prefill of two sequences, batched decode, snapshot / rollback, and
// a recorded verify block truncated. It returns the two sequences.
func (p *replayer) twoSequences() (a, b Seq) {
	t, m := p.t, p.m
	a, _ = m.NewSeq()
	b, _ = m.NewSeq()
	pa, pb := p.tokens(29), p.tokens(5)
	r := p.must(m.Forward(Batch{Entries: []Entry{{Seq: a, Tokens: pa, Logits: LogitsAll}, {Seq: b, Tokens: pb, Logits: LogitsLast}}}))
	p.keep("prefill a", r, 0, len(pa))
	p.keep("prefill b", r, 1, 1)
	for step := 0; step < 4; step++ {
		r = p.must(m.Forward(Batch{Entries: []Entry{
			{Seq: a, Tokens: p.tokens(1), Logits: LogitsLast},
			{Seq: b, Tokens: p.tokens(1), Logits: LogitsLast},
		}}))
		p.keep(fmt.Sprintf("decode %d a", step), r, 0, 1)
		p.keep(fmt.Sprintf("decode %d b", step), r, 1, 1)
	}
	if err := m.Snapshot(a); err != nil {
		t.Fatal(err)
	}
	p.must(m.Forward(one(a, p.tokens(6), LogitsAll)))
	if err := m.Rollback(a); err != nil {
		t.Fatal(err)
	}
	r = p.must(m.Forward(one(a, p.tokens(3), LogitsAll)))
	p.keep("after rollback", r, 0, 3)
	n, _ := m.SeqLen(b)
	r = p.must(m.Forward(Batch{Entries: []Entry{{Seq: b, Tokens: p.tokens(5), Logits: LogitsAll, Record: true}}}))
	p.keep("recorded verify", r, 0, 5)
	if err := m.Truncate(b, n+2); err != nil {
		t.Fatal(err)
	}
	r = p.must(m.Forward(one(b, p.tokens(2), LogitsAll)))
	p.keep("after truncate", r, 0, 2)
	return a, b
}

// decodeThree is the script's last step: one decode step of x, a and b together.
func (p *replayer) decodeThree(x, a, b Seq) {
	r := p.must(p.m.Forward(Batch{Entries: []Entry{
		{Seq: x, Tokens: p.tokens(1), Logits: LogitsLast},
		{Seq: a, Tokens: p.tokens(1), Logits: LogitsLast},
		{Seq: b, Tokens: p.tokens(1), Logits: LogitsLast},
	}}))
	p.keep("decode x", r, 0, 1)
	p.keep("decode a", r, 1, 1)
	p.keep("decode b", r, 2, 1)
}

// checkReplay fails t for each row of got further than bound (max-relative error) from its row in want.
func checkReplay(t *testing.T, got, want []replayRow, bound float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d results on the device, %d on the CPU", len(got), len(want))
	}
	worst := 0.0
	for i := range want {
		e := relErr(got[i].v, want[i].v)
		worst = max(worst, e)
		if e > bound || e != e {
			t.Errorf("%s: max relative error %.3g > %.0e", want[i].what, e, bound)
		}
	}
	t.Logf("worst max-relative error over %d rows: %.3g", len(want), worst)
}

// replay runs the script on lib and returns every logits row and captured hidden state in order.
func replay(t *testing.T, lib *Lib, spec ModelSpec, c config) []replayRow {
	t.Helper()
	p := newReplayer(t, lib, spec, rand.New(rand.NewPCG(42, 1)), c.vocab)
	defer p.m.Close()
	a, b := p.twoSequences()
	// a long prompt in a third sequence, across many KV blocks, with capture of the first and last layers
	x, _ := p.m.NewSeq()
	px := p.tokens(150)
	r := p.must(p.m.Forward(Batch{Entries: []Entry{{Seq: x, Tokens: px, Logits: LogitsLast}}, Capture: []int{0, c.layers - 1}}))
	p.keep("long prefill", r, 0, 1)
	for i := 0; i < len(px); i += 37 {
		p.keepRow(fmt.Sprintf("capture token %d layer 0", i), r.Hidden(0, i, 0))
		p.keepRow(fmt.Sprintf("capture token %d last layer", i), r.Hidden(0, i, 1))
	}
	p.decodeThree(x, a, b)
	p.capturedVerifies(a, c.layers)
	return p.out
}

// capturedVerifies runs three recorded verify blocks of one shape with hidden-state capture, each cut back after it,
// and keeps their rows and captures: a device with graphs runs the first op by op, captures the second, replays the
// third (its captures then reach the host from inside the replay). The second and third read them in place.
func (p *replayer) capturedVerifies(s Seq, layers int) {
	for k := 0; k < 3; k++ {
		n, _ := p.m.SeqLen(s)
		toks := p.tokens(6)
		r := p.must(p.m.Forward(Batch{Entries: []Entry{{Seq: s, Tokens: toks, Logits: LogitsAll, Record: true}},
			Capture: []int{0, layers / 2}, CaptureInPlace: k > 0}))
		p.keep(fmt.Sprintf("captured verify %d", k), r, 0, len(toks))
		for i := range toks {
			p.keepRow(fmt.Sprintf("captured verify %d token %d layer 0", k, i), r.Hidden(0, i, 0))
			p.keepRow(fmt.Sprintf("captured verify %d token %d middle layer", k, i), r.Hidden(0, i, 1))
		}
		if err := p.m.Truncate(s, n+2); err != nil {
			p.t.Fatal(err)
		}
	}
}

// A model on the device reports its memory, and the device's memory shrinks by at least the KV pool it allocated.
func TestDeviceMemory(t *testing.T) {
	dev := testDevice(t)
	free0, total, err := dev.Memory()
	if err != nil {
		t.Fatal(err)
	}
	if total == 0 || free0 > total {
		t.Fatalf("memory: free %d of %d", free0, total)
	}
	c := tinyQwen3()
	spec := randomSpec(t, c)
	spec.Options = Options{KVPoolTokens: 1 << 20, MaxSeqs: 1, CacheK: CacheF32, CacheV: CacheF32}
	m, err := dev.LoadModel(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	free1, _, err := dev.Memory()
	if err != nil {
		t.Fatal(err)
	}
	pool := m.Info().KVBytesPerToken * (1 << 20)
	if free0-free1 < pool {
		t.Fatalf("free memory fell by %d bytes, the KV pool alone is %d", free0-free1, pool)
	}
}

// The device's top-k candidates and log-sum-exp agree with its own full logits.
func TestDeviceTopK(t *testing.T) {
	dev := testDevice(t)
	c := tinyQwen3()
	c.embd, c.ff, c.headDim, c.vocab = 256, 512, 64, 5000
	spec := randomSpec(t, c)
	spec.Options = Options{KVPoolTokens: 512, MaxSeqs: 4}
	m, err := dev.LoadModel(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	checkTopK(t, m, c.vocab, 1e-5)
}

// TestDeviceFoldMatchesCPU replays one-token forwards of q8_0 models of real width (4096: their one-token products
// take the staged-ahead GEMV, their output projections the CUDA device's residual-norm fold,
// CudaDevice::matmul_add_rmsnorm, and the qwen35's DeltaNet input projection the conv fold where
// DFL_CUDA_CONV_FOLD=1 asks for it): a qwen3 of qwen3-8b's width and a qwen35 with three DeltaNet layers (5,152-row
// input projections: two rows a warp) and a gated attention layer. One-token steps with and without hidden-state
// capture of a middle layer (a speculating engine's one-token steps capture; a capture's copy may not come between a
// fold and its product), then 16-token blocks as a verify's, with and without a capture (the ops apart, as the
// 12-token prefill, after folded steps: nothing a fold staged or counted may reach them); every logits row and capture
// against the CPU engine's.
func TestDeviceFoldMatchesCPU(t *testing.T) {
	dev := testDevice(t)
	cpu := openCPU(t)
	for _, c := range []config{
		{arch: "qwen3", vocab: 512, embd: 4096, ff: 4096, layers: 3, heads: 32, headsKV: 8, headDim: 128, theta: 1e6,
			weight: gguf.Q8_0, seed: 7},
		{arch: "qwen35", vocab: 512, embd: 4096, ff: 4096, layers: 4, heads: 32, headsKV: 4, headDim: 128, theta: 1e7,
			ropeDim: 64, nk: 4, nv: 16, dk: 128, dv: 128, convK: 4, weight: gguf.Q8_0, seed: 8},
	} {
		t.Run(c.arch, func(t *testing.T) { checkFoldReplay(t, dev, cpu, c) })
	}
}

func checkFoldReplay(t *testing.T, dev, cpu *Lib, c config) {
	spec := randomSpec(t, c)
	spec.Options = Options{KVPoolTokens: 256, BlockSize: 16, MaxSeqs: 1, CacheK: CacheF16, CacheV: CacheF16, Threads: 2}
	run := func(lib *Lib) []replayRow {
		p := newReplayer(t, lib, spec, rand.New(rand.NewPCG(7, 1)), c.vocab)
		defer p.m.Close()
		s, _ := p.m.NewSeq()
		p.keep("prefill", p.must(p.m.Forward(one(s, p.tokens(12), LogitsLast))), 0, 1)
		for step := 0; step < 6; step++ {
			b := one(s, p.tokens(1), LogitsLast)
			if step%2 == 1 {
				b.Capture = []int{1}
			}
			r := p.must(p.m.Forward(b))
			p.keep(fmt.Sprintf("decode %d", step), r, 0, 1)
			if step%2 == 1 {
				p.keepRow(fmt.Sprintf("decode %d capture layer 1", step), r.Hidden(0, 0, 0))
			}
		}
		for i, capture := range [][]int{nil, {1}} {
			b := one(s, p.tokens(16), LogitsLast)
			b.Capture = capture
			r := p.must(p.m.Forward(b))
			p.keep(fmt.Sprintf("block %d", i), r, 0, 1)
			if capture != nil {
				p.keepRow(fmt.Sprintf("block %d capture layer 1, last token", i), r.Hidden(0, 15, 0))
			}
		}
		return p.out
	}
	checkReplay(t, run(dev), run(cpu), int8Bound)
}
