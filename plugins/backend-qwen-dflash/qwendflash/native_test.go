package qwendflash

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"testing"

	"github.com/matryer/is"

	native "github.com/dflash/dflash_server/native/engine"
	"github.com/dflash/dflash_server/plugins/nativebackend"
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
