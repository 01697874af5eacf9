package nativebackend

import (
	"cmp"
	"context"
	"fmt"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/tokenizer"
)

// Warm-up requests' shapes, in this order:
//   - on a GPU, a prompt of a whole step's tokens (the engine's StepTokens, one token out): the device's buffers that
//     a step's tokens size grow at load, not under a client's first long prompt (a CPU has no step graphs to lose,
//     and there a long prompt would lengthen the load by seconds);
//   - short prompts, one token each, for the kernels a prefill of that many tokens takes (the tensor-core products'
//     tiles of 8..64 tokens, one kernel per 8, and the dp4a ones below): a CUDA kernel is loaded on its first launch,
//     and without them the first request after a start (a 22-token chat prompt) had its first token 4.7 ms after the
//     request against 0.7 for the next (the demo model on an H100, 12-06 09:5x), with them 0.84 ms (11:3x);
//   - a prompt past the 64 tokens a GPU's prefill takes in its own kernels (the GEMM library loads too) and a few
//     decoded tokens (a decode step runs op by op once, is captured the second time and replayed after; a draft's
//     verify likewise). Last, because a prefill that grows the device's buffers drops every step graph captured
//     before it (the 64..40-token prompts after it did, 12-06 11:4x).
const (
	warmupPrompt = 80
	warmupTokens = 8
)

var warmupShortPrompts = []int{64, 56, 48, 40, 32, 24, 16, 8, 4, 2}

// warmupShape is one warm-up request: prompt tokens and tokens to generate.
type warmupShape struct{ prompt, tokens int }

// warmupShapes are the warm-up's requests for a context of maxCtx tokens and steps of stepTokens (0: no step-sized
// prompt; prompts up to half of the context; none where even the decoding one does not fit).
func warmupShapes(maxCtx, stepTokens int) []warmupShape {
	long := warmupShape{min(warmupPrompt, maxCtx/2), min(warmupTokens, maxCtx/4)}
	if long.prompt < 1 || long.tokens < 1 {
		return nil
	}
	var shapes []warmupShape
	if step := min(stepTokens, maxCtx/2); step > long.prompt {
		shapes = append(shapes, warmupShape{step, 1})
	}
	for _, n := range warmupShortPrompts {
		if n < long.prompt {
			shapes = append(shapes, warmupShape{n, 1})
		}
	}
	return append(shapes, long)
}

// WarmupModes are the values of the warmup option.
var WarmupModes = []string{"auto", "on", "off"}

// warmupOn reports whether a block's load runs the warm-up requests: mode "auto" on a GPU only. Why: a GPU's first
// forward of each kind pays one-time costs (kernel modules and cuBLAS loaded, step graphs captured): the first request
// after a start had its first token 106 ms after the request against 14 ms for the next (the demo model on an H200,
// 12-03); a DeepSeek V4 op profile (H200, 12-06) had the f32 router products of its first two prefills at 21.6 ms a
// call on average (8.4 us at one token), most likely cuBLAS's first use. llama.cpp warms up at load by default
// (`--no-warmup`). On a CPU they are small (the demo model's first request ~11 ms against 2-6 ms after, 12-06 on a
// 2-core VM) while the request itself would take seconds of a large model's load: on only when asked.
func warmupOn(mode, libKind string) bool {
	return mode == "on" || (mode == "auto" && libKind != "cpu")
}

// warmUp runs short greedy requests (tok's ids 1, 2, ...; warmupShapes) one after another through an engine of its
// own over cfg's model and draft, then closes it: cfg's model is left with every sequence freed and its step graphs
// captured. That engine has no disk store and no prefix cache, so nothing of the requests stays, and its counters go
// with it. A context or KV pool too small for a request skips it. gpu: the model is on a device with step graphs (the
// step-sized prompt first).
func warmUp(cfg engine.Config, tok *tokenizer.Tokenizer, gpu bool) error {
	vocab := tok.VocabSize()
	cfg.Store = nil
	cfg.PrefixCacheSlots = 0
	step := 0
	if gpu {
		step = cmp.Or(cfg.StepTokens, DefaultStepTokens)
	}
	shapes := warmupShapes(cfg.MaxCtx, step)
	if len(shapes) == 0 || vocab < 2 {
		return nil
	}
	eng, err := engine.New(cfg)
	if err != nil {
		return err
	}
	var runErr error
	for _, sh := range shapes {
		if runErr = warmupRequest(eng, tok, sh); runErr != nil {
			break
		}
	}
	if cerr := eng.Close(context.Background()); runErr == nil {
		runErr = cerr
	}
	return runErr
}

// warmupRequest runs one warm-up request of shape sh on eng.
func warmupRequest(eng *engine.Engine, tok *tokenizer.Tokenizer, sh warmupShape) error {
	vocab := tok.VocabSize()
	prompt := make([]int32, sh.prompt)
	for i := range prompt {
		prompt[i] = int32(1 + i%(vocab-1))
	}
	req := &engine.Request{ID: fmt.Sprintf("warm-up-%d", sh.prompt), Prompt: prompt, MaxTokens: sh.tokens,
		IgnoreEOS: true, Sampling: engine.Sampling{Temperature: 0}, Detokenizer: tokenizer.NewStreamDecoder(tok)}
	var sink warmupSink
	if err := eng.Run(context.Background(), req, &sink); err != nil {
		return fmt.Errorf("%d-token prompt: %w", sh.prompt, err)
	}
	if sink.invalid != "" {
		return fmt.Errorf("%d-token prompt refused: %s", sh.prompt, sink.invalid)
	}
	return nil
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
