package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/dflash/dflash_server/sdk/gguf/quant"
)

// libDir finds libdflash_cpu.so: $DFLASH_LIB_DIR, else bin/lib of the repository (built by make).
func libDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("DFLASH_LIB_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "bin", "lib")
	}
	if _, err := os.Stat(filepath.Join(dir, LibName("cpu"))); err != nil {
		t.Fatalf("%s not found in %s: build it first (make -C native OUT=../bin/lib, or make), or set DFLASH_LIB_DIR",
			LibName("cpu"), dir)
	}
	return dir
}

func openCPU(t testing.TB) *Lib {
	t.Helper()
	lib, err := Open(libDir(t), "cpu")
	if err != nil {
		t.Fatal(err)
	}
	return lib
}

// config of a random test model.
type config struct {
	arch                    string
	vocab, embd, ff, layers int
	heads, headsKV, headDim int
	theta                   float64
	ropeDim                 int // 0: headDim
	nk, nv, dk, dv, convK   int // qwen35 Gated DeltaNet
	weight                  gguf.Type
	tied                    bool
	seed                    uint64
}

func tinyQwen3() config {
	return config{arch: "qwen3", vocab: 256, embd: 64, ff: 128, layers: 3, heads: 4, headsKV: 2, headDim: 16,
		theta: 1e6, weight: gguf.F32, seed: 1}
}

func tinyQwen35() config {
	return config{arch: "qwen35", vocab: 256, embd: 64, ff: 128, layers: 4, heads: 4, headsKV: 2, headDim: 16,
		theta: 1e7, ropeDim: 4, nk: 2, nv: 4, dk: 16, dv: 32, convK: 4, weight: gguf.F32, seed: 2}
}

// randomSpec builds a model with every weight drawn at random (norms around 1, decays moderate), matrices stored as
// c.weight.
func randomSpec(t testing.TB, c config) ModelSpec {
	t.Helper()
	rng := rand.New(rand.NewPCG(c.seed, 7))
	a := c.arch + "."
	meta := map[string]any{
		a + "block_count":                      uint32(c.layers),
		a + "embedding_length":                 uint32(c.embd),
		a + "feed_forward_length":              uint32(c.ff),
		a + "attention.head_count":             uint32(c.heads),
		a + "attention.head_count_kv":          uint32(c.headsKV),
		a + "attention.key_length":             uint32(c.headDim),
		a + "attention.value_length":           uint32(c.headDim),
		a + "attention.layer_norm_rms_epsilon": float32(1e-6),
		a + "rope.freq_base":                   float32(c.theta),
		a + "context_length":                   uint32(4096),
	}
	if c.ropeDim > 0 {
		meta[a+"rope.dimension_count"] = uint32(c.ropeDim)
	}
	hybrid := c.arch == "qwen35"
	if hybrid {
		meta[a+"full_attention_interval"] = uint32(4)
		meta[a+"ssm.conv_kernel"] = uint32(c.convK)
		meta[a+"ssm.state_size"] = uint32(c.dk)
		meta[a+"ssm.group_count"] = uint32(c.nk)
		meta[a+"ssm.time_step_rank"] = uint32(c.nv)
		meta[a+"ssm.inner_size"] = uint32(c.nv * c.dv)
	}
	var tensors []Tensor
	var jobs []func() // quantization runs in parallel; every tensor has its own seeded generator
	vals := func(rng *rand.Rand, n int, f func(*rand.Rand) float64) []float32 {
		out := make([]float32, n)
		for i := range out {
			out[i] = float32(f(rng))
		}
		return out
	}
	seed := func() *rand.Rand { return rand.New(rand.NewPCG(rng.Uint64(), uint64(len(tensors)))) }
	addF32 := func(name string, v []float32, dims ...uint64) {
		tensors = append(tensors, Tensor{Name: name, Type: gguf.F32, Dims: dims, Data: f32Bytes(v)})
	}
	addMat := func(name string, in, out int, std float64) {
		r := seed()
		tensors = append(tensors, Tensor{Name: name, Type: c.weight, Dims: []uint64{uint64(in), uint64(out)}})
		idx := len(tensors) - 1
		jobs = append(jobs, func() {
			v := vals(r, in*out, normal(std))
			if c.weight == gguf.F32 {
				tensors[idx].Data = f32Bytes(v)
				return
			}
			b, err := quant.FromFloat32(c.weight, v)
			if err != nil {
				panic(fmt.Sprintf("quantize %s: %v", name, err))
			}
			tensors[idx].Data = b
		})
	}
	norm := func(name string, n int) {
		addF32(name, vals(seed(), n, func(r *rand.Rand) float64 { return 1 + r.NormFloat64()*0.1 }), uint64(n))
	}

	addMat("token_embd.weight", c.embd, c.vocab, 0.5)
	if !c.tied {
		addMat("output.weight", c.embd, c.vocab, 0.1)
	}
	norm("output_norm.weight", c.embd)
	for il := 0; il < c.layers; il++ {
		p := fmt.Sprintf("blk.%d.", il)
		norm(p+"attn_norm.weight", c.embd)
		if hybrid {
			norm(p+"post_attention_norm.weight", c.embd)
		} else {
			norm(p+"ffn_norm.weight", c.embd)
		}
		if !hybrid || (il+1)%4 == 0 {
			qOut := c.heads * c.headDim
			if hybrid {
				qOut *= 2
			}
			addMat(p+"attn_q.weight", c.embd, qOut, 0.1)
			addMat(p+"attn_k.weight", c.embd, c.headsKV*c.headDim, 0.1)
			addMat(p+"attn_v.weight", c.embd, c.headsKV*c.headDim, 0.1)
			addMat(p+"attn_output.weight", c.heads*c.headDim, c.embd, 0.1)
			norm(p+"attn_q_norm.weight", c.headDim)
			norm(p+"attn_k_norm.weight", c.headDim)
		} else {
			ch := 2*c.nk*c.dk + c.nv*c.dv
			addMat(p+"attn_qkv.weight", c.embd, ch, 0.1)
			addMat(p+"attn_gate.weight", c.embd, c.nv*c.dv, 0.1)
			addMat(p+"ssm_beta.weight", c.embd, c.nv, 0.1)
			addMat(p+"ssm_alpha.weight", c.embd, c.nv, 0.1)
			addMat(p+"ssm_out.weight", c.nv*c.dv, c.embd, 0.1)
			addF32(p+"ssm_conv1d.weight", vals(seed(), c.convK*ch, normal(0.3)), uint64(c.convK), uint64(ch))
			addF32(p+"ssm_a", vals(seed(), c.nv, func(r *rand.Rand) float64 { return -(0.5 + 3.5*r.Float64()) }), uint64(c.nv))
			addF32(p+"ssm_dt.bias", vals(seed(), c.nv, normal(0.5)), uint64(c.nv))
			norm(p+"ssm_norm.weight", c.dv)
		}
		addMat(p+"ffn_gate.weight", c.embd, c.ff, 0.1)
		addMat(p+"ffn_up.weight", c.embd, c.ff, 0.1)
		addMat(p+"ffn_down.weight", c.ff, c.embd, 0.1)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.NumCPU())
	for _, job := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			job()
		}()
	}
	wg.Wait()
	return ModelSpec{Arch: c.arch, Meta: meta, Tensors: tensors}
}

func loadRandom(t testing.TB, lib *Lib, c config, opt Options) *Model {
	t.Helper()
	spec := randomSpec(t, c)
	spec.Options = opt
	return loadSpec(t, lib, spec)
}

// loadSpec loads spec on lib and closes the model when the test ends.
func loadSpec(t testing.TB, lib *Lib, spec ModelSpec) *Model {
	t.Helper()
	m, err := lib.LoadModel(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func randomTokens(rng *rand.Rand, n, vocab int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(rng.IntN(vocab))
	}
	return out
}

// normal draws from N(0, std²).
func normal(std float64) func(*rand.Rand) float64 {
	return func(r *rand.Rand) float64 { return r.NormFloat64() * std }
}

// f32Bytes is v as GGUF stores F32 tensor data (little endian).
func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		u := math.Float32bits(x)
		b[4*i], b[4*i+1], b[4*i+2], b[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
	}
	return b
}
