package api

import (
	"encoding/json"
	"net/http"

	"github.com/dflash/dflash_server/sdk"
)

// thinkingSignature stands in for Anthropic's signature of a thinking block:
// a local server cannot produce verifiable ones, and clients treat it as
// opaque (api-conventions §3.2).
const thinkingSignature = "dflash"

type anthropicUsage struct {
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
}

// newAnthropicUsage splits the prompt as §3.7 says: input_tokens excludes
// the tokens read from the prefix cache.
func newAnthropicUsage(u sdk.Usage) anthropicUsage {
	return anthropicUsage{InputTokens: u.PromptTokens - u.CachedTokens, OutputTokens: u.CompletionTokens, CacheReadInputTokens: u.CachedTokens}
}

func anthropicStopReason(r sdk.FinishReason) string {
	switch r {
	case sdk.FinishLength:
		return "max_tokens"
	case sdk.FinishStopSequence:
		return "stop_sequence"
	case sdk.FinishToolCalls:
		return "tool_use"
	}
	return "end_turn"
}

type anthropicMessageObj struct {
	ID           string         `json:"id"`
	Type         string         `json:"type"`
	Role         string         `json:"role"`
	Model        string         `json:"model"`
	Content      []any          `json:"content"`
	StopReason   *string        `json:"stop_reason"`
	StopSequence *string        `json:"stop_sequence"`
	Usage        anthropicUsage `json:"usage"`
}

type anthropicText struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type anthropicThinking struct {
	Type      string `json:"type"`
	Thinking  string `json:"thinking"`
	Signature string `json:"signature,omitempty"`
}

type anthropicToolUse struct {
	Type  string          `json:"type"`
	ID    string          `json:"id"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
}

// toolInputObject is a call's arguments as the object Anthropic's input
// must be; arguments that are not a JSON object become {}.
func toolInputObject(args []byte) json.RawMessage {
	if rawKind(args) == 'o' && json.Valid(args) {
		return json.RawMessage(args)
	}
	return json.RawMessage("{}")
}

// anthropicStream writes the Messages event sequence (api-conventions §3.4).
type anthropicStream struct {
	sse *sseWriter
}

func newAnthropicStream(w http.ResponseWriter, st Stream, id string) *anthropicStream {
	a := &anthropicStream{sse: startSSE(w)}
	a.sse.event("message_start", struct {
		Type    string              `json:"type"`
		Message anthropicMessageObj `json:"message"`
	}{"message_start", anthropicMessageObj{ID: id, Type: "message", Role: "assistant", Model: st.Model(), Content: []any{},
		Usage: anthropicUsage{InputTokens: st.Admission().PromptTokens}}})
	a.heartbeat()
	return a
}

type anthropicBlockEvent struct {
	Type         string `json:"type"`
	Index        int    `json:"index"`
	ContentBlock any    `json:"content_block,omitempty"`
	Delta        any    `json:"delta,omitempty"`
}

func (a *anthropicStream) open(b *block) {
	var cb any
	switch b.kind {
	case kindReasoning:
		cb = anthropicThinking{Type: "thinking"}
	case kindText:
		cb = anthropicText{Type: "text"}
	case kindTool:
		cb = anthropicToolUse{Type: "tool_use", ID: b.id, Name: b.name, Input: json.RawMessage("{}")}
	}
	a.sse.event("content_block_start", anthropicBlockEvent{Type: "content_block_start", Index: b.index, ContentBlock: cb})
}

func (a *anthropicStream) piece(b *block, s string, _ []sdk.TokenLogprob) {
	var d any
	switch b.kind {
	case kindReasoning:
		d = struct {
			Type     string `json:"type"`
			Thinking string `json:"thinking"`
		}{"thinking_delta", s}
	case kindText:
		d = anthropicText{Type: "text_delta", Text: s}
	case kindTool:
		d = struct {
			Type        string `json:"type"`
			PartialJSON string `json:"partial_json"`
		}{"input_json_delta", s}
	}
	a.sse.event("content_block_delta", anthropicBlockEvent{Type: "content_block_delta", Index: b.index, Delta: d})
}

func (a *anthropicStream) close(b *block) {
	if b.kind == kindReasoning {
		a.sse.event("content_block_delta", anthropicBlockEvent{Type: "content_block_delta", Index: b.index, Delta: struct {
			Type      string `json:"type"`
			Signature string `json:"signature"`
		}{"signature_delta", thinkingSignature}})
	}
	a.sse.event("content_block_stop", anthropicBlockEvent{Type: "content_block_stop", Index: b.index})
}

func (a *anthropicStream) finish(f *sdk.Finish, reason sdk.FinishReason, _ []*block) {
	type messageDelta struct {
		StopReason   string  `json:"stop_reason"`
		StopSequence *string `json:"stop_sequence"`
	}
	a.sse.event("message_delta", struct {
		Type  string         `json:"type"`
		Delta messageDelta   `json:"delta"`
		Usage anthropicUsage `json:"usage"`
	}{"message_delta", messageDelta{anthropicStopReason(reason), stopSequence(f, reason)}, newAnthropicUsage(f.Usage)})
	a.sse.event("message_stop", struct {
		Type string `json:"type"`
	}{"message_stop"})
}

func stopSequence(f *sdk.Finish, reason sdk.FinishReason) *string {
	if reason != sdk.FinishStopSequence {
		return nil
	}
	s := f.StopSequence
	return &s
}

// fail sends Anthropic's error event and ends without message_stop (§3.5).
func (a *anthropicStream) fail(err error) {
	a.sse.event("error", anthropicErrorBody{Type: "error", Error: anthropicErrorObject{Type: "api_error", Message: err.Error()}})
}

func (a *anthropicStream) heartbeat() {
	a.sse.event("ping", struct {
		Type string `json:"type"`
	}{"ping"})
}

func (a *anthropicStream) writeErr() error { return a.sse.err }

// anthropicWhole writes a non-streaming Messages response.
type anthropicWhole struct {
	w     http.ResponseWriter
	st    Stream
	id    string
	reqID string
}

func (a *anthropicWhole) open(*block)                              {}
func (a *anthropicWhole) piece(*block, string, []sdk.TokenLogprob) {}
func (a *anthropicWhole) close(*block)                             {}

func (a *anthropicWhole) finish(f *sdk.Finish, reason sdk.FinishReason, blocks []*block) {
	content := make([]any, 0, len(blocks))
	for _, b := range blocks {
		switch b.kind {
		case kindReasoning:
			content = append(content, anthropicThinking{Type: "thinking", Thinking: string(b.text), Signature: thinkingSignature})
		case kindText:
			content = append(content, anthropicText{Type: "text", Text: string(b.text)})
		case kindTool:
			content = append(content, anthropicToolUse{Type: "tool_use", ID: b.id, Name: b.name, Input: toolInputObject(b.text)})
		}
	}
	r := anthropicStopReason(reason)
	writeJSON(a.w, http.StatusOK, anthropicMessageObj{ID: a.id, Type: "message", Role: "assistant", Model: a.st.Model(), Content: content,
		StopReason: &r, StopSequence: stopSequence(f, reason), Usage: newAnthropicUsage(f.Usage)})
}

func (a *anthropicWhole) fail(err error) {
	writeError(a.w, shapeAnthropic, a.reqID, backendFailure(err))
}
