package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/dflash/dflash_server/sdk/gguf"
)

// benchConfig is a small Qwen3 geometry (0.6B-style layers, 4 of them, 32k vocabulary): about 130M weights.
func benchConfig(wt gguf.Type) config {
	return config{arch: "qwen3", vocab: 32768, embd: 1024, ff: 3072, layers: 4, heads: 16, headsKV: 8, headDim: 128,
		theta: 1e6, weight: wt, seed: 11}
}

func benchQwen35Config(wt gguf.Type) config {
	return config{arch: "qwen35", vocab: 32768, embd: 1024, ff: 3072, layers: 4, heads: 8, headsKV: 2, headDim: 256,
		theta: 1e7, ropeDim: 64, nk: 8, nv: 16, dk: 128, dv: 128, convK: 4, weight: wt, seed: 12}
}

// benchThreads lists the thread counts to measure: $DFLASH_BENCH_THREADS ("1,8,16"), else every core.
func benchThreads() []int {
	var out []int
	for _, f := range strings.Split(os.Getenv("DFLASH_BENCH_THREADS"), ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		out = []int{runtime.NumCPU()}
	}
	return out
}

var (
	benchSpecs  = map[string]ModelSpec{}
	benchModels = map[string]*Model{}
)

// benchModel loads c with the given thread count; the random weights are made once per process.
func benchModel(b *testing.B, c config, threads int) *Model {
	key := fmt.Sprintf("%s/%v", c.arch, c.weight)
	mkey := fmt.Sprintf("%s/t%d", key, threads)
	if m := benchModels[mkey]; m != nil {
		return m
	}
	spec, ok := benchSpecs[key]
	if !ok {
		spec = randomSpec(b, c)
		benchSpecs[key] = spec
	}
	spec.Options = Options{KVPoolTokens: 4096, MaxSeqs: 8, CacheK: CacheF16, CacheV: CacheF16, Threads: threads}
	m, err := openCPU(b).LoadModel(spec)
	if err != nil {
		b.Fatal(err)
	}
	benchModels[mkey] = m // kept for the process
	return m
}

// forEach runs fn as a sub-benchmark per architecture, weight type and thread count.
func forEach(b *testing.B, archs []func(gguf.Type) config, fn func(b *testing.B, c config, m *Model)) {
	for _, mk := range archs {
		for _, wt := range benchTypes() {
			c := mk(wt)
			for _, th := range benchThreads() {
				b.Run(fmt.Sprintf("%s/%v/t%d", c.arch, wt, th), func(b *testing.B) { fn(b, c, benchModel(b, c, th)) })
			}
		}
	}
}

func benchTypes() []gguf.Type { return []gguf.Type{gguf.F16, gguf.Q8_0, gguf.Q4_K} }

// BenchmarkDecode: one sequence, one token per forward (after a 64-token prompt); reports tokens/s and the weight
// bytes streamed per second.
func BenchmarkDecode(b *testing.B) {
	forEach(b, []func(gguf.Type) config{benchConfig, benchQwen35Config}, func(b *testing.B, c config, m *Model) {
		s, err := m.NewSeq()
		if err != nil {
			b.Fatal(err)
		}
		defer m.FreeSeq(s)
		rng := rand.New(rand.NewPCG(1, 1))
		if _, err := m.Forward(one(s, randomTokens(rng, 64, c.vocab), LogitsLast)); err != nil {
			b.Fatal(err)
		}
		tok := []int32{1}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			r, err := m.Forward(one(s, tok, LogitsLast))
			if err != nil {
				b.Fatal(err)
			}
			tok[0] = argmax(r.Row(0, 0))
		}
		sec := b.Elapsed().Seconds()
		b.ReportMetric(float64(b.N)/sec, "tok/s")
		b.ReportMetric(float64(m.Info().WeightBytes)*float64(b.N)/sec/1e9, "weightGB/s")
	})
}

// BenchmarkDecodeBatch8: eight sequences decode together, one token each per forward.
func BenchmarkDecodeBatch8(b *testing.B) {
	forEach(b, []func(gguf.Type) config{benchConfig}, func(b *testing.B, c config, m *Model) {
		rng := rand.New(rand.NewPCG(2, 2))
		var batch Batch
		for i := 0; i < 8; i++ {
			s, err := m.NewSeq()
			if err != nil {
				b.Fatal(err)
			}
			defer m.FreeSeq(s)
			if _, err := m.Forward(one(s, randomTokens(rng, 32, c.vocab), LogitsNone)); err != nil {
				b.Fatal(err)
			}
			batch.Entries = append(batch.Entries, Entry{Seq: s, Tokens: []int32{1}, Logits: LogitsLast})
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if n, _ := m.SeqLen(batch.Entries[0].Seq); n >= 480 {
				for _, e := range batch.Entries {
					_ = m.Truncate(e.Seq, 32)
				}
			}
			r, err := m.Forward(batch)
			if err != nil {
				b.Fatal(err)
			}
			for e := range batch.Entries {
				batch.Entries[e].Tokens[0] = argmax(r.Row(e, 0))
			}
		}
		b.ReportMetric(float64(8*b.N)/b.Elapsed().Seconds(), "tok/s")
	})
}

// BenchmarkPrefill: a 256-token prompt in one forward.
func BenchmarkPrefill(b *testing.B) {
	forEach(b, []func(gguf.Type) config{benchConfig, benchQwen35Config}, func(b *testing.B, c config, m *Model) {
		toks := randomTokens(rand.New(rand.NewPCG(3, 3)), 256, c.vocab)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			s, err := m.NewSeq()
			if err != nil {
				b.Fatal(err)
			}
			if _, err := m.Forward(one(s, toks, LogitsLast)); err != nil {
				b.Fatal(err)
			}
			_ = m.FreeSeq(s)
		}
		b.ReportMetric(float64(len(toks)*b.N)/b.Elapsed().Seconds(), "tok/s")
	})
}

// BenchmarkMemoryBandwidth copies a 256 MiB buffer: the bytes moved per second bound how fast weights can stream.
func BenchmarkMemoryBandwidth(b *testing.B) {
	src := make([]byte, 256<<20)
	dst := make([]byte, len(src))
	for i := range src {
		src[i] = byte(i)
	}
	b.SetBytes(int64(2 * len(src))) // read + write
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		copy(dst, src)
	}
}

// BenchmarkSample times Sample on a 151,936-logit row (Qwen's vocabulary) for each processor: greedy, a plain
// temperature (the whole vocabulary is a candidate), top-p, top-k. Rows: "flat" (logits N(0, 3²): the draw lands deep
// in the ranking, near the worst case) and "zipf" (a few tokens take most of the mass, as a trained model's do).
func BenchmarkSample(b *testing.B) {
	lib := openCPU(b)
	m := loadRandom(b, lib, tinyQwen3(), Options{KVPoolTokens: 16, Threads: 1})
	r := rand.New(rand.NewPCG(1, 2))
	const vocab = 151936
	rows := map[string][]float32{"flat": make([]float32, vocab), "zipf": make([]float32, vocab)}
	for i, rank := range r.Perm(vocab) {
		rows["flat"][i] = float32(r.NormFloat64() * 3)
		rows["zipf"][i] = float32(12 - 2.5*math.Log1p(float64(rank)))
	}
	for _, row := range []string{"flat", "zipf"} {
		for _, tc := range []struct {
			name string
			p    SamplingParams
		}{
			{"greedy", SamplingParams{}},
			{"temp1", SamplingParams{Temperature: 1}},
			{"temp0.7-topp0.9", SamplingParams{Temperature: 0.7, TopP: 0.9}},
			{"temp0.7-topk40", SamplingParams{Temperature: 0.7, TopK: 40}},
		} {
			b.Run(row+"/"+tc.name, func(b *testing.B) {
				var rng uint64 = 1
				for range b.N {
					if _, err := m.Sample(rows[row], tc.p, nil, &rng); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkSampleCandidates: a draw without top-k from a 151,936-token row's 64 best candidates and log-sum-exp
// (what a step moves per sequence with them), against BenchmarkSample's whole-row draw of the same row; "decided" is
// the fraction of draws the candidates decide (the rest sample the whole row too).
func BenchmarkSampleCandidates(b *testing.B) {
	lib := openCPU(b)
	m := loadRandom(b, lib, tinyQwen3(), Options{KVPoolTokens: 16, Threads: 1})
	r := rand.New(rand.NewPCG(1, 2))
	const vocab, k = 151936, 64
	row := make([]float32, vocab)
	for i, rank := range r.Perm(vocab) {
		row[i] = float32(12 - 2.5*math.Log1p(float64(rank))) // zipf, as BenchmarkSample's
	}
	rank := make([]int32, vocab)
	for i := range rank {
		rank[i] = int32(i)
	}
	sort.Slice(rank, func(a, c int) bool { return row[rank[a]] > row[rank[c]] })
	ids, vals := rank[:k], make([]float32, k)
	sum := 0.0
	for i, id := range ids {
		vals[i] = row[id]
	}
	for _, x := range row {
		sum += math.Exp(float64(x - vals[0]))
	}
	lse := float32(float64(vals[0]) + math.Log(sum))
	for _, tc := range []struct {
		name string
		p    SamplingParams
	}{
		{"temp1-topp1", SamplingParams{Temperature: 1, TopP: 1}},
		{"temp0.7-topp0.9", SamplingParams{Temperature: 0.7, TopP: 0.9}},
	} {
		b.Run("zipf/"+tc.name, func(b *testing.B) {
			var rng uint64 = 1
			decided := 0
			for range b.N {
				tok, err := m.SampleCandidates(ids, vals, nil, lse, vocab, tc.p, &rng)
				if err != nil {
					b.Fatal(err)
				}
				if tok >= 0 {
					decided++
				} else {
					rng++ // (a caller would draw from the whole row here)
				}
			}
			b.ReportMetric(float64(decided)/float64(b.N), "decided")
		})
	}
}
