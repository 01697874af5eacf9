package engine

import (
	"fmt"
	"slices"
	"time"

	"github.com/dflash/dflash_server/sdk"
)

// What a generated token does to its sequence's output: logprobs, stop conditions, the parser, the reasoning
// budget, and the event that carries it.

// commit appends one generated token to the sequence and its output to ev
// (row or c, when not nil, is the distribution it came from, for logprobs).
// It returns true when the token ended the sequence: ev then went out with
// the Finish and the sequence is retired. Speculative decoding commits
// several accepted tokens into one event this way, stopping at the first
// that ends the sequence.
func (e *Engine) commit(s *sequence, ev *sdk.Event, tok int32, forced bool, row []float32, c *candidateRow) bool {
	// counted before the token can reach its client: a Stats call made after a request's last event sees all of it
	// (counted once a step, after the events, a client could read 11 of 12 tokens)
	e.mu.Lock()
	e.stats.TokensGenerated++
	e.mu.Unlock()
	ev.TokenIDs = append(ev.TokenIDs, tok)
	switch {
	case !s.req.Logprobs:
	case row != nil:
		ev.Logprobs = append(ev.Logprobs, tokenLogprob(row, tok, s.req.TopLogprobs, e.vocab))
	case c != nil:
		ev.Logprobs = append(ev.Logprobs, candidateLogprob(c, tok, s.req.TopLogprobs, e.vocab))
	}
	s.generated = append(s.generated, tok)
	if !forced && e.vocab.EOG(tok) {
		e.finish(s, *ev, sdk.FinishStop, "")
		return true
	}
	inJSON := !forced && e.constrained(s) && !e.opensReasoning(s, tok)
	if inJSON && !s.json.Feed(e.vocab.TokenBytes(tok)) {
		e.retire(s, fmt.Errorf("token %d (%q) breaks the JSON object", tok, e.vocab.TokenBytes(tok)))
		return true
	}
	if s.parser.InReasoning() {
		s.reasoning++
	}
	if m := e.route(s, ev, s.parser.Feed(s.req.Detokenizer.Add(tok))); m != "" {
		e.finish(s, *ev, sdk.FinishStopSequence, m)
		return true
	}
	if inJSON && s.json.Complete() {
		e.finish(s, *ev, sdk.FinishStop, "")
		return true
	}
	if len(s.generated) >= s.req.MaxTokens || s.nPast >= e.cfg.MaxCtx {
		e.finish(s, *ev, sdk.FinishLength, "")
		return true
	}
	if len(s.forced) == 0 && s.parser.InReasoning() && e.overBudget(s) {
		s.forced = slices.Clone(s.req.CloseReasoning)
	}
	return false
}

// overBudget reports whether the reasoning must be closed now: its own
// budget is spent, or only the reply budget of the max-tokens cap is left.
func (e *Engine) overBudget(s *sequence) bool {
	r := s.req
	if r.ReasoningBudget > 0 && s.reasoning >= r.ReasoningBudget {
		return true
	}
	if r.HardLimitReplyBudget > 0 {
		left := r.MaxTokens - len(s.generated)
		return left <= max(r.HardLimitReplyBudget, len(r.CloseReasoning))
	}
	return false
}

// route adds parsed output to ev, stop-matching the visible text; it
// returns the stop string that matched, if any.
func (e *Engine) route(s *sequence, ev *sdk.Event, o Output) string {
	ev.Reasoning += o.Reasoning
	if o.Text != "" {
		emit, m := s.stop.push(o.Text)
		ev.Text += emit
		if m != "" {
			return m
		}
	}
	if len(o.ToolCalls) > 0 {
		ev.Text += s.stop.flush()
		ev.ToolCalls = append(ev.ToolCalls, o.ToolCalls...)
		s.toolCalls = true
	}
	return ""
}

// finish ends a sequence normally: the last event carries what the
// detokenizer, parser and stop matcher still held, and the Finish.
func (e *Engine) finish(s *sequence, ev sdk.Event, reason sdk.FinishReason, stopSeq string) {
	if reason != sdk.FinishStopSequence {
		m := e.route(s, &ev, s.parser.Feed(s.req.Detokenizer.Flush()))
		if m == "" {
			m = e.route(s, &ev, s.parser.Close())
		}
		if m != "" {
			reason, stopSeq = sdk.FinishStopSequence, m
		} else {
			ev.Text += s.stop.flush()
		}
	}
	if reason == sdk.FinishStop && s.toolCalls {
		reason = sdk.FinishToolCalls
	}
	now := time.Now()
	t := sdk.Timings{}
	if !s.tFirst.IsZero() {
		t.PrefillMS = ms(s.tFirst.Sub(s.tAdmit))
		t.DecodeMS = ms(now.Sub(s.tFirst))
	}
	ev.Finish = &sdk.Finish{
		Reason: reason, StopSequence: stopSeq, Timings: t,
		Usage: sdk.Usage{PromptTokens: len(s.req.Prompt), CompletionTokens: len(s.generated), ReasoningTokens: s.reasoning, CachedTokens: s.cached},
	}
	specTimings(s, &ev.Finish.Timings)
	s.out.put(ev)
	e.retire(s, nil)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
