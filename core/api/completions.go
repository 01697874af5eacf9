package api

import (
	"encoding/json"
	"net/http"
	"unicode/utf8"

	"github.com/dflash/dflash_server/sdk"
)

// completionRequest is the body of POST /v1/completions (OpenAI's legacy
// text completions). Unknown fields are ignored, as OpenAI does.
type completionRequest struct {
	Model             string          `json:"model"`
	Prompt            json.RawMessage `json:"prompt"`
	Suffix            *string         `json:"suffix"`
	MaxTokens         *int            `json:"max_tokens"`
	Temperature       *float64        `json:"temperature"`
	TopP              *float64        `json:"top_p"`
	TopK              *int            `json:"top_k"`
	MinP              *float64        `json:"min_p"`
	Seed              *int64          `json:"seed"`
	Stop              json.RawMessage `json:"stop"`
	FrequencyPenalty  *float64        `json:"frequency_penalty"`
	PresencePenalty   *float64        `json:"presence_penalty"`
	RepetitionPenalty *float64        `json:"repetition_penalty"`
	N                 *int            `json:"n"`
	BestOf            *int            `json:"best_of"`
	Logprobs          *int            `json:"logprobs"`
	Echo              bool            `json:"echo"`
	Stream            bool            `json:"stream"`
	StreamOptions     *chatStreamOpts `json:"stream_options"`
	IgnoreEOS         bool            `json:"ignore_eos"`
	MinTokens         *int            `json:"min_tokens"`
}

// completionOptions shape the response, not the generation.
type completionOptions struct {
	stream       bool
	includeUsage bool
	echo         bool
	logprobs     bool
}

// defaultCompletionTokens is OpenAI's max_tokens default for text
// completions (vLLM keeps it too): clients of this API expect a short
// answer when they do not ask for a length.
const defaultCompletionTokens = 16

// decodeCompletion parses and validates a text completions body.
func decodeCompletion(b []byte, lim limits) (*sdk.ChatRequest, completionOptions, *apiError) {
	var in completionRequest
	if err := decodeJSON(b, lim, &in); err != nil {
		return nil, completionOptions{}, err
	}
	opts := completionOptions{stream: in.Stream, echo: in.Echo,
		includeUsage: in.Stream && in.StreamOptions != nil && in.StreamOptions.IncludeUsage}
	prompt, err := completionPrompt(in.Prompt)
	if err != nil {
		return nil, opts, err
	}
	if in.Suffix != nil {
		prompt.Suffix = *in.Suffix
	}
	req := &sdk.ChatRequest{
		Model: in.Model, Prompt: prompt, IgnoreEOS: in.IgnoreEOS, MaxTokens: defaultCompletionTokens,
		Sampling: sdk.Sampling{
			Temperature: in.Temperature, TopP: in.TopP, TopK: in.TopK, MinP: in.MinP, Seed: in.Seed,
			FrequencyPenalty: in.FrequencyPenalty, PresencePenalty: in.PresencePenalty,
			RepetitionPenalty: in.RepetitionPenalty,
		},
	}
	if in.MaxTokens != nil {
		if *in.MaxTokens < 1 {
			return nil, opts, badRequest("max_tokens", "max_tokens must be at least 1, got %d", *in.MaxTokens)
		}
		req.MaxTokens = *in.MaxTokens
	}
	if in.MinTokens != nil {
		req.MinTokens = *in.MinTokens
	}
	if in.N != nil && *in.N != 1 {
		return nil, opts, unsupported("n", "n must be 1; several choices per request are not supported, got %d", *in.N)
	}
	if in.BestOf != nil && *in.BestOf != 1 {
		return nil, opts, unsupported("best_of", "best_of must be 1; several candidates per request are not supported, got %d", *in.BestOf)
	}
	stop, err := stringOrStrings(in.Stop, "stop")
	if err != nil {
		return nil, opts, err
	}
	req.Stop = stop
	if in.Logprobs != nil {
		if *in.Logprobs < 0 || *in.Logprobs > maxLegacyLogprobs {
			return nil, opts, badRequest("logprobs", "logprobs must be between 0 and %d, got %d", maxLegacyLogprobs, *in.Logprobs)
		}
		if in.Echo {
			// OpenAI then scores the prompt too; the engine computes
			// log probabilities of generated tokens only.
			return nil, opts, unsupported("logprobs", "logprobs with echo needs log probabilities of the prompt tokens, which this server does not compute; drop echo or logprobs")
		}
		req.Logprobs, req.TopLogprobs = true, *in.Logprobs
		opts.logprobs = true
	}
	if err := checkCommon(req, "max_tokens", lim); err != nil {
		return nil, opts, err
	}
	return req, opts, nil
}

// maxLegacyLogprobs bounds logprobs as top_logprobs is bounded on chat.
const maxLegacyLogprobs = 20

// completionPrompt decodes prompt: a string, an array of token ids, or a
// one-element array holding either. Several prompts would need several
// choices, which this server does not produce.
func completionPrompt(r json.RawMessage) (*sdk.RawPrompt, *apiError) {
	switch rawKind(r) {
	case 0, 'n':
		return nil, missingParam("prompt")
	case 's':
		s, err := rawString(r, "prompt")
		if err != nil {
			return nil, err
		}
		if s == "" {
			return nil, badRequest("prompt", "prompt must not be empty")
		}
		return &sdk.RawPrompt{Text: s}, nil
	case 'a':
		var items []json.RawMessage
		if err := json.Unmarshal(r, &items); err != nil {
			return nil, badRequest("prompt", "prompt: %v", err)
		}
		if len(items) == 0 {
			return nil, badRequest("prompt", "prompt must not be empty")
		}
		switch rawKind(items[0]) {
		case 'd':
			return tokenPrompt(r, "prompt")
		case 's', 'a':
			if len(items) > 1 {
				return nil, unsupported("prompt", "prompt holds %d prompts; one prompt per request is supported (send them as separate requests)", len(items))
			}
			if rawKind(items[0]) == 'a' {
				return tokenPrompt(items[0], "prompt[0]")
			}
			return completionPrompt(items[0])
		}
		return nil, badRequest("prompt[0]", "prompt[0]: expected a string, a token id or an array of token ids, got %s", kindName(rawKind(items[0])))
	}
	return nil, badRequest("prompt", "prompt must be a string or an array of token ids, got %s", kindName(rawKind(r)))
}

func tokenPrompt(r json.RawMessage, field string) (*sdk.RawPrompt, *apiError) {
	var ids []int64
	if err := json.Unmarshal(r, &ids); err != nil {
		return nil, badRequest(field, "%s: expected an array of integer token ids", field)
	}
	if len(ids) == 0 {
		return nil, badRequest(field, "%s must not be empty", field)
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		if id < 0 || id > 1<<31-1 {
			return nil, badRequest(index(field, i), "%s: token id %d is out of range", index(field, i), id)
		}
		out[i] = int32(id)
	}
	return &sdk.RawPrompt{Tokens: out}, nil
}

// legacyLogprobs is the logprobs object of text completions: parallel
// arrays, top alternatives as token → logprob maps.
type legacyLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// offsets counts characters of the text so far for text_offset, which
// clients use to slice the returned text (Python strings count code points).
// A character split across tokens counts where it completes.
type offsets struct {
	chars   int
	pending []byte
}

func (o *offsets) add(b []byte) {
	o.pending = append(o.pending, b...)
	n := incompleteTail(string(o.pending))
	o.chars += utf8.RuneCount(o.pending[:len(o.pending)-n])
	o.pending = append(o.pending[:0], o.pending[len(o.pending)-n:]...)
}

// append adds lps to l, advancing off past each token.
func (l *legacyLogprobs) append(lps []sdk.TokenLogprob, off *offsets) {
	for _, lp := range lps {
		l.Tokens = append(l.Tokens, lp.Token)
		l.TokenLogprobs = append(l.TokenLogprobs, lp.Logprob)
		top := make(map[string]float64, len(lp.Top))
		for _, t := range lp.Top {
			top[t.Token] = t.Logprob
		}
		l.TopLogprobs = append(l.TopLogprobs, top)
		l.TextOffset = append(l.TextOffset, off.chars)
		b := lp.Bytes
		if b == nil {
			b = []byte(lp.Token)
		}
		off.add(b)
	}
}

func newLegacyLogprobs() *legacyLogprobs {
	return &legacyLogprobs{Tokens: []string{}, TokenLogprobs: []float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{}}
}

type completionUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func newCompletionUsage(u sdk.Usage) completionUsage {
	return completionUsage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.PromptTokens + u.CompletionTokens}
}

type completionChoice struct {
	Text         string          `json:"text"`
	Index        int             `json:"index"`
	Logprobs     *legacyLogprobs `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
}

type completion struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	SystemFingerprint *string            `json:"system_fingerprint"`
	Choices           []completionChoice `json:"choices"`
	// Usage is always present on a whole response; on stream chunks it is
	// null, or absent without include_usage, as on chat.
	Usage  json.RawMessage `json:"usage,omitempty"`
	Dflash *dflashTimings  `json:"dflash,omitempty"`
}

// completionWriter writes a text completion, whole or as SSE chunks. The
// backend runs no output parser on a raw prompt, so all output is text;
// anything else a backend might send is written as text too.
type completionWriter struct {
	w       http.ResponseWriter
	sse     *sseWriter // nil for a whole response
	st      Stream
	opts    completionOptions
	id      string
	created int64
	reqID   string
	text    []byte
	lp      *legacyLogprobs
	off     offsets
}

func newCompletionWriter(w http.ResponseWriter, st Stream, id string, created int64, reqID, echo string, opts completionOptions) *completionWriter {
	c := &completionWriter{w: w, st: st, opts: opts, id: id, created: created, reqID: reqID}
	if opts.logprobs {
		c.lp = newLegacyLogprobs()
	}
	c.off.add([]byte(echo))
	if opts.stream {
		c.sse = startSSE(w)
		if echo != "" {
			c.chunk(echo, nil, nil)
		}
	} else {
		c.text = append(c.text, echo...)
	}
	return c
}

func (c *completionWriter) envelope(choices []completionChoice) completion {
	return completion{ID: c.id, Object: "text_completion", Created: c.created, Model: c.st.Model(), Choices: choices}
}

func (c *completionWriter) chunk(s string, lps []sdk.TokenLogprob, finish *string) {
	ch := completionChoice{Text: s, FinishReason: finish}
	if c.lp != nil {
		l := newLegacyLogprobs()
		l.append(lps, &c.off)
		ch.Logprobs = l
	}
	ev := c.envelope([]completionChoice{ch})
	if c.opts.includeUsage {
		ev.Usage = nullJSON
	}
	c.sse.event("", ev)
}

func (c *completionWriter) open(*block) {}

func (c *completionWriter) piece(_ *block, s string, lps []sdk.TokenLogprob) {
	if c.sse != nil {
		c.chunk(s, lps, nil)
		return
	}
	c.text = append(c.text, s...)
	if c.lp != nil {
		c.lp.append(lps, &c.off)
	}
}

func (c *completionWriter) close(*block) {}

func (c *completionWriter) finish(f *sdk.Finish, reason sdk.FinishReason, _ []*block) {
	r := chatFinishReason(reason)
	usage, _ := marshal(newCompletionUsage(f.Usage))
	if c.sse != nil {
		c.chunk("", nil, &r)
		if c.opts.includeUsage {
			ev := c.envelope([]completionChoice{})
			ev.Usage, ev.Dflash = usage, newTimings(c.st, f.Timings)
			c.sse.event("", ev)
		}
		c.sse.raw("data: [DONE]\n\n")
		return
	}
	ev := c.envelope([]completionChoice{{Text: string(c.text), Logprobs: c.lp, FinishReason: &r}})
	ev.Usage, ev.Dflash = usage, newTimings(c.st, f.Timings)
	writeJSON(c.w, http.StatusOK, ev)
}

func (c *completionWriter) fail(err error) {
	if c.sse != nil {
		c.sse.event("", openAIErrorBody{Error: backendFailure(err).openAIObject()})
		c.sse.raw("data: [DONE]\n\n")
		return
	}
	writeError(c.w, shapeOpenAI, c.reqID, backendFailure(err))
}

// completionStream is a completionWriter that streams.
type completionStream struct{ *completionWriter }

func (c completionStream) heartbeat()      { c.sse.raw(": keep-alive\n\n") }
func (c completionStream) writeErr() error { return c.sse.err }
