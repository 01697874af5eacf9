package qwendflash

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/matryer/is"

	native "github.com/dflash/dflash_server/native/engine"
	"github.com/dflash/dflash_server/plugins/nativebackend"
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/gguf"
	"github.com/dflash/dflash_server/sdk/tokenizer"
)

// heldModel holds every forward until released, so a test can line up
// several requests before the engine's loop moves.
type heldModel struct {
	engine.Model
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (h *heldModel) Forward(ctx context.Context, b []engine.SeqInput) ([]float32, error) {
	h.once.Do(func() { close(h.entered) })
	<-h.release
	return h.Model.Forward(ctx, b)
}

func TestBatchedDecodeMatchesAloneOnCPU(t *testing.T) {
	q3, q35 := tinyModels(t)
	lib, err := native.Open(libDirForTests(t), "cpu")
	if err != nil {
		t.Fatal(err)
	}
	prompts := []string{"The cat sat on", "a much longer prompt that needs several prefill chunks of eight tokens each", "x", "hello there, model"}
	for _, path := range []string{q3, q35} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			is := is.New(t)
			f, err := gguf.Open(path)
			is.NoErr(err)
			defer f.Close()
			tok, err := tokenizer.FromMetadata(f.Meta)
			is.NoErr(err)
			m, err := lib.LoadGGUF(path, native.Options{KVPoolTokens: 2048, MaxSeqs: 4, Threads: 1})
			is.NoErr(err)
			defer m.Close()

			run := func(e *engine.Engine, text string) ([]int32, error) {
				em := newStream()
				req := &engine.Request{
					Prompt: tok.Encode(text, false, true), MaxTokens: 16, IgnoreEOS: true,
					Sampling: engine.Sampling{Temperature: 0}, Detokenizer: tokenizer.NewStreamDecoder(tok),
				}
				err := e.Run(context.Background(), req, em)
				return em.summary().tokens, err
			}
			alone := make([][]int32, len(prompts))
			e, err := engine.New(engine.Config{Model: nativebackend.NewModel(m), Vocab: tok, MaxCtx: 256, StepTokens: 8})
			is.NoErr(err)
			for i, p := range prompts {
				alone[i], err = run(e, p)
				is.NoErr(err)
				is.Equal(len(alone[i]), 16)
			}
			is.NoErr(e.Close(context.Background()))

			held := &heldModel{Model: nativebackend.NewModel(m), entered: make(chan struct{}), release: make(chan struct{})}
			e, err = engine.New(engine.Config{Model: held, Vocab: tok, MaxCtx: 256, StepTokens: 8})
			is.NoErr(err)
			defer e.Close(context.Background())
			got := make([][]int32, len(prompts))
			errs := make([]error, len(prompts))
			var wg sync.WaitGroup
			for i, p := range prompts {
				wg.Add(1)
				go func() { defer wg.Done(); got[i], errs[i] = run(e, p) }()
				if i == 0 {
					<-held.entered // the loop holds the first prefill; the rest queue up
				}
			}
			for e.Stats().ActiveSequences < len(prompts) {
				runtime.Gosched()
			}
			close(held.release)
			wg.Wait()
			for i := range prompts {
				is.NoErr(errs[i])
				is.Equal(fmt.Sprint(got[i]), fmt.Sprint(alone[i])) // same tokens batched as alone
			}
		})
	}
}

// rowsOnly hides a model's CandidateSampler: sampled requests without top-k then read whole rows.
type rowsOnly struct {
	engine.Model
	cm engine.CandidateModel
}

func (r rowsOnly) ForwardCandidates(ctx context.Context, b []engine.SeqInput, k int) (engine.Candidates, error) {
	return r.cm.ForwardCandidates(ctx, b, k)
}

// countingSampler is a model whose CandidateSampler counts the draws it decides from candidates and those it leaves
// to the whole row.
type countingSampler struct {
	engine.Model
	cs            engine.CandidateSampler
	decided, open int
}

func (c *countingSampler) ForwardCandidates(ctx context.Context, b []engine.SeqInput, k int) (engine.Candidates, error) {
	return c.cs.ForwardCandidates(ctx, b, k)
}

func (c *countingSampler) SampleCandidates(ids []int32, logits []float32, suppressed []bool, lse float32, s *engine.Sampling, rng *uint64) (int32, bool, error) {
	tok, ok, err := c.cs.SampleCandidates(ids, logits, suppressed, lse, s, rng)
	if ok {
		c.decided++
	} else {
		c.open++
	}
	return tok, ok, err
}

func (c *countingSampler) LogitsRow(row int, dst []float32) error { return c.cs.LogitsRow(row, dst) }

// TestSampledFromCandidates: requests sampled without top-k (temperature 1 and top-p 1, DeepSeek V4's preset, and a
// temperature below 1 with top-p) produce, seed for seed, the tokens the whole rows give, four at a time, while their
// draws come from the candidates wherever those decide them (the trained demo target, whose rows are peaked like a
// real model's) and from the whole row the model still holds otherwise; with logprobs, the same log-probabilities
// (the row's log-sum-exp from the device rather than the host) and top alternatives.
func TestSampledFromCandidates(t *testing.T) {
	target, _, prompts := demoPair(t)
	lib, err := native.Open(libDirForTests(t), "cpu")
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(target)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tok, err := tokenizer.FromMetadata(f.Meta)
	if err != nil {
		t.Fatal(err)
	}
	m, err := lib.LoadGGUF(target, native.Options{KVPoolTokens: 4096, MaxSeqs: 4, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, tc := range []struct {
		sampling engine.Sampling
		logprobs bool
	}{{engine.Sampling{Temperature: 1, TopP: 1}, false}, {engine.Sampling{Temperature: 0.7, TopP: 0.9}, false},
		{engine.Sampling{Temperature: 1, TopP: 1}, true}} {
		sampling := tc.sampling
		t.Run(fmt.Sprintf("temperature %v top-p %v logprobs %v", sampling.Temperature, sampling.TopP, tc.logprobs), func(t *testing.T) {
			is := is.New(t)
			var lps [2][][]sdk.TokenLogprob // per run, per prompt
			run := 0
			generate := func(model engine.Model) [][]int32 {
				lps[run] = make([][]sdk.TokenLogprob, len(prompts))
				e, err := engine.New(engine.Config{Model: model, Vocab: tok, MaxCtx: 512, StepTokens: 64})
				is.NoErr(err)
				defer e.Close(context.Background())
				out := make([][]int32, len(prompts))
				var wg sync.WaitGroup
				for i, p := range prompts {
					wg.Add(1)
					r := run
					go func() {
						defer wg.Done()
						s := sampling
						s.Seed = uint64(100 + i)
						em := newStream()
						req := &engine.Request{Prompt: tok.Encode(p, false, true), MaxTokens: 48, IgnoreEOS: !tc.logprobs,
							Sampling: s, Detokenizer: tokenizer.NewStreamDecoder(tok), Logprobs: tc.logprobs, TopLogprobs: 3}
						is.NoErr(e.Run(context.Background(), req, em))
						out[i] = em.summary().tokens
						lps[r][i] = em.summary().logprobs
					}()
				}
				wg.Wait()
				run++
				return out
			}
			nm := nativebackend.NewModel(m)
			rows := generate(rowsOnly{Model: nm, cm: nm.(engine.CandidateModel)})
			counted := &countingSampler{Model: nm, cs: nm.(engine.CandidateSampler)}
			cands := generate(counted)
			for i := range prompts {
				if !tc.logprobs {
					is.Equal(len(rows[i]), 48)
				}
				is.Equal(fmt.Sprint(cands[i]), fmt.Sprint(rows[i])) // the same tokens, seed for seed
			}
			for i := range prompts {
				if !tc.logprobs {
					continue
				}
				rl, cl := lps[0][i], lps[1][i]
				is.Equal(len(cl), len(rl))
				for j := range rl {
					is.Equal(cl[j].Token, rl[j].Token)
					is.True(math.Abs(cl[j].Logprob-rl[j].Logprob) < 1e-4) // the device's log-sum-exp against the host's
					is.Equal(len(cl[j].Top), len(rl[j].Top))
					for a := range rl[j].Top {
						is.Equal(cl[j].Top[a].Token, rl[j].Top[a].Token)
					}
				}
			}
			t.Logf("%d draws decided from candidates, %d from the whole row", counted.decided, counted.open)
			is.True(counted.decided > counted.open) // mostly candidates
			is.True(counted.open > 0)               // and the whole-row path taken too
		})
	}
}
