package api

import (
	"encoding/json"
	"strings"

	"github.com/dflash/dflash_server/sdk"
)

// chatRequest is the body of POST /v1/chat/completions. Unknown fields are
// ignored, as OpenAI does.
type chatRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	TopK                *int            `json:"top_k"`
	MinP                *float64        `json:"min_p"`
	Seed                *int64          `json:"seed"`
	Stop                json.RawMessage `json:"stop"`
	FrequencyPenalty    *float64        `json:"frequency_penalty"`
	PresencePenalty     *float64        `json:"presence_penalty"`
	RepetitionPenalty   *float64        `json:"repetition_penalty"`
	N                   *int            `json:"n"`
	Logprobs            *bool           `json:"logprobs"`
	TopLogprobs         *int            `json:"top_logprobs"`
	Tools               []chatTool      `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls"`
	ResponseFormat      *chatRespFormat `json:"response_format"`
	ReasoningEffort     string          `json:"reasoning_effort"`
	ChatTemplateKwargs  map[string]any  `json:"chat_template_kwargs"`
	Stream              bool            `json:"stream"`
	StreamOptions       *chatStreamOpts `json:"stream_options"`
	IgnoreEOS           bool            `json:"ignore_eos"`
	MinTokens           *int            `json:"min_tokens"`
}

type chatStreamOpts struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatMessage struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	ReasoningContent *string         `json:"reasoning_content"`
	// Reasoning is the same under the name some clients (OpenRouter-style)
	// use.
	Reasoning  json.RawMessage `json:"reasoning"`
	ToolCalls  []chatToolCall  `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
	Name       string          `json:"name"`
}

type chatToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

type chatTool struct {
	Type     string `json:"type"`
	Function struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
}

type chatRespFormat struct {
	Type       string `json:"type"`
	JSONSchema *struct {
		Name   string          `json:"name"`
		Schema json.RawMessage `json:"schema"`
	} `json:"json_schema"`
}

// chatOptions are the parts of a chat request that shape the response, not
// the generation.
type chatOptions struct {
	stream       bool
	includeUsage bool
}

// decodeChat parses and validates a Chat Completions body.
func decodeChat(b []byte, lim limits) (*sdk.ChatRequest, chatOptions, *apiError) {
	var in chatRequest
	if err := decodeJSON(b, lim, &in); err != nil {
		return nil, chatOptions{}, err
	}
	opts := chatOptions{stream: in.Stream, includeUsage: in.Stream && in.StreamOptions != nil && in.StreamOptions.IncludeUsage}
	req := &sdk.ChatRequest{
		Model:             in.Model,
		ParallelToolCalls: in.ParallelToolCalls,
		IgnoreEOS:         in.IgnoreEOS,
		Sampling: sdk.Sampling{
			Temperature: in.Temperature, TopP: in.TopP, TopK: in.TopK, MinP: in.MinP, Seed: in.Seed,
			FrequencyPenalty: in.FrequencyPenalty, PresencePenalty: in.PresencePenalty,
			RepetitionPenalty: in.RepetitionPenalty,
		},
	}
	if len(in.Messages) == 0 {
		return nil, opts, missingParam("messages")
	}
	if len(in.Messages) > lim.maxMessages {
		return nil, opts, badRequest("messages", "at most %d messages are allowed, got %d", lim.maxMessages, len(in.Messages))
	}
	for i := range in.Messages {
		m, err := chatMessageToNeutral(&in.Messages[i], index("messages", i))
		if err != nil {
			return nil, opts, err
		}
		req.Messages = append(req.Messages, m)
	}
	// max_completion_tokens replaced max_tokens in OpenAI's API; prefer it.
	switch {
	case in.MaxCompletionTokens != nil:
		if *in.MaxCompletionTokens < 1 {
			return nil, opts, badRequest("max_completion_tokens", "max_completion_tokens must be at least 1, got %d", *in.MaxCompletionTokens)
		}
		req.MaxTokens = *in.MaxCompletionTokens
	case in.MaxTokens != nil:
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
	stop, err := stringOrStrings(in.Stop, "stop")
	if err != nil {
		return nil, opts, err
	}
	req.Stop = stop
	if in.Logprobs != nil {
		req.Logprobs = *in.Logprobs
	}
	if in.TopLogprobs != nil {
		if !req.Logprobs && *in.TopLogprobs > 0 {
			return nil, opts, badRequest("top_logprobs", "top_logprobs needs logprobs set to true")
		}
		req.TopLogprobs = *in.TopLogprobs
	}
	for i, t := range in.Tools {
		field := index("tools", i)
		if t.Type != "" && t.Type != "function" {
			return nil, opts, unsupported(field+".type", "%s.type: only function tools are supported, got %q", field, t.Type)
		}
		if t.Function.Name == "" {
			return nil, opts, missingParam(field + ".function.name")
		}
		req.Tools = append(req.Tools, sdk.Tool{Name: t.Function.Name, Description: t.Function.Description, Parameters: nullToNil(t.Function.Parameters)})
	}
	tc, err := chatToolChoice(in.ToolChoice, req.Tools)
	if err != nil {
		return nil, opts, err
	}
	req.ToolChoice = tc
	if rf := in.ResponseFormat; rf != nil {
		switch rf.Type {
		case "", "text":
		case "json_object":
			req.ResponseFormat = "json_object"
		case "json_schema":
			req.ResponseFormat = "json_schema"
			if rf.JSONSchema == nil || len(nullToNil(rf.JSONSchema.Schema)) == 0 {
				return nil, opts, missingParam("response_format.json_schema.schema")
			}
			req.JSONSchema = rf.JSONSchema.Schema
		default:
			return nil, opts, badRequest("response_format.type", "response_format.type must be text, json_object or json_schema, got %q", rf.Type)
		}
	}
	if err := reasoningEffort(&req.Reasoning, in.ReasoningEffort, "reasoning_effort"); err != nil {
		return nil, opts, err
	}
	if err := templateKwargs(req, in.ChatTemplateKwargs); err != nil {
		return nil, opts, err
	}
	if err := checkCommon(req, "max_tokens", lim); err != nil {
		return nil, opts, err
	}
	return req, opts, nil
}

func nullToNil(r json.RawMessage) json.RawMessage {
	if rawKind(r) == 'n' {
		return nil
	}
	return r
}

// templateKwargs passes chat_template_kwargs to the template; its
// enable_thinking, which templates read as the thinking switch, also sets
// the neutral reasoning control.
func templateKwargs(req *sdk.ChatRequest, kw map[string]any) *apiError {
	if len(kw) == 0 {
		return nil
	}
	req.TemplateKwargs = kw
	if v, ok := kw["enable_thinking"]; ok {
		on, isBool := v.(bool)
		if !isBool {
			return badRequest("chat_template_kwargs.enable_thinking", "chat_template_kwargs.enable_thinking must be a boolean")
		}
		req.Reasoning.Enabled = &on
	}
	return nil
}

// reasoningEffort maps OpenAI's effort words onto the neutral controls.
func reasoningEffort(r *sdk.Reasoning, effort, field string) *apiError {
	switch strings.ToLower(effort) {
	case "":
	case "none":
		off := false
		r.Enabled = &off
	case "minimal", "low":
		r.Effort = "low"
	case "medium":
		r.Effort = "medium"
	case "high", "xhigh":
		r.Effort = "high"
	default:
		return badRequest(field, "%s must be one of none, minimal, low, medium, high; got %q", field, effort)
	}
	return nil
}

func chatMessageToNeutral(m *chatMessage, field string) (sdk.Message, *apiError) {
	out := sdk.Message{Role: m.Role, Name: m.Name, ToolCallID: m.ToolCallID}
	switch m.Role {
	case "system", "user", "assistant", "tool":
	case "developer":
		// OpenAI's newer name for the system role.
		out.Role = "system"
	case "":
		return out, missingParam(field + ".role")
	default:
		return out, badRequest(field+".role", "%s.role must be system, developer, user, assistant or tool, got %q", field, m.Role)
	}
	text, err := chatContent(m.Content, field+".content")
	if err != nil {
		return out, err
	}
	out.Content = text
	if m.ReasoningContent != nil {
		out.ReasoningContent = *m.ReasoningContent
	} else if rawKind(m.Reasoning) == 's' {
		_ = json.Unmarshal(m.Reasoning, &out.ReasoningContent)
	}
	if len(m.ToolCalls) > 0 && out.Role != "assistant" {
		return out, badRequest(field+".tool_calls", "%s.tool_calls is only allowed on assistant messages", field)
	}
	for j, c := range m.ToolCalls {
		cf := index(field+".tool_calls", j)
		if c.Type != "" && c.Type != "function" {
			return out, unsupported(cf+".type", "%s.type must be function, got %q", cf, c.Type)
		}
		if c.Function.Name == "" {
			return out, missingParam(cf + ".function.name")
		}
		args, err := argumentsString(c.Function.Arguments, cf+".function.arguments")
		if err != nil {
			return out, err
		}
		out.ToolCalls = append(out.ToolCalls, sdk.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: args})
	}
	return out, nil
}

// chatContent flattens a message's content (a string, null, or an array of
// parts) to text. Only text parts are supported: the engine has no vision.
func chatContent(r json.RawMessage, field string) (string, *apiError) {
	switch rawKind(r) {
	case 0, 'n':
		return "", nil
	case 's':
		return rawString(r, field)
	case 'a':
		var parts []struct {
			Type    string  `json:"type"`
			Text    *string `json:"text"`
			Refusal *string `json:"refusal"`
		}
		if err := json.Unmarshal(r, &parts); err != nil {
			return "", badRequest(field, "%s: expected an array of content parts", field)
		}
		var sb strings.Builder
		for i, p := range parts {
			pf := index(field, i)
			switch p.Type {
			case "text", "input_text", "output_text":
				if p.Text == nil {
					return "", missingParam(pf + ".text")
				}
				sb.WriteString(*p.Text)
			case "refusal":
				if p.Refusal != nil {
					sb.WriteString(*p.Refusal)
				}
			case "":
				return "", missingParam(pf + ".type")
			default:
				return "", unsupported(pf+".type", "%s: content parts of type %q are not supported (text only)", pf, p.Type)
			}
		}
		return sb.String(), nil
	}
	return "", badRequest(field, "%s: expected a string or an array of content parts, got %s", field, kindName(rawKind(r)))
}

// chatToolChoice decodes "none" | "auto" | "required" |
// {"type":"function","function":{"name":…}}.
func chatToolChoice(r json.RawMessage, tools []sdk.Tool) (sdk.ToolChoice, *apiError) {
	switch rawKind(r) {
	case 0, 'n':
		return "", nil
	case 's':
		return toolChoiceMode(r)
	case 'o':
		var o struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if err := json.Unmarshal(r, &o); err != nil {
			return "", badRequest("tool_choice", "tool_choice: %v", err)
		}
		if o.Type != "function" {
			return "", unsupported("tool_choice.type", "tool_choice.type must be function, got %q", o.Type)
		}
		return namedToolChoice(o.Function.Name, "tool_choice.function.name", tools)
	}
	return "", badRequest("tool_choice", "tool_choice must be a string or an object, got %s", kindName(rawKind(r)))
}

// toolChoiceMode decodes the string forms of tool_choice, which Chat
// Completions and Responses share.
func toolChoiceMode(r json.RawMessage) (sdk.ToolChoice, *apiError) {
	var s string
	_ = json.Unmarshal(r, &s)
	switch s {
	case "none", "auto", "required":
		return sdk.ToolChoice(s), nil
	}
	return "", badRequest("tool_choice", "tool_choice must be none, auto, required or a function object, got %q", s)
}

func namedToolChoice(name, field string, tools []sdk.Tool) (sdk.ToolChoice, *apiError) {
	if name == "" {
		return "", missingParam(field)
	}
	for _, t := range tools {
		if t.Name == name {
			return sdk.ToolChoice("function:" + name), nil
		}
	}
	return "", badRequest(field, "%s: no tool named %q in tools", field, name)
}
