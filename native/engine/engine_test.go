package engine

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/dflash/dflash_server/sdk/gguf/quant"
	"github.com/matryer/is"
)

// relErr is max|a-b| / max|b|.
func relErr(a, b []float32) float64 {
	var d, m float64
	for i := range b {
		d = math.Max(d, math.Abs(float64(a[i])-float64(b[i])))
		m = math.Max(m, math.Abs(float64(b[i])))
	}
	if m == 0 {
		return d
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

func one(s Seq, toks []int32, mode LogitsMode) Batch {
	return Batch{Entries: []Entry{{Seq: s, Tokens: toks, Logits: mode}}}
}

func TestOpenErrors(t *testing.T) {
	dir := libDir(t)
	tests := []struct {
		device, want string
	}{
		{"cuda:0", "engine library libdflash_cuda.so not found in " + dir + ": this build has no cuda support"},
		{"hip", "this build has no hip support"},
		{"", "empty device kind"},
		{"cpu:x", "bad device index"},
		{"c/pu", "bad device kind"},
	}
	for _, tc := range tests {
		t.Run(tc.device, func(t *testing.T) {
			is := is.New(t)
			_, err := Open(dir, tc.device)
			is.True(err != nil)
			is.True(strings.Contains(err.Error(), tc.want)) // error names the problem
		})
	}
	t.Run("cpu", func(t *testing.T) {
		is := is.New(t)
		lib, err := Open(dir, "cpu:0")
		is.NoErr(err)
		is.Equal(lib.Kind(), "cpu")
		is.True(filepath.IsAbs(lib.Path()))
	})
}

func TestLoadErrorsNameTheCulprit(t *testing.T) {
	lib := openCPU(t)
	base := func() ModelSpec {
		s := randomSpec(t, tinyQwen3())
		s.KVPoolTokens = 64
		return s
	}
	tests := []struct {
		name   string
		mutate func(*ModelSpec)
		want   string
		is     error
	}{
		{"unknown arch", func(s *ModelSpec) { s.Arch = "llama9" }, `architecture "llama9" is not supported`, ErrUnsupported},
		{"missing tensor", func(s *ModelSpec) { s.Tensors = s.Tensors[:len(s.Tensors)-1] }, "tensor blk.2.ffn_down.weight is missing", ErrInvalid},
		{"bad shape", func(s *ModelSpec) {
			for i := range s.Tensors {
				if s.Tensors[i].Name == "blk.1.attn_k.weight" {
					s.Tensors[i].Dims = []uint64{64, 16}
				}
			}
		}, "tensor blk.1.attn_k.weight has shape [64, 16], want [64, 32]", ErrInvalid},
		{"missing hparam", func(s *ModelSpec) { delete(s.Meta, "qwen3.embedding_length") }, "qwen3.embedding_length", ErrInvalid},
		{"bad cache type", func(s *ModelSpec) { s.CacheK = "q4_0" }, `unknown KV cache type "q4_0"`, nil},
		{"no kv pool", func(s *ModelSpec) { s.KVPoolTokens = 0 }, "kv_pool_tokens", ErrInvalid},
		{"q8 cache needs 32-wide heads", func(s *ModelSpec) { s.CacheV = CacheQ8_0 }, "head_dim 16", ErrInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			s := base()
			tc.mutate(&s)
			_, err := lib.LoadModel(s)
			is.True(err != nil)
			is.True(strings.Contains(err.Error(), tc.want)) // message names the culprit
			if tc.is != nil {
				is.True(errors.Is(err, tc.is))
			}
		})
	}
}

// Prefill in one forward (HF's chunked DeltaNet path for qwen35) must match feeding tokens one by one (recurrent
// path) and prefilling in uneven chunks. Typical errors are ~1e-6; the bound is the parity bar, since the GDN output
// norm amplifies the paths' rounding differences where a head's output is nearly zero.
func TestPrefillMatchesDecodeAndChunks(t *testing.T) {
	lib := openCPU(t)
	for _, c := range []config{tinyQwen3(), tinyQwen35()} {
		t.Run(c.arch, func(t *testing.T) {
			is := is.New(t)
			m := loadRandom(t, lib, c, Options{KVPoolTokens: 512, MaxSeqs: 3, CacheK: CacheF32, CacheV: CacheF32, Threads: 2})
			toks := randomTokens(rand.New(rand.NewPCG(3, 3)), 150, c.vocab)

			s1, err := m.NewSeq()
			is.NoErr(err)
			full, err := m.Forward(one(s1, toks, LogitsAll))
			is.NoErr(err)

			s2, _ := m.NewSeq()
			for i, tk := range toks {
				r, err := m.Forward(one(s2, []int32{tk}, LogitsLast))
				is.NoErr(err)
				if e := relErr(r.Row(0, 0), full.Row(0, i)); e > 1e-4 {
					t.Fatalf("token %d: decode vs prefill rel err %.3g", i, e)
				}
			}

			s3, _ := m.NewSeq()
			at := 0
			for _, n := range []int{37, 1, 64, 48} {
				r, err := m.Forward(one(s3, toks[at:at+n], LogitsAll))
				is.NoErr(err)
				for i := 0; i < n; i++ {
					if e := relErr(r.Row(0, i), full.Row(0, at+i)); e > 1e-4 {
						t.Fatalf("token %d: chunked prefill rel err %.3g", at+i, e)
					}
				}
				at += n
			}
			n, _ := m.SeqLen(s3)
			is.Equal(n, 150)
		})
	}
}

// Greedy decoding of several sequences in one batch (mixing prefill and decode entries) gives exactly the tokens and
// logits of each sequence run alone.
func TestBatchedDecodeEqualsAlone(t *testing.T) {
	lib := openCPU(t)
	for _, c := range []config{tinyQwen3(), tinyQwen35()} {
		t.Run(c.arch, func(t *testing.T) {
			is := is.New(t)
			m := loadRandom(t, lib, c, Options{KVPoolTokens: 1024, BlockSize: 8, MaxSeqs: 4, CacheK: CacheF16, CacheV: CacheF16, Threads: 3})
			rng := rand.New(rand.NewPCG(4, 4))
			prompts := [][]int32{randomTokens(rng, 5, c.vocab), randomTokens(rng, 70, c.vocab), randomTokens(rng, 1, c.vocab), randomTokens(rng, 33, c.vocab)}
			const steps = 12

			alone := make([][][]float32, len(prompts))
			for i, p := range prompts {
				s, err := m.NewSeq()
				is.NoErr(err)
				r, err := m.Forward(one(s, p, LogitsLast))
				is.NoErr(err)
				row := r.Row(0, 0)
				alone[i] = append(alone[i], row)
				for k := 0; k < steps; k++ {
					r, err = m.Forward(one(s, []int32{argmax(row)}, LogitsLast))
					is.NoErr(err)
					row = r.Row(0, 0)
					alone[i] = append(alone[i], row)
				}
				is.NoErr(m.FreeSeq(s))
			}

			// together: sequence i joins at step i (its prefill rides along with the others' decode tokens)
			seqs := make([]Seq, len(prompts))
			next := make([]int32, len(prompts))
			done := make([]int, len(prompts))
			for step := 0; step < len(prompts)+steps; step++ {
				var b Batch
				var who []int
				for i, p := range prompts {
					switch {
					case step == i:
						s, err := m.NewSeq()
						is.NoErr(err)
						seqs[i] = s
						b.Entries = append(b.Entries, Entry{Seq: s, Tokens: p, Logits: LogitsLast})
						who = append(who, i)
					case step > i && done[i] <= steps:
						b.Entries = append(b.Entries, Entry{Seq: seqs[i], Tokens: []int32{next[i]}, Logits: LogitsLast})
						who = append(who, i)
					}
				}
				if len(b.Entries) == 0 {
					continue
				}
				r, err := m.Forward(b)
				is.NoErr(err)
				for e, i := range who {
					row := r.Row(e, 0)
					want := alone[i][done[i]]
					for v := range row {
						if row[v] != want[v] {
							t.Fatalf("sequence %d step %d: batched logits differ from alone (%g vs %g)", i, done[i], row[v], want[v])
						}
					}
					next[i] = argmax(row)
					done[i]++
				}
			}
		})
	}
}

// A model whose q|k|v and gate|up are copied into one matrix each (DFLASH_CPU_FUSE=1, as the GPU lays them out) gives
// exactly the logits of the parts multiplied apart, for both layer kinds.
func TestFusedProductsEqualPartsApart(t *testing.T) {
	lib := openCPU(t)
	for _, c := range []config{tinyQwen3(), tinyQwen35()} {
		t.Run(c.arch, func(t *testing.T) {
			is := is.New(t)
			opts := Options{KVPoolTokens: 512, MaxSeqs: 2, CacheK: CacheF16, CacheV: CacheF16, Threads: 2}
			apart := loadRandom(t, lib, c, opts)
			t.Setenv("DFLASH_CPU_FUSE", "1")
			fused := loadRandom(t, lib, c, opts)
			t.Setenv("DFLASH_CPU_FUSE", "0")
			prompt := randomTokens(rand.New(rand.NewPCG(7, 7)), 9, c.vocab)
			run := func(m *Model) [][]float32 {
				s, err := m.NewSeq()
				is.NoErr(err)
				defer func() { is.NoErr(m.FreeSeq(s)) }()
				// the prompt in chunks of 5, 2 and 2 tokens: a chunk shorter than the conv window moves the state
				var rows [][]float32
				for _, c := range [][2]int{{0, 5}, {5, 7}, {7, 9}} {
					r, err := m.Forward(one(s, prompt[c[0]:c[1]], LogitsLast))
					is.NoErr(err)
					rows = append(rows, r.Row(0, 0))
				}
				for k := 0; k < 6; k++ {
					r, err := m.Forward(one(s, []int32{argmax(rows[len(rows)-1])}, LogitsLast))
					is.NoErr(err)
					rows = append(rows, r.Row(0, 0))
				}
				return rows
			}
			want, got := run(apart), run(fused)
			for k := range want {
				for i := range want[k] {
					if want[k][i] != got[k][i] {
						t.Fatalf("step %d: logits differ (%g fused vs %g apart at %d)", k, got[k][i], want[k][i], i)
					}
				}
			}
		})
	}
}

func TestKVAccountingAndSlots(t *testing.T) {
	is := is.New(t)
	lib := openCPU(t)
	m := loadRandom(t, lib, tinyQwen3(), Options{KVPoolTokens: 64, BlockSize: 16, MaxSeqs: 2, Threads: 1})
	st, err := m.KVStats()
	is.NoErr(err)
	is.Equal(st, KVStats{BlockSize: 16, BlocksTotal: 4, BlocksFree: 4, SeqsTotal: 2, SeqsFree: 2})
	is.Equal(m.Info().KVBytesPerToken, uint64(3*2*2*16*2)) // layers * (K+V) * kv heads * head_dim * f16

	a, err := m.NewSeq()
	is.NoErr(err)
	b, err := m.NewSeq()
	is.NoErr(err)
	_, err = m.NewSeq()
	is.True(errors.Is(err, ErrNoSeq))

	toks := randomTokens(rand.New(rand.NewPCG(5, 5)), 40, 256)
	_, err = m.Forward(one(a, toks[:17], LogitsNone)) // 2 blocks
	is.NoErr(err)
	st, _ = m.KVStats()
	is.Equal(st.BlocksFree, 2)
	is.Equal(st.TokensFree(), 32)

	is.NoErr(m.Reserve(b, 20)) // 2 blocks held ahead
	st, _ = m.KVStats()
	is.Equal(st.BlocksFree, 0)
	_, err = m.Forward(one(a, toks[17:33], LogitsNone)) // a needs a third block
	is.True(errors.Is(err, ErrNoKV))
	n, _ := m.SeqLen(a)
	is.Equal(n, 17)                                   // failed forward changed nothing
	_, err = m.Forward(one(b, toks[:20], LogitsLast)) // within the reservation
	is.NoErr(err)
	is.True(errors.Is(m.Reserve(b, 40), ErrNoKV))

	is.NoErr(m.FreeSeq(b))
	st, _ = m.KVStats()
	is.Equal(st.BlocksFree, 2)
	is.Equal(st.SeqsFree, 1)
	_, err = m.Forward(one(a, toks[17:33], LogitsNone))
	is.NoErr(err)

	// truncation of an attention-only model frees whole blocks
	is.NoErr(m.Truncate(a, 5))
	st, _ = m.KVStats()
	is.Equal(st.BlocksFree, 3)
	_, err = m.Forward(Batch{Entries: []Entry{{Seq: a, Tokens: toks[:1]}, {Seq: a, Tokens: toks[:1]}}})
	is.True(errors.Is(err, ErrInvalid)) // a sequence twice in one batch
	_, err = m.Forward(one(Seq(7), toks[:1], LogitsLast))
	is.True(errors.Is(err, ErrInvalid))
	_, err = m.Forward(one(a, []int32{256}, LogitsLast))
	is.True(err != nil && strings.Contains(err.Error(), "token 256 is outside the vocabulary"))
}

// Snapshot/rollback and recorded truncation restore exactly the state of a sequence that never saw the rejected
// tokens.
func TestSnapshotRollbackAndRecordedTruncate(t *testing.T) {
	lib := openCPU(t)
	for _, c := range []config{tinyQwen3(), tinyQwen35()} {
		t.Run(c.arch, func(t *testing.T) {
			is := is.New(t)
			m := loadRandom(t, lib, c, Options{KVPoolTokens: 512, MaxSeqs: 2, CacheK: CacheF32, CacheV: CacheF32, Threads: 2})
			rng := rand.New(rand.NewPCG(6, 6))
			prompt, draft, other := randomTokens(rng, 20, c.vocab), randomTokens(rng, 6, c.vocab), randomTokens(rng, 3, c.vocab)

			ref, _ := m.NewSeq()
			_, err := m.Forward(one(ref, prompt, LogitsNone))
			is.NoErr(err)
			want, err := m.Forward(one(ref, append(append([]int32{}, draft[:2]...), other...), LogitsAll))
			is.NoErr(err)
			is.NoErr(m.FreeSeq(ref))

			s, _ := m.NewSeq()
			_, err = m.Forward(one(s, prompt, LogitsNone))
			is.NoErr(err)
			is.True(errors.Is(m.Rollback(s), ErrState)) // no snapshot yet

			// snapshot, verify 6 draft tokens, roll back, replay 2 accepted + 3 others
			is.NoErr(m.Snapshot(s))
			_, err = m.Forward(one(s, draft, LogitsAll))
			is.NoErr(err)
			is.NoErr(m.Rollback(s))
			got, err := m.Forward(one(s, append(append([]int32{}, draft[:2]...), other...), LogitsAll))
			is.NoErr(err)
			for i := 0; i < 5; i++ {
				is.True(relErr(got.Row(0, i), want.Row(0, i)) < 1e-6)
			}

			// recorded verify, keep 2 of 6 by truncation, continue with the others
			s2, _ := m.NewSeq()
			_, err = m.Forward(one(s2, prompt, LogitsNone))
			is.NoErr(err)
			if c.arch == "qwen35" {
				_, err = m.Forward(one(s2, draft, LogitsNone))
				is.NoErr(err)
				is.True(errors.Is(m.Truncate(s2, 22), ErrState)) // not recorded
				is.NoErr(m.FreeSeq(s2))
				s2, _ = m.NewSeq()
				_, err = m.Forward(one(s2, prompt, LogitsNone))
				is.NoErr(err)
			}
			_, err = m.Forward(Batch{Entries: []Entry{{Seq: s2, Tokens: draft, Logits: LogitsAll, Record: true}}})
			is.NoErr(err)
			is.NoErr(m.Truncate(s2, 22))
			got, err = m.Forward(one(s2, other, LogitsAll))
			is.NoErr(err)
			for i := 0; i < 3; i++ {
				is.True(relErr(got.Row(0, i), want.Row(0, 2+i)) < 1e-4)
			}
		})
	}
}

// After a recorded verify of 6 tokens, truncating to any number of them (0..6) leaves the sequence where decoding the
// kept tokens one at a time would have: the next token's logits are the same bits (the CPU's products do not depend
// on the batch, and the recurrent state of the kept tokens is the one-at-a-time arithmetic, replayed from light
// records or copied from recorded states).
func TestRecordedTruncateEveryLength(t *testing.T) {
	lib := openCPU(t)
	for _, c := range []config{tinyQwen3(), tinyQwen35()} {
		for keep := 0; keep <= 6; keep++ {
			t.Run(fmt.Sprintf("%s/keep%d", c.arch, keep), func(t *testing.T) {
				is := is.New(t)
				m := loadRandom(t, lib, c, Options{KVPoolTokens: 256, MaxSeqs: 2, CacheK: CacheF32, CacheV: CacheF32, Threads: 2})
				rng := rand.New(rand.NewPCG(9, uint64(keep)))
				prompt, draft, next := randomTokens(rng, 12, c.vocab), randomTokens(rng, 6, c.vocab), randomTokens(rng, 1, c.vocab)

				want := oneAtATime(t, m, prompt, draft[:keep], next)
				s := recordedVerify(t, m, prompt, draft)
				is.NoErr(m.Truncate(s, len(prompt)+keep))
				got, err := m.Forward(one(s, next, LogitsAll))
				is.NoErr(err)
				is.Equal(relErr(got.Row(0, 0), want.Row(0, 0)), 0.0) // bit for bit
			})
		}
	}
}

// oneAtATime decodes prompt, then toks one at a time, then next in a new sequence: the logits of next.
func oneAtATime(t *testing.T, m *Model, prompt, toks, next []int32) *Result {
	t.Helper()
	is := is.New(t)
	ref, _ := m.NewSeq()
	_, err := m.Forward(one(ref, prompt, LogitsNone))
	is.NoErr(err)
	for _, tok := range toks {
		_, err = m.Forward(one(ref, []int32{tok}, LogitsNone))
		is.NoErr(err)
	}
	want, err := m.Forward(one(ref, next, LogitsAll))
	is.NoErr(err)
	return want
}

// recordedVerify is a new sequence after prompt and then draft in one recorded forward, as a verify leaves it.
func recordedVerify(t *testing.T, m *Model, prompt, draft []int32) Seq {
	t.Helper()
	is := is.New(t)
	s, _ := m.NewSeq()
	_, err := m.Forward(one(s, prompt, LogitsNone))
	is.NoErr(err)
	_, err = m.Forward(Batch{Entries: []Entry{{Seq: s, Tokens: draft, Logits: LogitsAll, Record: true}}})
	is.NoErr(err)
	return s
}

// A recorded verify leaves the recurrent state where it was until a truncation says what stays: whatever uses the
// sequence without truncating first (a forward, a truncation that keeps every token, a snapshot, an export) must see
// the state after all of its tokens, bit for bit as decoding them one at a time; and once the records were replayed,
// a second truncation into them is refused.
func TestRecordedForwardSettles(t *testing.T) {
	lib := openCPU(t)
	c := tinyQwen35()
	for _, then := range []string{"forward", "truncate to its length", "snapshot", "export"} {
		t.Run(then, func(t *testing.T) {
			is := is.New(t)
			m := loadRandom(t, lib, c, Options{KVPoolTokens: 256, MaxSeqs: 3, CacheK: CacheF32, CacheV: CacheF32, Threads: 2})
			rng := rand.New(rand.NewPCG(11, 3))
			prompt, draft, next := randomTokens(rng, 12, c.vocab), randomTokens(rng, 6, c.vocab), randomTokens(rng, 1, c.vocab)

			want := oneAtATime(t, m, prompt, draft, next)
			s := recordedVerify(t, m, prompt, draft)
			switch then {
			case "truncate to its length":
				is.NoErr(m.Truncate(s, len(prompt)+len(draft)))
				is.True(errors.Is(m.Truncate(s, len(prompt)+2), ErrState)) // the records are spent
			case "snapshot":
				is.NoErr(m.Snapshot(s))
			case "export":
				blob, err := m.Export(s)
				is.NoErr(err)
				is.NoErr(m.FreeSeq(s))
				s, _ = m.NewSeq()
				is.NoErr(m.Import(s, blob))
			}
			got, err := m.Forward(one(s, next, LogitsAll))
			is.NoErr(err)
			is.Equal(relErr(got.Row(0, 0), want.Row(0, 0)), 0.0) // bit for bit
		})
	}
}

// The captured output of the last layer, put through the final norm and the LM head here, gives the engine's logits.
func TestCaptureIsLayerOutput(t *testing.T) {
	is := is.New(t)
	lib := openCPU(t)
	c := tinyQwen3()
	spec := randomSpec(t, c)
	spec.Options = Options{KVPoolTokens: 64, Threads: 2}
	m, err := lib.LoadModel(spec)
	is.NoErr(err)
	defer m.Close()
	tensor := func(name string) []float32 {
		for _, tt := range spec.Tensors {
			if tt.Name == name {
				v, err := quant.ToFloat32(tt.Type, tt.Data)
				is.NoErr(err)
				return v
			}
		}
		t.Fatalf("no tensor %s", name)
		return nil
	}
	s, _ := m.NewSeq()
	toks := randomTokens(rand.New(rand.NewPCG(8, 8)), 9, c.vocab)
	r, err := m.Forward(Batch{Entries: []Entry{{Seq: s, Tokens: toks, Logits: LogitsAll}}, Capture: []int{0, c.layers - 1}})
	is.NoErr(err)
	normW, out := tensor("output_norm.weight"), tensor("output.weight")
	for i := range toks {
		h := r.Hidden(0, i, 1)
		is.Equal(len(h), c.embd)
		var ss float64
		for _, x := range h {
			ss += float64(x) * float64(x)
		}
		inv := 1 / math.Sqrt(ss/float64(c.embd)+1e-6)
		want := make([]float32, c.vocab)
		for v := 0; v < c.vocab; v++ {
			var d float64
			for k, x := range h {
				d += float64(x) * inv * float64(normW[k]) * float64(out[v*c.embd+k])
			}
			want[v] = float32(d)
		}
		is.True(relErr(r.Row(0, i), want) < 1e-5)
		is.True(r.Hidden(0, i, 0) != nil)
	}
	is.True(r.Hidden(0, len(toks), 0) == nil) // out of range

	// the same tokens in a second sequence, read in place: the same captures
	is.NoErr(m.FreeSeq(s))
	s2, err := m.NewSeq()
	is.NoErr(err)
	in, err := m.Forward(Batch{Entries: []Entry{{Seq: s2, Tokens: toks, Logits: LogitsNone}}, Capture: []int{0, c.layers - 1},
		CaptureInPlace: true})
	is.NoErr(err)
	is.Equal(in.Capture, r.Capture)
}

// Quantized weights and KV caches stay close to the f32 model built from the same (dequantized) values.
func TestQuantizedWeightsAndCaches(t *testing.T) {
	lib := openCPU(t)
	base := tinyQwen3()
	base.embd, base.ff, base.headDim = 256, 512, 64
	rng := rand.New(rand.NewPCG(9, 9))
	toks := randomTokens(rng, 40, base.vocab)
	run := func(t *testing.T, spec ModelSpec, opt Options) []float32 {
		spec.Options = opt
		m, err := lib.LoadModel(spec)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		s, _ := m.NewSeq()
		r, err := m.Forward(one(s, toks, LogitsLast))
		if err != nil {
			t.Fatal(err)
		}
		return r.Row(0, 0)
	}
	f32opt := Options{KVPoolTokens: 64, CacheK: CacheF32, CacheV: CacheF32, Threads: 2}
	for _, wt := range []gguf.Type{gguf.F16, gguf.BF16, gguf.Q4_0, gguf.Q8_0, gguf.Q4_K, gguf.Q6_K} {
		t.Run(wt.String(), func(t *testing.T) {
			is := is.New(t)
			c := base
			c.weight = wt
			q := randomSpec(t, c)
			// the same model with every tensor dequantized to f32
			f := q
			f.Tensors = nil
			for _, tt := range q.Tensors {
				v, err := quant.ToFloat32(tt.Type, tt.Data)
				is.NoErr(err)
				b, err := quant.FromFloat32(gguf.F32, v)
				is.NoErr(err)
				f.Tensors = append(f.Tensors, Tensor{Name: tt.Name, Type: gguf.F32, Dims: tt.Dims, Data: b})
			}
			got, want := run(t, q, f32opt), run(t, f, f32opt)
			switch wt {
			case gguf.Q4_0, gguf.Q8_0, gguf.Q4_K, gguf.Q6_K:
				// On the CPU these multiply int8-quantized activations (blocks of 32, error <= 1/254 of each
				// block's largest value; see native/tests/test_matmul.cpp), so through the layers of this random
				// model the logits differ by a few percent of their range, like those of the q8_0 KV cache below.
				e := relErr(got, want)
				t.Logf("relErr %.2g", e)
				is.True(e < 0.05) // the bound the q8_0 KV cache test below uses
				is.Equal(argmax(got), argmax(want))
			default:
				is.True(relErr(got, want) < 1e-5)
			}
		})
	}
	for _, ct := range []CacheType{CacheF16, CacheBF16, CacheQ8_0} {
		t.Run("cache_"+string(ct), func(t *testing.T) {
			is := is.New(t)
			spec := randomSpec(t, base)
			want := run(t, spec, f32opt)
			got := run(t, spec, Options{KVPoolTokens: 64, CacheK: ct, CacheV: ct, Threads: 2})
			is.True(relErr(got, want) < 0.05)
			is.Equal(argmax(got), argmax(want))
		})
	}
}

// writeSpecGGUF writes spec as a GGUF file: the architecture, extra keys, the spec's metadata, then its tensors.
func writeSpecGGUF(t *testing.T, path, arch string, spec ModelSpec, extra map[string]any) {
	t.Helper()
	is := is.New(t)
	w, err := gguf.Create(path)
	is.NoErr(err)
	is.NoErr(w.AddKV(gguf.KeyArchitecture, arch))
	for k, v := range extra {
		is.NoErr(w.AddKV(k, v))
	}
	for k, v := range spec.Meta {
		is.NoErr(w.AddKV(k, v))
	}
	for _, tt := range spec.Tensors {
		is.NoErr(w.AddTensor(tt.Name, tt.Type, tt.Dims))
	}
	for _, tt := range spec.Tensors {
		is.NoErr(w.WriteTensorData(tt.Name, tt.Data))
	}
	is.NoErr(w.Close())
}

// SpecFromGGUF + LoadGGUF: a model written to a GGUF file runs like the in-memory spec.
func TestLoadGGUF(t *testing.T) {
	is := is.New(t)
	lib := openCPU(t)
	c := tinyQwen35()
	spec := randomSpec(t, c)
	path := filepath.Join(t.TempDir(), "m.gguf")
	writeSpecGGUF(t, path, c.arch, spec, map[string]any{"tokenizer.ggml.tokens": []string{"a", "b"}}) // ignored

	opt := Options{KVPoolTokens: 128, CacheK: CacheF32, CacheV: CacheF32, Threads: 2}
	fm, err := lib.LoadGGUF(path, opt)
	is.NoErr(err)
	defer fm.Close()
	is.Equal(fm.Info().Arch, "qwen35")
	is.Equal(fm.Info().RecurrentLayers, 3)
	is.Equal(fm.Info().AttnLayers, 1)
	spec.Options = opt
	mm, err := lib.LoadModel(spec)
	is.NoErr(err)
	defer mm.Close()
	toks := randomTokens(rand.New(rand.NewPCG(10, 10)), 12, c.vocab)
	s1, _ := fm.NewSeq()
	s2, _ := mm.NewSeq()
	r1, err := fm.Forward(one(s1, toks, LogitsLast))
	is.NoErr(err)
	r2, err := mm.Forward(one(s2, toks, LogitsLast))
	is.NoErr(err)
	is.Equal(r1.Row(0, 0), r2.Row(0, 0))
	is.NoErr(fm.Close())
	_, err = fm.NewSeq()
	is.True(err != nil) // closed
}

// A q4_0 model written to a GGUF file loads and generates: greedy decoding one token a step gives the tokens and
// logits that the same steps give when the model comes from the in-memory spec, and each step's logits are finite.
func TestGGUFQ4_0Generates(t *testing.T) {
	is := is.New(t)
	lib := openCPU(t)
	c := tinyQwen3()
	c.weight = gguf.Q4_0
	spec := randomSpec(t, c)
	for _, tt := range spec.Tensors {
		if len(tt.Dims) == 2 {
			is.Equal(tt.Type, gguf.Q4_0) // every matrix, the embedding included
		}
	}
	path := filepath.Join(t.TempDir(), "q4_0.gguf")
	writeSpecGGUF(t, path, c.arch, spec, nil)

	opt := Options{KVPoolTokens: 128, CacheK: CacheF16, CacheV: CacheF16, Threads: 2}
	generate := func(m *Model) ([]int32, [][]float32) {
		s, err := m.NewSeq()
		is.NoErr(err)
		toks := randomTokens(rand.New(rand.NewPCG(14, 14)), 8, c.vocab)
		var out []int32
		var logits [][]float32
		for step := 0; step < 16; step++ {
			r, err := m.Forward(one(s, toks, LogitsLast))
			is.NoErr(err)
			row := append([]float32(nil), r.Row(0, 0)...)
			for _, v := range row {
				is.True(!math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0))
			}
			logits = append(logits, row)
			toks = []int32{argmax(row)}
			out = append(out, toks[0])
		}
		return out, logits
	}
	fm, err := lib.LoadGGUF(path, opt)
	is.NoErr(err)
	defer fm.Close()
	spec.Options = opt
	mm, err := lib.LoadModel(spec)
	is.NoErr(err)
	defer mm.Close()
	gotToks, gotLogits := generate(fm)
	wantToks, wantLogits := generate(mm)
	is.Equal(gotToks, wantToks)
	is.Equal(gotLogits, wantLogits)
	t.Logf("tokens %v", gotToks)
}

// Explicit RoPE positions equal to the cache positions change nothing; a shifted start changes the logits only by
// rounding for a pure-RoPE model (attention depends on position differences).
func TestExplicitPositions(t *testing.T) {
	is := is.New(t)
	lib := openCPU(t)
	c := tinyQwen3()
	m := loadRandom(t, lib, c, Options{KVPoolTokens: 256, MaxSeqs: 3, CacheK: CacheF32, CacheV: CacheF32, Threads: 2})
	toks := randomTokens(rand.New(rand.NewPCG(12, 12)), 20, c.vocab)
	pos := make([]int32, len(toks))
	shifted := make([]int32, len(toks))
	for i := range pos {
		pos[i] = int32(i)
		shifted[i] = int32(1000 + i)
	}
	run := func(p []int32) []float32 {
		s, err := m.NewSeq()
		is.NoErr(err)
		defer m.FreeSeq(s)
		r, err := m.Forward(Batch{Entries: []Entry{{Seq: s, Tokens: toks, Positions: p, Logits: LogitsLast}}})
		is.NoErr(err)
		return r.Row(0, 0)
	}
	base := run(nil)
	is.Equal(run(pos), base)
	is.True(relErr(run(shifted), base) < 1e-4)
	s, _ := m.NewSeq()
	_, err := m.Forward(Batch{Entries: []Entry{{Seq: s, Tokens: toks, Positions: pos[:3]}}})
	is.True(err != nil && strings.Contains(err.Error(), "3 positions for 20 tokens"))
}

// The estimate is what a backend sizes the KV pool from: it must agree with what the loaded model reports.
func TestEstimateAgreesWithLoadedModel(t *testing.T) {
	lib := openCPU(t)
	free, total, err := lib.Memory()
	if err != nil {
		t.Fatal(err)
	}
	if total == 0 || free > total {
		t.Fatalf("memory: free %d, total %d", free, total)
	}
	for _, tc := range []struct {
		name string
		spec func() ModelSpec
	}{
		{"qwen3", func() ModelSpec { return randomSpec(t, tinyQwen3()) }},
		{"qwen35", func() ModelSpec { return randomSpec(t, tinyQwen35()) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			spec := tc.spec()
			spec.Options = Options{KVPoolTokens: 64, MaxSeqs: 2, Threads: 1, CacheK: "bf16", CacheV: "f32"}
			e, err := lib.Estimate(spec)
			is.NoErr(err)
			m, err := lib.LoadModel(spec)
			is.NoErr(err)
			defer m.Close()
			info := m.Info()
			is.Equal(e.KVBytesPerToken, info.KVBytesPerToken)
			is.Equal(e.StateBytesPerSeq, info.StateBytesPerSeq)
			is.True(e.WeightBytes >= info.WeightBytes) // every tensor of the trunk, as stored
			is.True(e.ScratchBytes > 0)
			if info.RecurrentLayers == 0 { // nothing to record
				is.Equal(e.RecordBytesFixed+e.RecordBytesPerRow+e.TreeRecordBytesPerRow+e.TreeRecordBytesFixed, uint64(0))
			} else { // a row keeps its inputs (light records); a tree a few whole states, whatever its size
				is.True(e.RecordBytesFixed > 0)
				is.True(e.RecordBytesPerRow > 0 && e.RecordBytesPerRow < info.StateBytesPerSeq)
				is.Equal(e.TreeRecordBytesPerRow, e.RecordBytesPerRow)
				is.True(e.TreeRecordBytesFixed > e.RecordBytesFixed) // (kTreeSlots states against the working copy)
			}
		})
	}
	_, err = lib.Estimate(ModelSpec{Arch: "llama"})
	if err == nil || !strings.Contains(err.Error(), `"llama" is not supported`) {
		t.Fatalf("estimate of an unknown architecture: %v", err)
	}
}

// checkTopK runs one batch with full logits and again (on fresh sequences) with Batch.TopK, and checks that the
// candidates are the row's best logits in order and lse its log-sum-exp, within bound relative to the row's largest
// logit (the two forwards may differ by the device's rounding).
func checkTopK(t *testing.T, m *Model, vocab int, bound float64) {
	t.Helper()
	run := func(k int) *Result {
		t.Helper()
		var b Batch
		for i := 0; i < 3; i++ {
			s, err := m.NewSeq()
			if err != nil {
				t.Fatal(err)
			}
			defer m.FreeSeq(s)
			b.Entries = append(b.Entries, Entry{Seq: s, Tokens: randomTokens(rand.New(rand.NewPCG(uint64(i), 3)), 5+i, vocab), Logits: LogitsAll})
		}
		b.TopK = k
		r, err := m.Forward(b)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	full := run(0)
	for _, k := range []int{1, 7, MaxTopK} {
		top := run(k)
		for e := 0; e < 3; e++ {
			for i := 0; i < 5+e; i++ {
				row := full.Row(e, i)
				ids, vals, lse, ok := top.Candidates(e, i)
				if !ok || len(ids) != k {
					t.Fatalf("k=%d entry %d row %d: no candidates", k, e, i)
				}
				order := make([]int, len(row))
				for j := range order {
					order[j] = j
				}
				sort.SliceStable(order, func(a, b int) bool { return row[order[a]] > row[order[b]] })
				mx := float64(row[order[0]])
				var sum float64
				for _, v := range row {
					sum += math.Exp(float64(v) - mx)
				}
				tol := bound * math.Max(1, math.Abs(mx))
				if d := math.Abs(float64(lse) - (mx + math.Log(sum))); d > tol {
					t.Fatalf("k=%d entry %d row %d: lse %g, want %g", k, e, i, lse, mx+math.Log(sum))
				}
				for j := 0; j < k; j++ {
					if ids[j] < 0 || int(ids[j]) >= vocab || math.Abs(float64(vals[j]-row[ids[j]])) > tol {
						t.Fatalf("k=%d entry %d row %d candidate %d: id %d logit %g", k, e, i, j, ids[j], vals[j])
					}
					// the j-th candidate has the j-th best value (near-equal logits may swap between the forwards)
					if math.Abs(float64(vals[j]-row[order[j]])) > tol {
						t.Fatalf("k=%d entry %d row %d: candidate %d is %d (%g), want %d (%g)", k, e, i, j, ids[j], vals[j], order[j], row[order[j]])
					}
				}
			}
		}
		// the whole rows stay with the model until the next forward (LogitsRow), in the rows' flat order
		got := make([]float32, vocab)
		flat := 0
		for e := 0; e < 3; e++ {
			for i := 0; i < 5+e; i++ {
				if err := m.LogitsRow(flat, got); err != nil {
					t.Fatalf("k=%d: logits row %d: %v", k, flat, err)
				}
				for j, v := range full.Row(e, i) {
					if math.Abs(float64(got[j]-v)) > bound*math.Max(1, math.Abs(float64(v))) {
						t.Fatalf("k=%d: logits row %d (entry %d row %d) token %d: %g, want %g", k, flat, e, i, j, got[j], v)
					}
				}
				flat++
			}
		}
		if err := m.LogitsRow(flat, got); !errors.Is(err, ErrState) {
			t.Fatalf("k=%d: logits row %d past the forward's %d: %v, want ErrState", k, flat, flat, err)
		}
	}
}

func TestTopKCandidates(t *testing.T) {
	lib := openCPU(t)
	for _, c := range []config{tinyQwen3(), tinyQwen35()} {
		t.Run(c.arch, func(t *testing.T) {
			m := loadRandom(t, lib, c, Options{KVPoolTokens: 512, MaxSeqs: 4, Threads: 2})
			checkTopK(t, m, c.vocab, 1e-6)
		})
	}
}
