package api

import (
	"encoding/json"
	"strings"

	"github.com/dflash/dflash_server/sdk"
)

// messagesRequest is the body of POST /v1/messages and
// /v1/messages/count_tokens.
type messagesRequest struct {
	Model         string             `json:"model"`
	Messages      []anthropicMessage `json:"messages"`
	System        json.RawMessage    `json:"system"`
	MaxTokens     *int               `json:"max_tokens"`
	StopSequences []string           `json:"stop_sequences"`
	Temperature   *float64           `json:"temperature"`
	TopP          *float64           `json:"top_p"`
	TopK          *int               `json:"top_k"`
	Tools         []anthropicTool    `json:"tools"`
	ToolChoice    *struct {
		Type                   string `json:"type"`
		Name                   string `json:"name"`
		DisableParallelToolUse bool   `json:"disable_parallel_tool_use"`
	} `json:"tool_choice"`
	Thinking *struct {
		Type         string `json:"type"`
		BudgetTokens *int   `json:"budget_tokens"`
	} `json:"thinking"`
	// OutputFormat is Anthropic's structured outputs (beta header
	// structured-outputs-2025-11-13); OutputConfig.Format is its later
	// place. Both take {"type":"json_schema","schema":{…}}.
	OutputFormat *anthropicOutputFormat `json:"output_format"`
	OutputConfig *struct {
		Format *anthropicOutputFormat `json:"format"`
	} `json:"output_config"`
	Stream    bool `json:"stream"`
	IgnoreEOS bool `json:"ignore_eos"`
	MinTokens *int `json:"min_tokens"`
}

type anthropicOutputFormat struct {
	Type   string          `json:"type"`
	Schema json.RawMessage `json:"schema"`
}

type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type anthropicTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// anthropicBlock is any content block; fields unused by a type stay empty.
type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
	Thinking  *string         `json:"thinking"`
}

// decodeMessages parses and validates an Anthropic Messages body. countOnly
// is the count_tokens variant, where max_tokens is not required.
func decodeMessages(b []byte, lim limits, countOnly bool) (*sdk.ChatRequest, bool, *apiError) {
	var in messagesRequest
	if err := decodeJSON(b, lim, &in); err != nil {
		return nil, false, err
	}
	req := &sdk.ChatRequest{
		Model:     in.Model,
		IgnoreEOS: in.IgnoreEOS,
		Stop:      in.StopSequences,
		Sampling:  sdk.Sampling{Temperature: in.Temperature, TopP: in.TopP, TopK: in.TopK},
	}
	if in.MaxTokens == nil && !countOnly {
		return nil, false, missingParam("max_tokens")
	}
	if in.MaxTokens != nil {
		if *in.MaxTokens < 1 {
			return nil, false, badRequest("max_tokens", "max_tokens must be at least 1, got %d", *in.MaxTokens)
		}
		req.MaxTokens = *in.MaxTokens
	}
	if in.MinTokens != nil {
		req.MinTokens = *in.MinTokens
	}
	if len(in.Messages) == 0 {
		return nil, false, missingParam("messages")
	}
	if len(in.Messages) > lim.maxMessages {
		return nil, false, badRequest("messages", "at most %d messages are allowed, got %d", lim.maxMessages, len(in.Messages))
	}
	system, err := anthropicSystem(in.System)
	if err != nil {
		return nil, false, err
	}
	if system != "" {
		req.Messages = append(req.Messages, sdk.Message{Role: "system", Content: system})
	}
	for i := range in.Messages {
		msgs, err := anthropicMessageToNeutral(&in.Messages[i], index("messages", i))
		if err != nil {
			return nil, false, err
		}
		req.Messages = append(req.Messages, msgs...)
	}
	for i, t := range in.Tools {
		field := index("tools", i)
		if t.Type != "" && t.Type != "custom" {
			return nil, false, unsupported(field+".type", "%s.type: server tools are not supported, got %q", field, t.Type)
		}
		if t.Name == "" {
			return nil, false, missingParam(field + ".name")
		}
		req.Tools = append(req.Tools, sdk.Tool{Name: t.Name, Description: t.Description, Parameters: nullToNil(t.InputSchema)})
	}
	if tc := in.ToolChoice; tc != nil {
		switch tc.Type {
		case "auto", "":
			req.ToolChoice = "auto"
		case "any":
			req.ToolChoice = "required"
		case "none":
			req.ToolChoice = "none"
		case "tool":
			c, err := namedToolChoice(tc.Name, "tool_choice.name", req.Tools)
			if err != nil {
				return nil, false, err
			}
			req.ToolChoice = c
		default:
			return nil, false, badRequest("tool_choice.type", "tool_choice.type must be auto, any, tool or none, got %q", tc.Type)
		}
		if tc.DisableParallelToolUse {
			no := false
			req.ParallelToolCalls = &no
		}
	}
	of, field := in.OutputFormat, "output_format"
	if in.OutputConfig != nil && in.OutputConfig.Format != nil {
		if of != nil {
			return nil, false, badRequest("output_config.format", "output_format and output_config.format are the same setting; send one")
		}
		of, field = in.OutputConfig.Format, "output_config.format"
	}
	if of != nil {
		if of.Type != "json_schema" {
			return nil, false, badRequest(field+".type", "%s.type must be json_schema, got %q", field, of.Type)
		}
		if len(nullToNil(of.Schema)) == 0 {
			return nil, false, missingParam(field + ".schema")
		}
		req.ResponseFormat, req.JSONSchema = "json_schema", of.Schema
	}
	if th := in.Thinking; th != nil {
		switch th.Type {
		case "enabled":
			on := true
			req.Reasoning.Enabled = &on
			if th.BudgetTokens != nil {
				if *th.BudgetTokens < 1 || (req.MaxTokens > 0 && *th.BudgetTokens >= req.MaxTokens) {
					return nil, false, badRequest("thinking.budget_tokens", "thinking.budget_tokens must be at least 1 and below max_tokens (%d), got %d", req.MaxTokens, *th.BudgetTokens)
				}
				req.Reasoning.BudgetTokens = *th.BudgetTokens
			}
		case "adaptive":
			on := true
			req.Reasoning.Enabled = &on
		case "disabled":
			off := false
			req.Reasoning.Enabled = &off
		default:
			return nil, false, badRequest("thinking.type", "thinking.type must be enabled, adaptive or disabled, got %q", th.Type)
		}
	}
	if err := checkCommon(req, "max_tokens", lim); err != nil {
		if err.param == "stop" {
			err.param = "stop_sequences"
			err.message = strings.Replace(err.message, "stop", "stop_sequences", 1)
		}
		return nil, false, err
	}
	return req, in.Stream, nil
}

// anthropicSystem flattens the top-level system prompt (a string or an
// array of text blocks).
func anthropicSystem(r json.RawMessage) (string, *apiError) {
	switch rawKind(r) {
	case 0, 'n':
		return "", nil
	case 's':
		return rawString(r, "system")
	case 'a':
		blocks, err := anthropicBlocks(r, "system")
		if err != nil {
			return "", err
		}
		var parts []string
		for i, b := range blocks {
			if b.Type != "text" || b.Text == nil {
				return "", badRequest(index("system", i), "%s: system blocks must be text blocks", index("system", i))
			}
			parts = append(parts, *b.Text)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", badRequest("system", "system must be a string or an array of text blocks, got %s", kindName(rawKind(r)))
}

func anthropicBlocks(r json.RawMessage, field string) ([]anthropicBlock, *apiError) {
	var blocks []anthropicBlock
	if err := json.Unmarshal(r, &blocks); err != nil {
		if e := jsonError(err); e.param != "" {
			e.param = field + "." + e.param
			e.message = field + "." + e.message
			return nil, e
		}
		return nil, badRequest(field, "%s: expected an array of content blocks", field)
	}
	return blocks, nil
}

// anthropicMessageToNeutral turns one Anthropic turn into neutral messages:
// an assistant turn stays one message (thinking, text and tool calls), a user
// turn splits into "tool" messages for its tool_result blocks and user
// messages for its text, in order.
func anthropicMessageToNeutral(m *anthropicMessage, field string) ([]sdk.Message, *apiError) {
	switch m.Role {
	case "user", "assistant":
	case "":
		return nil, missingParam(field + ".role")
	default:
		return nil, badRequest(field+".role", "%s.role must be user or assistant, got %q", field, m.Role)
	}
	cf := field + ".content"
	switch rawKind(m.Content) {
	case 's':
		s, err := rawString(m.Content, cf)
		if err != nil {
			return nil, err
		}
		return []sdk.Message{{Role: m.Role, Content: s}}, nil
	case 'a':
	case 0:
		return nil, missingParam(cf)
	default:
		return nil, badRequest(cf, "%s must be a string or an array of content blocks, got %s", cf, kindName(rawKind(m.Content)))
	}
	blocks, err := anthropicBlocks(m.Content, cf)
	if err != nil {
		return nil, err
	}
	if m.Role == "assistant" {
		out := sdk.Message{Role: "assistant"}
		var text, thinking strings.Builder
		for i, b := range blocks {
			bf := index(cf, i)
			switch b.Type {
			case "text":
				if b.Text == nil {
					return nil, missingParam(bf + ".text")
				}
				text.WriteString(*b.Text)
			case "thinking":
				if b.Thinking != nil {
					thinking.WriteString(*b.Thinking)
				}
			case "redacted_thinking":
				// Opaque to a local server; the model never saw it.
			case "tool_use":
				if b.Name == "" {
					return nil, missingParam(bf + ".name")
				}
				args, err := toolInput(b.Input, bf+".input")
				if err != nil {
					return nil, err
				}
				out.ToolCalls = append(out.ToolCalls, sdk.ToolCall{ID: b.ID, Name: b.Name, Arguments: args})
			default:
				return nil, unsupportedBlock(bf, b.Type)
			}
		}
		out.Content, out.ReasoningContent = text.String(), thinking.String()
		return []sdk.Message{out}, nil
	}
	var out []sdk.Message
	var text strings.Builder
	pending := false
	flush := func() {
		if pending {
			out = append(out, sdk.Message{Role: "user", Content: text.String()})
			text.Reset()
			pending = false
		}
	}
	for i, b := range blocks {
		bf := index(cf, i)
		switch b.Type {
		case "text":
			if b.Text == nil {
				return nil, missingParam(bf + ".text")
			}
			text.WriteString(*b.Text)
			pending = true
		case "tool_result":
			flush()
			if b.ToolUseID == "" {
				return nil, missingParam(bf + ".tool_use_id")
			}
			content, err := toolResultContent(b.Content, bf+".content")
			if err != nil {
				return nil, err
			}
			if b.IsError && content == "" {
				content = "error"
			}
			out = append(out, sdk.Message{Role: "tool", ToolCallID: b.ToolUseID, Content: content})
		default:
			return nil, unsupportedBlock(bf, b.Type)
		}
	}
	flush()
	if len(out) == 0 {
		out = append(out, sdk.Message{Role: "user"})
	}
	return out, nil
}

func unsupportedBlock(field, typ string) *apiError {
	if typ == "" {
		return missingParam(field + ".type")
	}
	return unsupported(field+".type", "%s: content blocks of type %q are not supported", field, typ)
}

// toolInput re-encodes a tool_use input object as the JSON arguments text.
func toolInput(r json.RawMessage, field string) (string, *apiError) {
	switch rawKind(r) {
	case 0, 'n':
		return "{}", nil
	case 'o':
		return compactObject(r, field)
	}
	return "", badRequest(field, "%s must be an object, got %s", field, kindName(rawKind(r)))
}

// toolResultContent flattens a tool_result's content: a string or an array
// of text blocks.
func toolResultContent(r json.RawMessage, field string) (string, *apiError) {
	switch rawKind(r) {
	case 0, 'n':
		return "", nil
	case 's':
		return rawString(r, field)
	case 'a':
		blocks, err := anthropicBlocks(r, field)
		if err != nil {
			return "", err
		}
		var sb strings.Builder
		for i, b := range blocks {
			if b.Type != "text" || b.Text == nil {
				return "", unsupported(index(field, i)+".type", "%s: only text blocks are supported in tool results", index(field, i))
			}
			sb.WriteString(*b.Text)
		}
		return sb.String(), nil
	}
	return "", badRequest(field, "%s must be a string or an array of text blocks, got %s", field, kindName(rawKind(r)))
}
