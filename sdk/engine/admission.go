package engine

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/dflash/dflash_server/sdk"
)

// capacity is a snapshot of the engine's ledger, as admission sees it.
type capacity struct {
	slots, usedSlots int
	blockSize        int
	totalBlocks      int
	freeBlocks       int
	maxCtx           int
	// headroom is the decode headroom in tokens each sequence must be able
	// to grow by.
	headroom int
	// runningNeed is the blocks running sequences still need for their
	// decode headroom beyond what they hold.
	runningNeed int
	// reclaimable is the blocks prefix-cache entries hold that admission
	// may evict; have the blocks the request brings along in the cache
	// entry it reuses.
	reclaimable int
	have        int
}

func blocksFor(tokens, blockSize int) int { return (tokens + blockSize - 1) / blockSize }

// decide answers admitted / busy / never fits for a request of prompt tokens
// that may generate maxTokens, and the blocks it must hold when admitted:
// its prompt plus the first stretch of decode headroom.
func (c capacity) decide(prompt, maxTokens int) (sdk.Admission, int) {
	need := prompt + maxTokens
	poolTokens := c.totalBlocks * c.blockSize
	adm := sdk.Admission{PromptTokens: prompt}
	switch {
	case need > c.maxCtx:
		adm.Outcome, adm.NeededTokens, adm.LimitTokens = sdk.OutcomeNeverFits, need, c.maxCtx
		adm.Reason = fmt.Sprintf("prompt (%d tokens) plus max tokens (%d) is %d tokens, more than the context of %d", prompt, maxTokens, need, c.maxCtx)
		return adm, 0
	case blocksFor(need, c.blockSize) > c.totalBlocks:
		adm.Outcome, adm.NeededTokens, adm.LimitTokens = sdk.OutcomeNeverFits, need, poolTokens
		adm.Reason = fmt.Sprintf("prompt (%d tokens) plus max tokens (%d) is %d tokens, more than the KV pool of %d", prompt, maxTokens, need, poolTokens)
		return adm, 0
	case c.usedSlots >= c.slots:
		adm.Outcome = sdk.OutcomeBusy
		adm.Reason = fmt.Sprintf("no free sequence slot (%d of %d in use)", c.usedSlots, c.slots)
		return adm, 0
	}
	promise := blocksFor(prompt+min(c.headroom, maxTokens), c.blockSize)
	if want := max(0, promise-c.have) + c.runningNeed; want > c.freeBlocks+c.reclaimable {
		adm.Outcome = sdk.OutcomeBusy
		adm.Reason = fmt.Sprintf("not enough free KV: needs %d tokens (prompt %d + decode headroom %d, plus %d for running sequences' headroom), %d free",
			want*c.blockSize, prompt, min(c.headroom, maxTokens), c.runningNeed*c.blockSize, (c.freeBlocks+c.reclaimable)*c.blockSize)
		return adm, 0
	}
	adm.Outcome = sdk.OutcomeAdmitted
	return adm, promise
}

// validate says what is wrong with a request, or "".
func validate(req *Request) string {
	switch {
	case req == nil:
		return "no request"
	case len(req.Prompt) == 0:
		return "the prompt is empty"
	case req.MaxTokens <= 0:
		return fmt.Sprintf("max tokens %d must be positive", req.MaxTokens)
	case req.Detokenizer == nil:
		return "request has no detokenizer"
	case req.TopLogprobs < 0 || req.TopLogprobs > maxTopLogprobs:
		return fmt.Sprintf("top_logprobs %d is outside [0, %d]", req.TopLogprobs, maxTopLogprobs)
	case req.Format > FormatJSONSchema:
		return fmt.Sprintf("unknown response format %d", req.Format)
	case req.Format == FormatJSONSchema && req.Schema == nil:
		return "response format json_schema without a schema"
	}
	return ""
}

// capacityLocked snapshots the ledger; e.mu must be held.
func (e *Engine) capacityLocked() capacity {
	c := capacity{
		slots: e.slots, usedSlots: len(e.seqs), blockSize: e.bs, totalBlocks: e.totalBlocks,
		freeBlocks: e.freeBlocks, maxCtx: e.cfg.MaxCtx, headroom: e.cfg.DecodeHeadroom,
	}
	for _, s := range e.seqs {
		c.runningNeed += max(0, blocksFor(min(s.pos+e.cfg.DecodeHeadroom, s.limit), e.bs)-s.held)
	}
	return c
}

func (e *Engine) admit(ctx context.Context, req *Request) (sdk.Admission, *sequence) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing {
		return sdk.Admission{Outcome: sdk.OutcomeBusy, PromptTokens: len(req.Prompt), Reason: "engine is shutting down"}, nil
	}
	c := e.capacityLocked()
	var reuse *cacheEntry
	cached := 0
	if e.rew != nil {
		reuse, cached = e.bestEntryLocked(req.Prompt)
		c.reclaimable = e.reclaimableLocked(reuse)
		if reuse != nil {
			c.have = reuse.held
		}
	}
	adm, promise := c.decide(len(req.Prompt), req.MaxTokens)
	if adm.Outcome != sdk.OutcomeAdmitted {
		return adm, nil
	}
	extra := promise
	if reuse != nil {
		e.cache = slices.DeleteFunc(e.cache, func(x *cacheEntry) bool { return x == reuse })
		promise = max(promise, reuse.held)
		extra = promise - reuse.held
	}
	e.evictLocked(extra)
	parser := req.Parser
	if parser == nil {
		parser = textParser{}
	}
	s := &sequence{
		req: req, ctx: ctx, out: newOutbox(e.cfg.EventBuffer, req.Whole, e.wake),
		held: promise, pos: len(req.Prompt), limit: len(req.Prompt) + req.MaxTokens, reuse: reuse, cached: cached,
		stop: newStopMatcher(req.Stop), parser: parser, rng: seedRNG(req.Sampling.Seed), json: newConstraint(req),
		tAdmit: time.Now(),
	}
	e.freeBlocks -= extra
	e.seqs = append(e.seqs, s)
	e.stats.PromptTokens += int64(len(req.Prompt))
	return adm, s
}

// unadmit returns an admitted sequence that never reached the loop.
func (e *Engine) unadmit(s *sequence) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c := s.reuse; c != nil {
		s.reuse = nil
		s.held -= c.held
		e.cache = append(e.cache, c)
	}
	e.freeBlocks += s.held
	s.held = 0
	e.seqs = slices.DeleteFunc(e.seqs, func(x *sequence) bool { return x == s })
}
