package api

import (
	"encoding/json"
	"net/http"

	"github.com/dflash/dflash_server/sdk"
)

type chatUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CompletionTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"completion_tokens_details"`
}

func newChatUsage(u sdk.Usage) chatUsage {
	var c chatUsage
	c.PromptTokens, c.CompletionTokens = u.PromptTokens, u.CompletionTokens
	c.TotalTokens = u.PromptTokens + u.CompletionTokens
	c.PromptTokensDetails.CachedTokens = u.CachedTokens
	c.CompletionTokensDetails.ReasoningTokens = u.ReasoningTokens
	return c
}

// dflashTimings is dflash_server's own addition to a chat response, under a
// namespaced key that SDKs ignore.
type dflashTimings struct {
	QueueMS       float64 `json:"queue_ms"`
	PrefillMS     float64 `json:"prefill_ms"`
	DecodeMS      float64 `json:"decode_ms"`
	DraftAccepted int     `json:"draft_accepted,omitempty"`
	DraftProposed int     `json:"draft_proposed,omitempty"`
	// DraftSteps is the target forwards that verified a draft block; AcceptanceLength the tokens each committed.
	DraftSteps       int     `json:"draft_steps,omitempty"`
	AcceptanceLength float64 `json:"acceptance_length,omitempty"`
}

func newTimings(st Stream, t sdk.Timings) *dflashTimings {
	d := &dflashTimings{QueueMS: float64(st.QueueWait().Microseconds()) / 1000, PrefillMS: t.PrefillMS, DecodeMS: t.DecodeMS,
		DraftAccepted: t.DraftAccepted, DraftProposed: t.DraftProposed, DraftSteps: t.DraftSteps}
	if t.DraftSteps > 0 {
		d.AcceptanceLength = float64(t.DraftAccepted+t.DraftSteps) / float64(t.DraftSteps)
	}
	return d
}

type chatLogprobs struct {
	Content []chatTokenLogprob `json:"content"`
}

type chatTokenLogprob struct {
	Token       string           `json:"token"`
	Logprob     float64          `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []chatTopLogprob `json:"top_logprobs"`
}

type chatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// byteInts renders bytes as the array of integers OpenAI uses.
func byteInts(b []byte, token string) []int {
	if b == nil {
		b = []byte(token)
	}
	out := make([]int, len(b))
	for i, c := range b {
		out[i] = int(c)
	}
	return out
}

func newChatLogprobs(lps []sdk.TokenLogprob) []chatTokenLogprob {
	out := make([]chatTokenLogprob, 0, len(lps))
	for _, lp := range lps {
		t := chatTokenLogprob{Token: lp.Token, Logprob: lp.Logprob, Bytes: byteInts(lp.Bytes, lp.Token), TopLogprobs: []chatTopLogprob{}}
		for _, top := range lp.Top {
			t.TopLogprobs = append(t.TopLogprobs, chatTopLogprob{Token: top.Token, Logprob: top.Logprob, Bytes: byteInts(top.Bytes, top.Token)})
		}
		out = append(out, t)
	}
	return out
}

func chatFinishReason(r sdk.FinishReason) string {
	switch r {
	case sdk.FinishLength:
		return "length"
	case sdk.FinishToolCalls:
		return "tool_calls"
	}
	return "stop"
}

// chatStream writes Chat Completions chunks (api-conventions §2.2, §2.3).
type chatStream struct {
	sse          *sseWriter
	st           Stream
	id           string
	created      int64
	model        string
	includeUsage bool
	logprobs     bool
}

type chatChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []chatChunkChoice `json:"choices"`
	// Usage is null on every chunk but the last when include_usage is set,
	// and absent otherwise.
	Usage  json.RawMessage `json:"usage,omitempty"`
	Dflash *dflashTimings  `json:"dflash,omitempty"`
}

type chatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        chatDelta     `json:"delta"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

type chatDelta struct {
	Role             string          `json:"role,omitempty"`
	Content          *string         `json:"content,omitempty"`
	ReasoningContent string          `json:"reasoning_content,omitempty"`
	ToolCalls        []chatToolDelta `json:"tool_calls,omitempty"`
}

type chatToolDelta struct {
	Index    int           `json:"index"`
	ID       string        `json:"id,omitempty"`
	Type     string        `json:"type,omitempty"`
	Function chatFuncDelta `json:"function"`
}

type chatFuncDelta struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

var nullJSON = json.RawMessage("null")

func newChatStream(w http.ResponseWriter, st Stream, id string, created int64, opts chatOptions, logprobs bool) *chatStream {
	c := &chatStream{sse: startSSE(w), st: st, id: id, created: created, model: st.Model(), includeUsage: opts.includeUsage, logprobs: logprobs}
	empty := ""
	c.chunk(chatDelta{Role: "assistant", Content: &empty}, nil, nil)
	return c
}

func (c *chatStream) chunk(d chatDelta, lp []sdk.TokenLogprob, finish *string) {
	ch := chatChunk{ID: c.id, Object: "chat.completion.chunk", Created: c.created, Model: c.model,
		Choices: []chatChunkChoice{{Delta: d, FinishReason: finish}}}
	if c.logprobs && len(lp) > 0 {
		ch.Choices[0].Logprobs = &chatLogprobs{Content: newChatLogprobs(lp)}
	}
	if c.includeUsage {
		ch.Usage = nullJSON
	}
	c.sse.event("", ch)
}

func (c *chatStream) open(b *block) {
	if b.kind == kindTool {
		c.chunk(chatDelta{ToolCalls: []chatToolDelta{{Index: b.call, ID: b.id, Type: "function", Function: chatFuncDelta{Name: b.name}}}}, nil, nil)
	}
}

func (c *chatStream) piece(b *block, s string, lp []sdk.TokenLogprob) {
	switch b.kind {
	case kindReasoning:
		c.chunk(chatDelta{ReasoningContent: s}, lp, nil)
	case kindText:
		c.chunk(chatDelta{Content: &s}, lp, nil)
	case kindTool:
		c.chunk(chatDelta{ToolCalls: []chatToolDelta{{Index: b.call, Function: chatFuncDelta{Arguments: s}}}}, lp, nil)
	}
}

func (c *chatStream) close(*block) {}

func (c *chatStream) finish(f *sdk.Finish, reason sdk.FinishReason, _ []*block) {
	r := chatFinishReason(reason)
	c.chunk(chatDelta{}, nil, &r)
	if c.includeUsage {
		u, _ := marshal(newChatUsage(f.Usage))
		c.sse.event("", chatChunk{ID: c.id, Object: "chat.completion.chunk", Created: c.created, Model: c.model,
			Choices: []chatChunkChoice{}, Usage: u, Dflash: newTimings(c.st, f.Timings)})
	}
	c.sse.raw("data: [DONE]\n\n")
}

// fail sends the in-band error openai-python and openai-node raise as
// APIError (any data whose JSON has a top-level "error"), then [DONE].
func (c *chatStream) fail(err error) {
	c.sse.event("", openAIErrorBody{Error: backendFailure(err).openAIObject()})
	c.sse.raw("data: [DONE]\n\n")
}

func (c *chatStream) heartbeat()      { c.sse.raw(": keep-alive\n\n") }
func (c *chatStream) writeErr() error { return c.sse.err }

// chatWhole collects a non-streaming Chat Completions response.
type chatWhole struct {
	w        http.ResponseWriter
	st       Stream
	id       string
	created  int64
	logprobs bool
	lps      []sdk.TokenLogprob
	reqID    string
}

type chatCompletion struct {
	ID                string         `json:"id"`
	Object            string         `json:"object"`
	Created           int64          `json:"created"`
	Model             string         `json:"model"`
	SystemFingerprint *string        `json:"system_fingerprint"`
	Choices           []chatChoice   `json:"choices"`
	Usage             chatUsage      `json:"usage"`
	Dflash            *dflashTimings `json:"dflash,omitempty"`
}

type chatChoice struct {
	Index        int           `json:"index"`
	Message      chatOutMsg    `json:"message"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason string        `json:"finish_reason"`
}

type chatOutMsg struct {
	Role             string        `json:"role"`
	Content          *string       `json:"content"`
	ReasoningContent string        `json:"reasoning_content,omitempty"`
	ToolCalls        []chatOutCall `json:"tool_calls,omitempty"`
}

type chatOutCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

func (c *chatWhole) open(*block) {}
func (c *chatWhole) piece(_ *block, _ string, lp []sdk.TokenLogprob) {
	if c.logprobs {
		c.lps = append(c.lps, lp...)
	}
}
func (c *chatWhole) close(*block) {}

func (c *chatWhole) finish(f *sdk.Finish, reason sdk.FinishReason, blocks []*block) {
	msg := chatOutMsg{Role: "assistant"}
	var text, reasoning []byte
	for _, b := range blocks {
		switch b.kind {
		case kindText:
			text = append(text, b.text...)
		case kindReasoning:
			reasoning = append(reasoning, b.text...)
		case kindTool:
			var call chatOutCall
			call.ID, call.Type = b.id, "function"
			call.Function.Name, call.Function.Arguments = b.name, string(b.text)
			msg.ToolCalls = append(msg.ToolCalls, call)
		}
	}
	// content is null for a turn that is only tool calls (§2.1).
	if len(text) > 0 || len(msg.ToolCalls) == 0 {
		s := string(text)
		msg.Content = &s
	}
	msg.ReasoningContent = string(reasoning)
	choice := chatChoice{Message: msg, FinishReason: chatFinishReason(reason)}
	if c.logprobs {
		choice.Logprobs = &chatLogprobs{Content: newChatLogprobs(c.lps)}
	}
	writeJSON(c.w, http.StatusOK, chatCompletion{ID: c.id, Object: "chat.completion", Created: c.created, Model: c.st.Model(),
		Choices: []chatChoice{choice}, Usage: newChatUsage(f.Usage), Dflash: newTimings(c.st, f.Timings)})
}

func (c *chatWhole) fail(err error) {
	writeError(c.w, shapeOpenAI, c.reqID, backendFailure(err))
}
