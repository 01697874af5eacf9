package api

import (
	"encoding/json"
	"strings"

	"github.com/dflash/dflash_server/sdk"
)

// responsesRequest is the body of POST /v1/responses.
type responsesRequest struct {
	Model             string          `json:"model"`
	Input             json.RawMessage `json:"input"`
	Instructions      *string         `json:"instructions"`
	MaxOutputTokens   *int            `json:"max_output_tokens"`
	Temperature       *float64        `json:"temperature"`
	TopP              *float64        `json:"top_p"`
	TopK              *int            `json:"top_k"`
	MinP              *float64        `json:"min_p"`
	Seed              *int64          `json:"seed"`
	Stop              json.RawMessage `json:"stop"`
	Tools             []responsesTool `json:"tools"`
	ToolChoice        json.RawMessage `json:"tool_choice"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls"`
	Reasoning         *struct {
		Effort string `json:"effort"`
	} `json:"reasoning"`
	Text *struct {
		Format *struct {
			Type   string          `json:"type"`
			Schema json.RawMessage `json:"schema"`
		} `json:"format"`
	} `json:"text"`
	Stream             bool            `json:"stream"`
	Store              *bool           `json:"store"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Conversation       json.RawMessage `json:"conversation"`
	Background         bool            `json:"background"`
	ChatTemplateKwargs map[string]any  `json:"chat_template_kwargs"`
	IgnoreEOS          bool            `json:"ignore_eos"`
	MinTokens          *int            `json:"min_tokens"`
}

type responsesTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// responsesItem is any input item; fields unused by a type stay empty.
type responsesItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
	Output    json.RawMessage `json:"output"`
	Summary   []struct {
		Text string `json:"text"`
	} `json:"summary"`
}

// responsesEcho is what a Responses object repeats of its request.
type responsesEcho struct {
	instructions      *string
	maxOutputTokens   *int
	temperature       *float64
	topP              *float64
	tools             []responsesTool
	toolChoice        json.RawMessage
	parallelToolCalls bool
	effort            string
}

func decodeResponses(b []byte, lim limits) (*sdk.ChatRequest, bool, responsesEcho, *apiError) {
	var in responsesRequest
	var echo responsesEcho
	if err := decodeJSON(b, lim, &in); err != nil {
		return nil, false, echo, err
	}
	// These need server-side state that dflash_server does not keep; a clear
	// refusal beats silently answering without the earlier turns.
	if in.PreviousResponseID != nil && *in.PreviousResponseID != "" {
		return nil, false, echo, unsupported("previous_response_id", "previous_response_id is not supported: dflash_server does not store responses; send the whole conversation in input")
	}
	if in.Store != nil && *in.Store {
		return nil, false, echo, unsupported("store", "store: true is not supported: dflash_server does not store responses; omit store or set it to false")
	}
	if k := rawKind(in.Conversation); k != 0 && k != 'n' {
		return nil, false, echo, unsupported("conversation", "conversation is not supported: dflash_server does not store conversations")
	}
	if in.Background {
		return nil, false, echo, unsupported("background", "background: true is not supported")
	}
	req := &sdk.ChatRequest{
		Model:             in.Model,
		ParallelToolCalls: in.ParallelToolCalls,
		IgnoreEOS:         in.IgnoreEOS,
		Sampling:          sdk.Sampling{Temperature: in.Temperature, TopP: in.TopP, TopK: in.TopK, MinP: in.MinP, Seed: in.Seed},
	}
	echo = responsesEcho{instructions: in.Instructions, maxOutputTokens: in.MaxOutputTokens, temperature: in.Temperature,
		topP: in.TopP, tools: in.Tools, toolChoice: in.ToolChoice, parallelToolCalls: in.ParallelToolCalls == nil || *in.ParallelToolCalls}
	if in.MaxOutputTokens != nil {
		if *in.MaxOutputTokens < 1 {
			return nil, false, echo, badRequest("max_output_tokens", "max_output_tokens must be at least 1, got %d", *in.MaxOutputTokens)
		}
		req.MaxTokens = *in.MaxOutputTokens
	}
	if in.MinTokens != nil {
		req.MinTokens = *in.MinTokens
	}
	if in.Instructions != nil && *in.Instructions != "" {
		req.Messages = append(req.Messages, sdk.Message{Role: "system", Content: *in.Instructions})
	}
	msgs, err := responsesInput(in.Input, lim)
	if err != nil {
		return nil, false, echo, err
	}
	req.Messages = append(req.Messages, msgs...)
	stop, err := stringOrStrings(in.Stop, "stop")
	if err != nil {
		return nil, false, echo, err
	}
	req.Stop = stop
	for i, t := range in.Tools {
		field := index("tools", i)
		if t.Type != "function" {
			return nil, false, echo, unsupported(field+".type", "%s.type: only function tools are supported, got %q", field, t.Type)
		}
		if t.Name == "" {
			return nil, false, echo, missingParam(field + ".name")
		}
		req.Tools = append(req.Tools, sdk.Tool{Name: t.Name, Description: t.Description, Parameters: nullToNil(t.Parameters)})
	}
	tc, err := responsesToolChoice(in.ToolChoice, req.Tools)
	if err != nil {
		return nil, false, echo, err
	}
	req.ToolChoice = tc
	if in.Reasoning != nil {
		if err := reasoningEffort(&req.Reasoning, in.Reasoning.Effort, "reasoning.effort"); err != nil {
			return nil, false, echo, err
		}
		echo.effort = in.Reasoning.Effort
	}
	if in.Text != nil && in.Text.Format != nil {
		switch f := in.Text.Format; f.Type {
		case "", "text":
		case "json_object":
			req.ResponseFormat = "json_object"
		case "json_schema":
			if len(nullToNil(f.Schema)) == 0 {
				return nil, false, echo, missingParam("text.format.schema")
			}
			req.ResponseFormat, req.JSONSchema = "json_schema", f.Schema
		default:
			return nil, false, echo, badRequest("text.format.type", "text.format.type must be text, json_object or json_schema, got %q", f.Type)
		}
	}
	if err := templateKwargs(req, in.ChatTemplateKwargs); err != nil {
		return nil, false, echo, err
	}
	if err := checkCommon(req, "max_output_tokens", lim); err != nil {
		if err.param == "messages" {
			err.param = "input"
			err.message = strings.Replace(err.message, "messages", "input items", 1)
		}
		return nil, false, echo, err
	}
	return req, in.Stream, echo, nil
}

// responsesInput turns input (a string or a list of items) into messages.
// Consecutive function calls and reasoning items join the assistant turn
// they belong to, as a chat template expects.
func responsesInput(r json.RawMessage, lim limits) ([]sdk.Message, *apiError) {
	switch rawKind(r) {
	case 's':
		s, err := rawString(r, "input")
		if err != nil {
			return nil, err
		}
		return []sdk.Message{{Role: "user", Content: s}}, nil
	case 'a':
	case 0, 'n':
		return nil, missingParam("input")
	default:
		return nil, badRequest("input", "input must be a string or an array of items, got %s", kindName(rawKind(r)))
	}
	var items []responsesItem
	if err := json.Unmarshal(r, &items); err != nil {
		if e := jsonError(err); e.param != "" {
			e.param, e.message = "input."+e.param, "input."+e.message
			return nil, e
		}
		return nil, badRequest("input", "input: expected an array of items")
	}
	if len(items) == 0 {
		return nil, badRequest("input", "input must not be empty")
	}
	if len(items) > lim.maxMessages {
		return nil, badRequest("input", "at most %d input items are allowed, got %d", lim.maxMessages, len(items))
	}
	var out []sdk.Message
	// assistant returns the open assistant turn, starting one if the last
	// message is not an assistant turn.
	assistant := func() *sdk.Message {
		if n := len(out); n > 0 && out[n-1].Role == "assistant" {
			return &out[n-1]
		}
		out = append(out, sdk.Message{Role: "assistant"})
		return &out[len(out)-1]
	}
	for i, it := range items {
		f := index("input", i)
		typ := it.Type
		if typ == "" && it.Role != "" {
			typ = "message"
		}
		switch typ {
		case "message":
			role := it.Role
			switch role {
			case "user", "system", "assistant":
			case "developer":
				role = "system"
			case "":
				return nil, missingParam(f + ".role")
			default:
				return nil, badRequest(f+".role", "%s.role must be user, assistant, system or developer, got %q", f, it.Role)
			}
			text, err := chatContent(it.Content, f+".content")
			if err != nil {
				return nil, err
			}
			if role == "assistant" {
				m := assistant()
				m.Content += text
				continue
			}
			out = append(out, sdk.Message{Role: role, Content: text})
		case "function_call":
			if it.Name == "" {
				return nil, missingParam(f + ".name")
			}
			args, err := argumentsString(it.Arguments, f+".arguments")
			if err != nil {
				return nil, err
			}
			m := assistant()
			m.ToolCalls = append(m.ToolCalls, sdk.ToolCall{ID: it.CallID, Name: it.Name, Arguments: args})
		case "function_call_output":
			if it.CallID == "" {
				return nil, missingParam(f + ".call_id")
			}
			text, err := chatContent(it.Output, f+".output")
			if err != nil {
				return nil, err
			}
			out = append(out, sdk.Message{Role: "tool", ToolCallID: it.CallID, Content: text})
		case "reasoning":
			var sb strings.Builder
			for _, s := range it.Summary {
				sb.WriteString(s.Text)
			}
			if k := rawKind(it.Content); k == 'a' {
				var parts []struct {
					Text string `json:"text"`
				}
				if err := json.Unmarshal(it.Content, &parts); err != nil {
					return nil, badRequest(f+".content", "%s.content: expected an array of reasoning_text parts", f)
				}
				for _, p := range parts {
					sb.WriteString(p.Text)
				}
			}
			m := assistant()
			m.ReasoningContent += sb.String()
		case "item_reference":
			return nil, unsupported(f+".type", "%s: item_reference is not supported: dflash_server does not store items", f)
		case "":
			return nil, missingParam(f + ".type")
		default:
			return nil, unsupported(f+".type", "%s: input items of type %q are not supported", f, it.Type)
		}
	}
	return out, nil
}

// responsesToolChoice decodes "none" | "auto" | "required" |
// {"type":"function","name":…}.
func responsesToolChoice(r json.RawMessage, tools []sdk.Tool) (sdk.ToolChoice, *apiError) {
	switch rawKind(r) {
	case 0, 'n':
		return "", nil
	case 's':
		return toolChoiceMode(r)
	case 'o':
		var o struct {
			Type string `json:"type"`
			Name string `json:"name"`
		}
		if err := json.Unmarshal(r, &o); err != nil {
			return "", badRequest("tool_choice", "tool_choice: %v", err)
		}
		if o.Type != "function" {
			return "", unsupported("tool_choice.type", "tool_choice.type must be function, got %q", o.Type)
		}
		return namedToolChoice(o.Name, "tool_choice.name", tools)
	}
	return "", badRequest("tool_choice", "tool_choice must be a string or an object, got %s", kindName(rawKind(r)))
}
