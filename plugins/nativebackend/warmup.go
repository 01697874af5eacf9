package nativebackend

import (
	"context"
	"fmt"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/tokenizer"
)

// Warm-up request's shape: a prompt past the 64 tokens a GPU's prefill takes in its own kernels (so the GEMM library
// loads too), then a few decoded tokens (a decode step is run op by op once, captured the second time, replayed
// after; a draft's verify likewise).
const (
	warmupPrompt = 80
	warmupTokens = 8
)

// WarmupModes are the values of the warmup option.
var WarmupModes = []string{"auto", "on", "off"}

// warmupOn reports whether a block's load runs the warm-up request: mode "auto" on a GPU only. Why: a GPU's first
// forward of each kind pays one-time costs (kernel modules and cuBLAS loaded, step graphs captured): the first request
// after a start had its first token 106 ms after the request against 14 ms for the next (the demo model on an H200,
// 12-03); a DeepSeek V4 op profile (H200, 12-06) had the f32 router products of its first two prefills at 21.6 ms a
// call on average (8.4 us at one token), most likely cuBLAS's first use. llama.cpp warms up at load by default
// (`--no-warmup`). On a CPU they are small (the demo model's first request ~11 ms against 2-6 ms after, 12-06 on a
// 2-core VM) while the request itself would take seconds of a large model's load: on only when asked.
func warmupOn(mode, libKind string) bool {
	return mode == "on" || (mode == "auto" && libKind != "cpu")
}

// warmUp runs one short greedy request (tok's ids 1, 2, ...) through an engine of its own over cfg's model and draft,
// then closes it: cfg's model is left with every sequence freed and its step graphs captured. That engine has no disk
// store and no prefix cache, so nothing of the request stays, and its counters go with it. A context or KV pool too
// small for the request skips it.
func warmUp(cfg engine.Config, tok *tokenizer.Tokenizer) error {
	vocab := tok.VocabSize()
	cfg.Store = nil
	cfg.PrefixCacheSlots = 0
	n := min(warmupPrompt, cfg.MaxCtx/2)
	maxTokens := min(warmupTokens, cfg.MaxCtx/4)
	if n < 1 || maxTokens < 1 || vocab < 2 {
		return nil
	}
	eng, err := engine.New(cfg)
	if err != nil {
		return err
	}
	prompt := make([]int32, n)
	for i := range prompt {
		prompt[i] = int32(1 + i%(vocab-1))
	}
	req := &engine.Request{ID: "warm-up", Prompt: prompt, MaxTokens: maxTokens, IgnoreEOS: true,
		Sampling: engine.Sampling{Temperature: 0}, Detokenizer: tokenizer.NewStreamDecoder(tok)}
	var sink warmupSink
	runErr := eng.Run(context.Background(), req, &sink)
	if cerr := eng.Close(context.Background()); runErr == nil {
		runErr = cerr
	}
	if runErr == nil && sink.invalid != "" {
		runErr = fmt.Errorf("refused: %s", sink.invalid)
	}
	return runErr
}

// warmupSink is the warm-up request's emitter: it keeps nothing but an invalid admission's reason (a request of the
// engine's own making that it calls invalid is a fault; one that does not fit now or ever is skipped).
type warmupSink struct{ invalid string }

func (s *warmupSink) Admit(a sdk.Admission) error {
	if a.Outcome == sdk.OutcomeInvalid {
		s.invalid = a.Reason
	}
	return nil
}

func (s *warmupSink) Emit(sdk.Event) error { return nil }
