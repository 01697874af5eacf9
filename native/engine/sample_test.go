package engine

import (
	"errors"
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/matryer/is"
)

// The host sampler (sample, sample_dist).

func TestSample(t *testing.T) {
	is := is.New(t)
	lib := openCPU(t)
	m := loadRandom(t, lib, tinyQwen3(), Options{KVPoolTokens: 16, Threads: 1})
	logits := []float32{0.1, 2, -1, 1.9}
	var rng uint64 = 42
	tok, err := m.Sample(logits, SamplingParams{}, nil, &rng)
	is.NoErr(err)
	is.Equal(tok, int32(1))
	tok, err = m.Sample(logits, SamplingParams{RepeatPenalty: 2}, []int32{1}, &rng)
	is.NoErr(err)
	is.Equal(tok, int32(3))
	seen := map[int32]bool{}
	for i := 0; i < 200; i++ {
		tok, err = m.Sample(logits, SamplingParams{Temperature: 1, TopK: 2}, nil, &rng)
		is.NoErr(err)
		seen[tok] = true
	}
	is.Equal(seen, map[int32]bool{1: true, 3: true})
	_, err = m.Sample(logits, SamplingParams{}, nil, nil)
	is.True(err != nil)
	_, err = m.Sample(logits, SamplingParams{RepeatPenalty: 1.1}, []int32{9}, &rng)
	is.True(errors.Is(err, ErrInvalid))
}

// TestSampleDist: SampleDist is what Sample draws from (its tokens in no particular order). Its probabilities are the processed softmax (checked by hand
// for a plain temperature), and over many draws Sample's tokens follow them (chi-square) with each processor on.
func TestSampleDist(t *testing.T) {
	lib := openCPU(t)
	m := loadRandom(t, lib, tinyQwen3(), Options{KVPoolTokens: 16, Threads: 1})
	logits := []float32{0.1, 2, -1, 1.9, 0.7, float32(math.Inf(-1)), 1.2, -0.3}
	ids, probs := make([]int32, len(logits)), make([]float64, len(logits))

	t.Run("temperature alone", func(t *testing.T) {
		is := is.New(t)
		n, err := m.SampleDist(logits, SamplingParams{Temperature: 0.5}, nil, ids, probs)
		is.NoErr(err)
		is.Equal(n, 7) // every finite logit
		sum := 0.0
		for _, l := range logits {
			sum += math.Exp(float64(l) / 0.5)
		}
		for i := range n {
			want := math.Exp(float64(logits[ids[i]])/0.5) / sum
			is.True(math.Abs(probs[i]-want) < 1e-6)
		}
	})
	t.Run("bad arguments", func(t *testing.T) {
		is := is.New(t)
		_, err := m.SampleDist(logits, SamplingParams{Temperature: 1}, nil, ids[:3], probs)
		is.True(err != nil) // room for fewer entries than logits
		_, err = m.SampleDist(nil, SamplingParams{Temperature: 1}, nil, ids, probs)
		is.True(err != nil) // no logits
		_, err = m.SampleDist(logits, SamplingParams{Temperature: 1, RepeatPenalty: 1.1}, []int32{99}, ids, probs)
		is.True(errors.Is(err, ErrInvalid)) // a history token outside the vocabulary, named by the library
	})
	t.Run("greedy is the argmax", func(t *testing.T) {
		is := is.New(t)
		n, err := m.SampleDist(logits, SamplingParams{}, nil, ids, probs)
		is.NoErr(err)
		is.Equal(n, 1)
		is.Equal(ids[0], int32(1))
		is.Equal(probs[0], 1.0)
	})
	for _, tc := range []struct {
		name    string
		p       SamplingParams
		history []int32
	}{
		{"top-k", SamplingParams{Temperature: 1, TopK: 3}, nil},
		{"top-p", SamplingParams{Temperature: 1.3, TopP: 0.8}, nil},
		{"min-p", SamplingParams{Temperature: 0.8, MinP: 0.2}, nil},
		{"penalties", SamplingParams{Temperature: 1, RepeatPenalty: 1.5, PresencePenalty: 0.3, FrequencyPenalty: 0.2}, []int32{1, 1, 3, 6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			n, err := m.SampleDist(logits, tc.p, tc.history, ids, probs)
			is.NoErr(err)
			sum := 0.0
			for i := range n {
				sum += probs[i]
			}
			is.True(math.Abs(sum-1) < 1e-9)
			const draws = 20000
			counts := map[int32]int{}
			rng := uint64(7)
			for range draws {
				tok, err := m.Sample(logits, tc.p, tc.history, &rng)
				is.NoErr(err)
				counts[tok]++
			}
			chi2, seen := 0.0, 0
			for i := range n {
				want := probs[i] * draws
				got := float64(counts[ids[i]])
				chi2 += (got - want) * (got - want) / want
				seen += counts[ids[i]]
			}
			is.Equal(seen, draws) // Sample never returned a token outside the distribution
			// at most 6 degrees of freedom: chi-square's 99.9th percentile is 22.5
			if chi2 > 22.5 {
				t.Fatalf("chi-square %.1f over %d tokens: Sample does not draw from SampleDist", chi2, n)
			}
		})
	}
}

// TestSampleDistWideRows: on a row of thousands of tokens, top-p and min-p keep exactly the tokens the rank order
// gives (the sampler cuts past its ranked head by partitioning, without sorting), with their probabilities.
func TestSampleDistWideRows(t *testing.T) {
	lib := openCPU(t)
	m := loadRandom(t, lib, tinyQwen3(), Options{KVPoolTokens: 16, Threads: 1})
	const n = 20000
	r := rand.New(rand.NewPCG(3, 4))
	logits := make([]float32, n)
	for i := range logits {
		logits[i] = float32(math.Round(r.NormFloat64()*4)) / 4 // ties on purpose: the lower id ranks first
	}
	ids, probs := make([]int32, n), make([]float64, n)
	for _, tc := range []struct {
		name string
		p    SamplingParams
	}{
		{"top-p, a nucleus of thousands", SamplingParams{Temperature: 1.5, TopP: 0.7}},
		{"top-p, a short nucleus", SamplingParams{Temperature: 0.3, TopP: 0.5}},
		{"min-p", SamplingParams{Temperature: 1, MinP: 0.05}},
		{"top-p then min-p", SamplingParams{Temperature: 2, TopP: 0.9, MinP: 0.3}},
		{"top-k then top-p", SamplingParams{Temperature: 1, TopK: 500, TopP: 0.8}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			// the reference: rank every token, keep the top k, the smallest prefix reaching top-p, then min-p
			rank := make([]int32, n)
			for i := range rank {
				rank[i] = int32(i)
			}
			sort.SliceStable(rank, func(a, b int) bool { return logits[rank[a]] > logits[rank[b]] })
			if tc.p.TopK > 0 {
				rank = rank[:tc.p.TopK]
			}
			w := make([]float64, len(rank))
			z := 0.0
			for i, id := range rank {
				w[i] = math.Exp(float64(logits[id]-logits[rank[0]]) / float64(tc.p.Temperature))
				z += w[i]
			}
			keep := len(rank)
			if tc.p.TopP > 0 && tc.p.TopP < 1 {
				cum := 0.0
				for i := range rank {
					cum += w[i] / z
					if cum >= float64(tc.p.TopP) {
						keep = i + 1
						break
					}
				}
			}
			if tc.p.MinP > 0 {
				k := 1
				for k < keep && w[k] >= float64(tc.p.MinP) {
					k++
				}
				keep = k
			}
			mass := 0.0
			want := map[int32]float64{}
			for i := range keep {
				mass += w[i]
			}
			for i := range keep {
				want[rank[i]] = w[i] / mass
			}
			got, err := m.SampleDist(logits, tc.p, nil, ids, probs)
			is.NoErr(err)
			is.Equal(got, len(want))
			for i := range got {
				p, ok := want[ids[i]]
				is.True(ok) // a kept token
				is.True(math.Abs(probs[i]-p) <= 1e-5*p+1e-12)
			}
			t.Logf("%d tokens kept", got)
		})
	}
}

// TestSampleCandidates: where SampleCandidates decides a draw from a row's 64 best candidates and its log-sum-exp, it
// is the token Sample draws from the whole row with the same generator state, which advances the same way; where it
// does not (-1), the state is untouched. On rows whose best tokens hold most of the mass it decides most draws.
func TestSampleCandidates(t *testing.T) {
	lib := openCPU(t)
	m := loadRandom(t, lib, tinyQwen3(), Options{KVPoolTokens: 16, Threads: 1})
	const k = 64
	inf := float32(math.Inf(-1))
	row := func(n int, seed uint64, spikes int, spread float64) []float32 {
		r := rand.New(rand.NewPCG(seed, 7))
		l := make([]float32, n)
		for i := range l {
			l[i] = float32(r.NormFloat64() * spread)
		}
		for range spikes {
			l[r.IntN(n)] += float32(10 + 2*r.NormFloat64())
		}
		return l
	}
	// the candidates as forward_topk gives them: the best k (larger first, lower id on ties) and the log-sum-exp
	candidates := func(l []float32) ([]int32, []float32, float32) {
		rank := make([]int32, len(l))
		for i := range rank {
			rank[i] = int32(i)
		}
		sort.SliceStable(rank, func(a, b int) bool { return l[rank[a]] > l[rank[b]] })
		ids, vals := make([]int32, k), make([]float32, k)
		for i := range k {
			ids[i], vals[i] = -1, float32(math.Inf(-1)) // forward_topk pads a row shorter than k
			if i < len(l) {
				ids[i], vals[i] = rank[i], l[rank[i]]
			}
		}
		mx, sum := float64(vals[0]), 0.0
		for _, x := range l {
			sum += math.Exp(float64(x) - mx)
		}
		return ids, vals, float32(mx + math.Log(sum))
	}
	for _, tc := range []struct {
		name        string
		l           []float32
		p           SamplingParams
		suppress    int     // the best candidate's token -inf in the row (end of generation): 1 flagged, 2 -inf in the candidates too
		minDecided  float64 // fraction of draws decided from the candidates
		draws       int
		wantRefused bool
	}{
		{"peaked, temperature 1", row(20000, 1, 40, 1.5), SamplingParams{Temperature: 1, TopP: 1}, 0, 0.6, 3000, false},
		{"peaked, top-p 0.9", row(20000, 2, 40, 1.5), SamplingParams{Temperature: 1, TopP: 0.9}, 0, 0.6, 3000, false},
		{"peaked, temperature 0.6", row(20000, 3, 40, 1.5), SamplingParams{Temperature: 0.6, TopP: 1}, 0, 0.9, 3000, false},
		{"peaked, temperature 0.7, top-p 0.8", row(20000, 4, 40, 1.5), SamplingParams{Temperature: 0.7, TopP: 0.8}, 0, 0.9, 3000, false},
		{"end of generation suppressed, flagged", row(20000, 5, 40, 1.5), SamplingParams{Temperature: 1, TopP: 1}, 1, 0.6, 3000, false},
		// (as -inf among the candidates the token's weight stays in the log-sum-exp: the bound on the rest is loose)
		{"end of generation suppressed, -inf", row(20000, 5, 40, 1.5), SamplingParams{Temperature: 1, TopP: 1}, 2, 0.2, 3000, false},
		{"a 151,936-token row", row(151936, 6, 60, 1.5), SamplingParams{Temperature: 1, TopP: 1}, 0, 0.3, 300, false},
		{"flat (mostly undecided)", row(20000, 7, 0, 1), SamplingParams{Temperature: 1, TopP: 1}, 0, 0, 500, false},
		{"ties", func() []float32 {
			l := row(5000, 8, 40, 1.5)
			for i := range l {
				l[i] = float32(math.Round(float64(l[i])*2) / 2)
			}
			return l
		}(), SamplingParams{Temperature: 0.9, TopP: 0.9}, 0, 0.3, 2000, false},
		{"a row smaller than k", row(40, 9, 3, 1), SamplingParams{Temperature: 1, TopP: 1}, 0, 0.99, 500, false},
		{"temperature above 1", row(2000, 10, 40, 1.5), SamplingParams{Temperature: 1.5, TopP: 1}, 0, 0, 20, true},
		{"top-k", row(2000, 11, 40, 1.5), SamplingParams{Temperature: 1, TopK: 20}, 0, 0, 20, true},
		{"min-p", row(2000, 12, 40, 1.5), SamplingParams{Temperature: 1, TopP: 1, MinP: 0.05}, 0, 0, 20, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			ids, vals, lse := candidates(tc.l)
			var suppressed []bool
			switch tc.suppress {
			case 1:
				suppressed = make([]bool, k)
				suppressed[0], tc.l[ids[0]] = true, inf
			case 2:
				tc.l[ids[0]], vals[0] = inf, inf
			}
			rng, decided := uint64(99), 0
			for range tc.draws {
				rc, rs := rng, rng
				got, err := m.SampleCandidates(ids, vals, suppressed, lse, len(tc.l), tc.p, &rc)
				is.NoErr(err)
				want, err := m.Sample(tc.l, tc.p, nil, &rs)
				is.NoErr(err)
				if got >= 0 {
					decided++
					is.Equal(got, want) // the whole row's draw
					is.Equal(rc, rs)    // and its generator step
				} else {
					is.Equal(rc, rng) // untouched
				}
				rng = rs
			}
			frac := float64(decided) / float64(tc.draws)
			t.Logf("%d of %d draws decided from the candidates", decided, tc.draws)
			is.True(frac >= tc.minDecided)
			if tc.wantRefused {
				is.Equal(decided, 0)
			}
		})
	}
}
