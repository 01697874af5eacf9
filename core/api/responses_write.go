package api

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/dflash/dflash_server/sdk"
)

type responsesUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

func newResponsesUsage(u sdk.Usage) *responsesUsage {
	r := &responsesUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.PromptTokens + u.CompletionTokens}
	r.InputTokensDetails.CachedTokens = u.CachedTokens
	r.OutputTokensDetails.ReasoningTokens = u.ReasoningTokens
	return r
}

type responseObj struct {
	ID                 string             `json:"id"`
	Object             string             `json:"object"`
	CreatedAt          int64              `json:"created_at"`
	Status             string             `json:"status"`
	Error              *responseError     `json:"error"`
	IncompleteDetails  *incompleteDetails `json:"incomplete_details"`
	Instructions       *string            `json:"instructions"`
	MaxOutputTokens    *int               `json:"max_output_tokens"`
	Model              string             `json:"model"`
	Output             []any              `json:"output"`
	ParallelToolCalls  bool               `json:"parallel_tool_calls"`
	PreviousResponseID *string            `json:"previous_response_id"`
	Reasoning          responseReasoning  `json:"reasoning"`
	Store              bool               `json:"store"`
	Temperature        *float64           `json:"temperature"`
	TopP               *float64           `json:"top_p"`
	ToolChoice         json.RawMessage    `json:"tool_choice"`
	Tools              []responsesTool    `json:"tools"`
	Usage              *responsesUsage    `json:"usage"`
	Metadata           map[string]string  `json:"metadata"`
}

type responseError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type incompleteDetails struct {
	Reason string `json:"reason"`
}

type responseReasoning struct {
	Effort  *string `json:"effort"`
	Summary *string `json:"summary"`
}

type respMessage struct {
	Type    string           `json:"type"`
	ID      string           `json:"id"`
	Status  string           `json:"status"`
	Role    string           `json:"role"`
	Content []respOutputText `json:"content"`
}

type respOutputText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

type respFunctionCall struct {
	Type      string `json:"type"`
	ID        string `json:"id"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
	Status    string `json:"status"`
}

// respReasoning carries the raw chain of thought as reasoning_text content
// (what the model wrote), not as a summary, which it is not.
type respReasoning struct {
	Type    string          `json:"type"`
	ID      string          `json:"id"`
	Summary []any           `json:"summary"`
	Content []respReasonTxt `json:"content"`
}

type respReasonTxt struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// responseBase is the response object before output exists.
type responseBase struct {
	id      string
	created int64
	model   string
	echo    responsesEcho
}

func (r *responseBase) object(status string) responseObj {
	tc := r.echo.toolChoice
	if rawKind(tc) == 0 || rawKind(tc) == 'n' {
		tc = json.RawMessage(`"auto"`)
	}
	tools := r.echo.tools
	if tools == nil {
		tools = []responsesTool{}
	}
	o := responseObj{ID: r.id, Object: "response", CreatedAt: r.created, Status: status, Instructions: r.echo.instructions,
		MaxOutputTokens: r.echo.maxOutputTokens, Model: r.model, Output: []any{}, ParallelToolCalls: r.echo.parallelToolCalls,
		Temperature: r.echo.temperature, TopP: r.echo.topP, ToolChoice: tc, Tools: tools, Metadata: map[string]string{}}
	if r.echo.effort != "" {
		e := r.echo.effort
		o.Reasoning.Effort = &e
	}
	return o
}

// item renders a finished block as its output item.
func itemOf(b *block, status string) any {
	switch b.kind {
	case kindReasoning:
		content := []respReasonTxt{}
		if status == "completed" {
			content = append(content, respReasonTxt{Type: "reasoning_text", Text: string(b.text)})
		}
		return respReasoning{Type: "reasoning", ID: b.itemID, Summary: []any{}, Content: content}
	case kindText:
		content := []respOutputText{}
		if status == "completed" {
			content = append(content, respOutputText{Type: "output_text", Text: string(b.text), Annotations: []any{}})
		}
		return respMessage{Type: "message", ID: b.itemID, Status: status, Role: "assistant", Content: content}
	}
	args := ""
	if status == "completed" {
		args = string(b.text)
	}
	return respFunctionCall{Type: "function_call", ID: b.itemID, CallID: b.id, Name: b.name, Arguments: args, Status: status}
}

func itemPrefix(k blockKind) string {
	switch k {
	case kindReasoning:
		return "rs_"
	case kindText:
		return "msg_"
	}
	return "fc_"
}

// finalResponse is the completed or incomplete response object.
func (r *responseBase) finalResponse(f *sdk.Finish, blocks []*block) responseObj {
	status := "completed"
	if f.Reason == sdk.FinishLength {
		status = "incomplete"
	}
	o := r.object(status)
	for _, b := range blocks {
		o.Output = append(o.Output, itemOf(b, "completed"))
	}
	if status == "incomplete" {
		o.IncompleteDetails = &incompleteDetails{Reason: "max_output_tokens"}
	}
	o.Usage = newResponsesUsage(f.Usage)
	return o
}

// responsesStream writes the Responses event sequence (api-conventions §4.2).
type responsesStream struct {
	responseBase
	sse *sseWriter
	seq int
	// blocks done so far, for response.failed.
	done []*block
}

func newResponsesStream(w http.ResponseWriter, base responseBase) *responsesStream {
	r := &responsesStream{responseBase: base, sse: startSSE(w)}
	o := r.object("in_progress")
	r.send(respEvent{Type: "response.created", Response: &o})
	r.send(respEvent{Type: "response.in_progress", Response: &o})
	return r
}

// respEvent is every Responses stream event; type and sequence_number come
// first, and the fields an event does not use are left out.
type respEvent struct {
	Type           string       `json:"type"`
	SequenceNumber int          `json:"sequence_number"`
	Response       *responseObj `json:"response,omitempty"`
	ItemID         string       `json:"item_id,omitempty"`
	OutputIndex    *int         `json:"output_index,omitempty"`
	ContentIndex   *int         `json:"content_index,omitempty"`
	Item           any          `json:"item,omitempty"`
	Part           any          `json:"part,omitempty"`
	Delta          string       `json:"delta,omitempty"`
	Text           *string      `json:"text,omitempty"`
	Name           string       `json:"name,omitempty"`
	Arguments      *string      `json:"arguments,omitempty"`
}

// send numbers ev and writes it.
func (r *responsesStream) send(ev respEvent) {
	ev.SequenceNumber = r.seq
	r.seq++
	r.sse.event(ev.Type, &ev)
}

var zero = new(int)

func (r *responsesStream) open(b *block) {
	b.itemID = r.itemID(b)
	r.send(respEvent{Type: "response.output_item.added", OutputIndex: &b.index, Item: itemOf(b, "in_progress")})
	switch b.kind {
	case kindReasoning:
		r.send(respEvent{Type: "response.content_part.added", ItemID: b.itemID, OutputIndex: &b.index, ContentIndex: zero,
			Part: respReasonTxt{Type: "reasoning_text"}})
	case kindText:
		r.send(respEvent{Type: "response.content_part.added", ItemID: b.itemID, OutputIndex: &b.index, ContentIndex: zero,
			Part: respOutputText{Type: "output_text", Annotations: []any{}}})
	}
}

func (r *responsesStream) piece(b *block, s string, _ []sdk.TokenLogprob) {
	switch b.kind {
	case kindReasoning:
		r.send(respEvent{Type: "response.reasoning_text.delta", ItemID: b.itemID, OutputIndex: &b.index, ContentIndex: zero, Delta: s})
	case kindText:
		r.send(respEvent{Type: "response.output_text.delta", ItemID: b.itemID, OutputIndex: &b.index, ContentIndex: zero, Delta: s})
	case kindTool:
		r.send(respEvent{Type: "response.function_call_arguments.delta", ItemID: b.itemID, OutputIndex: &b.index, Delta: s})
	}
}

func (r *responsesStream) close(b *block) {
	text := string(b.text)
	switch b.kind {
	case kindReasoning:
		r.send(respEvent{Type: "response.reasoning_text.done", ItemID: b.itemID, OutputIndex: &b.index, ContentIndex: zero, Text: &text})
		r.send(respEvent{Type: "response.content_part.done", ItemID: b.itemID, OutputIndex: &b.index, ContentIndex: zero,
			Part: respReasonTxt{Type: "reasoning_text", Text: text}})
	case kindText:
		r.send(respEvent{Type: "response.output_text.done", ItemID: b.itemID, OutputIndex: &b.index, ContentIndex: zero, Text: &text})
		r.send(respEvent{Type: "response.content_part.done", ItemID: b.itemID, OutputIndex: &b.index, ContentIndex: zero,
			Part: respOutputText{Type: "output_text", Text: text, Annotations: []any{}}})
	case kindTool:
		r.send(respEvent{Type: "response.function_call_arguments.done", ItemID: b.itemID, OutputIndex: &b.index, Name: b.name, Arguments: &text})
	}
	r.send(respEvent{Type: "response.output_item.done", OutputIndex: &b.index, Item: itemOf(b, "completed")})
	r.done = append(r.done, b)
}

func (r *responsesStream) finish(f *sdk.Finish, _ sdk.FinishReason, blocks []*block) {
	o := r.finalResponse(f, blocks)
	typ := "response.completed"
	if o.Status == "incomplete" {
		typ = "response.incomplete"
	}
	r.send(respEvent{Type: typ, Response: &o})
}

// fail ends the stream with response.failed, the terminal event clients
// wait for; no bare error event first, since the SDKs stop reading at it.
func (r *responsesStream) fail(err error) {
	o := r.object("failed")
	for _, b := range r.done {
		o.Output = append(o.Output, itemOf(b, "completed"))
	}
	o.Error = &responseError{Code: "server_error", Message: err.Error()}
	r.send(respEvent{Type: "response.failed", Response: &o})
}

func (r *responsesStream) heartbeat()      { r.sse.raw(": keep-alive\n\n") }
func (r *responsesStream) writeErr() error { return r.sse.err }

// itemID derives a block's item id from the response id and the block's
// index: unique per response without a random draw per block.
func (r *responseBase) itemID(b *block) string {
	return itemPrefix(b.kind) + strings.TrimPrefix(r.id, "resp_") + "_" + strconv.Itoa(b.index)
}

// responsesWhole writes a non-streaming Responses object.
type responsesWhole struct {
	responseBase
	w     http.ResponseWriter
	reqID string
}

func (r *responsesWhole) open(b *block)                            { b.itemID = r.itemID(b) }
func (r *responsesWhole) piece(*block, string, []sdk.TokenLogprob) {}
func (r *responsesWhole) close(*block)                             {}
func (r *responsesWhole) finish(f *sdk.Finish, _ sdk.FinishReason, blocks []*block) {
	writeJSON(r.w, http.StatusOK, r.finalResponse(f, blocks))
}
func (r *responsesWhole) fail(err error) {
	writeError(r.w, shapeOpenAI, r.reqID, backendFailure(err))
}
