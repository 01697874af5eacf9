package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/dflash/dflash_server/sdk/gguf"
)

// BenchmarkGGUF measures a real-size model file on a device, the way llama-bench does, so the two can be compared on
// the same file and GPU: $DFLASH_BENCH_GGUF (the file), $DFLASH_BENCH_DEVICE (default cpu), $DFLASH_BENCH_BATCHES
// (decode batch sizes, default "1,8,32"), $DFLASH_BENCH_PROMPTS (prefill lengths, default "512,4096"). Sub-benchmarks:
// pp<N> (one prompt of N tokens per forward) and tg-b<B> (B sequences decoding one token each per forward, after a
// prompt of $DFLASH_BENCH_CONTEXT tokens, default 16, cut back there every ~1,000 steps; the next token is the
// device's greedy choice, Batch.TopK = 1). $DFLASH_BENCH_THREADS (a single
// count) sets the CPU threads (default: every core). $DFLASH_BENCH_VERIFY (block lengths, default none) adds
// vf-b<B>-q<Q>: B sequences each verifying a speculative block of Q tokens per forward (every row's top-1, recurrent
// state recorded, five layers captured for the draft ($DFLASH_BENCH_CAPTURE sets how many; read in place as the server
// does, $DFLASH_BENCH_CAPTURE_COPY=1 copied out), then cut back to one accepted token) — its ms/step against tg-b<B>'s is the verify cost. $DFLASH_BENCH_TREE (node counts, default none)
// adds vt-b<B>-n<N>: the same with a token tree of N nodes (benchTree: DDTree's verify, every node's state recorded).
// Run with -test.benchtime=Nx; tok/s is what to compare.
//
// MoE models (deepseek4): tg-b<B> also reports activeGB/s, the bytes a decode step must read (every matrix but the
// embedding, and of each expert stack the share of the experts B tokens routed at random choose) per second of the
// step: against the device's memory bandwidth it is the bytes-read bound. $DFLASH_BENCH_PREFILL sets
// deepseek4.engine.prefill (exact, the default, runs prompts token by token: keep DFLASH_BENCH_PROMPTS short, or use
// sparse); verify blocks run without hidden-state capture there (deepseek4 has none). DFLASH_BENCH_FUSED=1 sets
// deepseek4.engine.fused_decode (decode steps replayed as device graphs).
func BenchmarkGGUF(b *testing.B) {
	path := os.Getenv("DFLASH_BENCH_GGUF")
	if path == "" {
		b.Skip("set DFLASH_BENCH_GGUF to a model file")
	}
	device := os.Getenv("DFLASH_BENCH_DEVICE")
	if device == "" {
		device = "cpu"
	}
	lib, err := Open(libDir(b), device)
	if err != nil {
		b.Fatal(err)
	}
	batches, prompts := envInts("DFLASH_BENCH_BATCHES", "1,8,32"), envInts("DFLASH_BENCH_PROMPTS", "512,4096")
	verify := envInts("DFLASH_BENCH_VERIFY", "")
	trees := envInts("DFLASH_BENCH_TREE", "")
	ctx := envInts("DFLASH_BENCH_CONTEXT", "16")[0] // decode's context (long ones weigh attention)
	maxB, maxP := 1, 16
	for _, x := range batches {
		maxB = max(maxB, x)
	}
	for _, x := range prompts {
		maxP = max(maxP, x)
	}
	threads, _ := strconv.Atoi(os.Getenv("DFLASH_BENCH_THREADS"))
	f, err := gguf.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	spec, err := SpecFromGGUF(f)
	if err != nil {
		b.Fatal(err)
	}
	if mode := os.Getenv("DFLASH_BENCH_PREFILL"); mode != "" && spec.Arch == "deepseek4" {
		spec.Meta["deepseek4.engine.prefill"] = mode
	}
	if os.Getenv("DFLASH_BENCH_FUSED") == "1" && spec.Arch == "deepseek4" {
		spec.Meta["deepseek4.engine.fused_decode"] = true // the plugin's --ds4-fused-decode
	}
	spec.Options = Options{KVPoolTokens: maxP + maxB*(ctx+1024), MaxSeqs: maxB + 1, CacheK: CacheF16, CacheV: CacheF16, Threads: threads}
	m, err := lib.LoadModel(spec)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	vocab := m.Info().Vocab
	rng := rand.New(rand.NewPCG(7, 7))
	for _, n := range prompts {
		toks := randomTokens(rng, n, vocab)
		b.Run(fmt.Sprintf("pp%d", n), func(b *testing.B) {
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
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tok/s")
		})
	}
	for _, nb := range batches {
		b.Run(fmt.Sprintf("tg-b%d", nb), func(b *testing.B) {
			var batch Batch
			for i := 0; i < nb; i++ {
				s, err := m.NewSeq()
				if err != nil {
					b.Fatal(err)
				}
				defer m.FreeSeq(s)
				if _, err := m.Forward(one(s, randomTokens(rng, ctx, vocab), LogitsNone)); err != nil {
					b.Fatal(err)
				}
				batch.Entries = append(batch.Entries, Entry{Seq: s, Tokens: []int32{1}, Logits: LogitsLast})
			}
			// greedy on the device: every logits row is computed, only the chosen token comes back (as llama.cpp's
			// batched bench computes the logits and samples nothing)
			batch.TopK = 1
			step := func() {
				if n, _ := m.SeqLen(batch.Entries[0].Seq); n >= ctx+984 {
					for _, e := range batch.Entries {
						_ = m.Truncate(e.Seq, ctx)
					}
				}
				r, err := m.Forward(batch)
				if err != nil {
					b.Fatal(err)
				}
				for e := range batch.Entries {
					ids, _, _, _ := r.Candidates(e, 0)
					id := ids[0]
					if id < 0 || int(id) >= vocab { // a step measured with DFL_CUDA_SKIP_OPS computes garbage
						id = 1
					}
					batch.Entries[e].Tokens[0] = id
				}
			}
			warmSteps(step)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				step()
			}
			sec := b.Elapsed().Seconds()
			b.ReportMetric(float64(nb*b.N)/sec, "tok/s")
			b.ReportMetric(float64(m.Info().WeightBytes)*float64(b.N)/sec/1e9, "weightGB/s")
			b.ReportMetric(sec*1e3/float64(b.N), "ms/step")
			if active, ok := moeStepBytes(spec, nb); ok {
				b.ReportMetric(active*float64(b.N)/sec/1e9, "activeGB/s")
			}
		})
		for _, q := range verify {
			b.Run(fmt.Sprintf("vf-b%d-q%d", nb, q), func(b *testing.B) {
				skipUnlessRecordsFit(b, lib, spec, nb, q, false)
				benchVerify(b, m, rng, nb, q, nil)
			})
		}
		for _, q := range trees {
			b.Run(fmt.Sprintf("vt-b%d-n%d", nb, q), func(b *testing.B) {
				skipUnlessRecordsFit(b, lib, spec, nb, q, true)
				benchVerify(b, m, rng, nb, q, benchTree(q))
			})
		}
	}
}

// skipUnlessRecordsFit skips a verify benchmark whose sequences' records (Estimate.RecordBytes, allocated per sequence
// at its first verify: 2.6 GB for a 27B qwen35 sequence of 16 rows where every row's state is kept) cannot fit the
// device's free memory, with the figures, where the forward would fail with out of memory.
func skipUnlessRecordsFit(b *testing.B, lib *Lib, spec ModelSpec, nb, q int, tree bool) {
	est, err := lib.Estimate(spec)
	if err != nil {
		b.Fatal(err)
	}
	free, _, err := lib.Memory()
	if err != nil {
		b.Fatal(err)
	}
	if need := uint64(nb) * est.RecordBytes(q, tree); need > free {
		b.Skipf("%d sequences verifying %d rows need up to %d bytes of record states; %d bytes are free", nb, q, need, free)
	}
}

// benchTree is the token tree vt-b<B>-n<N> verifies: a chain of two thirds of its n nodes, the others leaves hung
// under the chain's first nodes (a DDTree's shape: its width near the root), in an order where a parent precedes
// its children but a node's first child need not follow it.
func benchTree(n int) []int32 {
	chain := max(1, (2*n+2)/3)
	parents := make([]int32, n)
	for i := range parents {
		if i < chain {
			parents[i] = int32(i - 1)
		} else {
			parents[i] = int32((i - chain) % chain)
		}
	}
	return parents
}

// benchVerify times forwards in which nb sequences each verify a block of q tokens the way speculative decoding
// does (a chain, or the tree of parents), then keep one of them.
func benchVerify(b *testing.B, m *Model, rng *rand.Rand, nb, q int, parents []int32) {
	info := m.Info()
	// $DFLASH_BENCH_CAPTURE layers captured (default 5, a DFlash draft's): 0 times a verify without the captures' copy
	// to the host, so the difference is what they cost
	nc := 5
	if v := os.Getenv("DFLASH_BENCH_CAPTURE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			b.Fatalf("DFLASH_BENCH_CAPTURE=%q: want a count of layers, 0 or more", v)
		}
		nc = n
	}
	capture := make([]int, 0, nc)
	for i := 0; i < nc && info.Arch != "deepseek4"; i++ {
		capture = append(capture, (i*info.Layers)/nc)
	}
	// in place as the server reads them; $DFLASH_BENCH_CAPTURE_COPY=1: a fresh copy each forward (what that costs)
	batch := Batch{Capture: capture, CaptureInPlace: os.Getenv("DFLASH_BENCH_CAPTURE_COPY") != "1", TopK: 1}
	start := func() {
		for _, e := range batch.Entries {
			_ = m.FreeSeq(e.Seq)
		}
		batch.Entries = batch.Entries[:0]
		for i := 0; i < nb; i++ {
			s, err := m.NewSeq()
			if err != nil {
				b.Fatal(err)
			}
			if _, err := m.Forward(one(s, randomTokens(rng, 16, info.Vocab), LogitsNone)); err != nil {
				b.Fatal(err)
			}
			batch.Entries = append(batch.Entries, Entry{Seq: s, Tokens: randomTokens(rng, q, info.Vocab), Logits: LogitsAll,
				Record: true, Parents: parents})
		}
	}
	start()
	defer func() {
		for _, e := range batch.Entries {
			_ = m.FreeSeq(e.Seq)
		}
	}()
	step := func() {
		n0, _ := m.SeqLen(batch.Entries[0].Seq)
		if _, err := m.Forward(batch); err != nil {
			b.Fatal(err)
		}
		for _, e := range batch.Entries {
			if err := m.Truncate(e.Seq, n0+1); err != nil { // (of a tree: its root, a chain prefix)
				b.Fatal(err)
			}
		}
	}
	warmSteps(step)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if n, _ := m.SeqLen(batch.Entries[0].Seq); n+q >= 1000 {
			b.StopTimer()
			start()
			b.StartTimer()
		}
		step()
	}
	b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(b.N), "ms/step")
}

// warmSteps runs a step shape twice before the timer starts: a GPU device runs a shape op by op the first time it sees
// it and captures it as a graph the second (StepGraphs), so timed steps are replays, as in a long generation (and as
// llama-bench warms up). Without it, the capture fell inside a benchmark of 8 steps.
func warmSteps(step func()) {
	step()
	step()
}

// moeStepBytes is what one decode step of nb sequences reads of an MoE model's weights: every matrix but the token
// embedding (nb rows of it), and of each expert stack (3-D "*_exps.weight") the expected share of its E experts that
// nb tokens choosing k at random touch, 1 - (1 - k/E)^nb. ok is false for models without expert stacks.
func moeStepBytes(spec ModelSpec, nb int) (bytes float64, ok bool) {
	k := 0.0
	switch v := spec.Meta[spec.Arch+".expert_used_count"].(type) {
	case uint32:
		k = float64(v)
	case int32:
		k = float64(v)
	case uint64:
		k = float64(v)
	case int64:
		k = float64(v)
	case int:
		k = float64(v)
	}
	for _, t := range spec.Tensors {
		switch {
		case t.Name == "token_embd.weight":
		case len(t.Dims) == 3 && strings.HasSuffix(t.Name, "_exps.weight") && k > 0:
			e := float64(t.Dims[2])
			bytes += float64(len(t.Data)) * (1 - math.Pow(1-min(k, e)/e, float64(nb)))
			ok = true
		default:
			bytes += float64(len(t.Data))
		}
	}
	return bytes, ok
}

func envInts(key, def string) []int {
	v := os.Getenv(key)
	if v == "" {
		v = def
	}
	var out []int
	for _, f := range strings.Split(v, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n > 0 {
			out = append(out, n)
		}
	}
	return out
}

// BenchmarkDraftGGUF measures DFlash draft steps on a device: $DFLASH_BENCH_DRAFT (the draft file) beside
// $DFLASH_BENCH_GGUF (its target, for the embedding and head), $DFLASH_BENCH_DEVICE, $DFLASH_BENCH_BATCHES. Sub-benchmark
// draft-b<B>: B sequences each append 8 context rows of features and draft one whole block per call (what a
// sequence does per step when about 8 tokens are accepted), top-1 returned.
func BenchmarkDraftGGUF(b *testing.B) {
	path, target := os.Getenv("DFLASH_BENCH_DRAFT"), os.Getenv("DFLASH_BENCH_GGUF")
	if path == "" || target == "" {
		b.Skip("set DFLASH_BENCH_DRAFT and DFLASH_BENCH_GGUF to a draft and its target")
	}
	device := os.Getenv("DFLASH_BENCH_DEVICE")
	if device == "" {
		device = "cpu"
	}
	lib, err := Open(libDir(b), device)
	if err != nil {
		b.Fatal(err)
	}
	df, err := gguf.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer df.Close()
	tf, err := gguf.Open(target)
	if err != nil {
		b.Fatal(err)
	}
	defer tf.Close()
	spec, info, err := DraftSpecFromGGUF(df)
	if err != nil {
		b.Fatal(err)
	}
	if err := spec.AttachTarget(tf, info); err != nil {
		b.Fatal(err)
	}
	batches := envInts("DFLASH_BENCH_BATCHES", "1,8")
	maxB := 1
	for _, x := range batches {
		maxB = max(maxB, x)
	}
	spec.Options = Options{KVPoolTokens: maxB * 2048, MaxSeqs: maxB, CacheK: CacheF16, CacheV: CacheF16}
	m, err := lib.LoadModel(spec)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	const ctxRows = 8
	rng := rand.New(rand.NewPCG(9, 9))
	feats := randomFeatures(rng, ctxRows, info.FeatureSize)
	block := make([]int32, info.BlockSize)
	for i := 1; i < len(block); i++ {
		block[i] = info.MaskToken
	}
	for _, nb := range batches {
		b.Run(fmt.Sprintf("draft-b%d", nb), func(b *testing.B) {
			entries := make([]DraftEntry, nb)
			for i := range entries {
				s, err := m.NewSeq()
				if err != nil {
					b.Fatal(err)
				}
				defer m.FreeSeq(s)
				entries[i] = DraftEntry{Seq: s, Features: feats, Block: block}
			}
			step := func() {
				if n, _ := m.SeqLen(entries[0].Seq); n+ctxRows+len(block) > 2000 {
					for _, e := range entries {
						_ = m.Truncate(e.Seq, 0)
					}
				}
				if _, err := m.DraftForward(entries, 1); err != nil {
					b.Fatal(err)
				}
			}
			warmSteps(step) // (a device with graphs replays a step's shape from its third time)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				step()
			}
			b.ReportMetric(b.Elapsed().Seconds()*1e3/float64(b.N), "ms/step")
		})
	}
}
