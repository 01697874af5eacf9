package qwendflash

import (
	"encoding/json"
	"strings"

	"github.com/dflash/dflash_server/plugins/nativebackend"
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/chat"
	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/jsonprefix"
	"github.com/dflash/dflash_server/sdk/tokenizer"
)

// qwenChat is how requests to a Qwen family model become engine work: the
// generation prompt opens with <|im_start|>, a request thinks unless it
// says otherwise, tool calls are forced in the Qwen JSON form.
func qwenChat(f chat.Family, tok *tokenizer.Tokenizer) nativebackend.Chat {
	return nativebackend.Chat{
		Backend: Name, Family: f,
		TurnStart:      nativebackend.SpecialID(tok, "<|im_start|>"),
		ThinkOpen:      nativebackend.SpecialID(tok, "<think>"),
		ThinkByDefault: true,
		Preset:         func(thinking bool) engine.Sampling { return preset(f, thinking) },
		Force:          forcedCall,
	}
}

// preset is the family's recommended sampling, thinking or not.
func preset(f chat.Family, thinking bool) engine.Sampling {
	s := engine.Sampling{Temperature: 0.7, TopP: 0.8, TopK: 20, RepeatPenalty: 1, PenaltyLastN: -1}
	if thinking {
		s.Temperature, s.TopP = 0.6, 0.95
		if f == chat.FamilyQwen35 {
			s.Temperature = 1.0
		}
	}
	return s
}

// forcedCall is how a request whose tool_choice is "required" or names a
// function is made to call: the prompt ends with the opening of a Qwen
// tool call in its JSON form (which both Qwen families' parsers read), the
// function name written for the model where the choice (or a single tool)
// decides it, and the engine holds the rest to one JSON object. A prompt
// that opened the reasoning gets it closed first: a forced call skips
// thinking. Nil when the choice forces nothing.
func forcedCall(req *sdk.ChatRequest, thinkingOpen bool) (*nativebackend.ForcedCall, error) {
	name, named := strings.CutPrefix(string(req.ToolChoice), "function:")
	if !named && req.ToolChoice != "required" {
		return nil, nil
	}
	if len(req.Tools) == 0 {
		return nil, sdk.Invalidf("tool_choice %q needs tools", req.ToolChoice)
	}
	if !named && len(req.Tools) == 1 {
		name, named = req.Tools[0].Name, true
	}
	prefill := ""
	if thinkingOpen {
		prefill = "</think>\n\n"
	}
	prefill += "<tool_call>\n"
	f := &nativebackend.ForcedCall{ForcedCallParser: &nativebackend.ForcedCallParser{Suffix: "\n</tool_call>"}, Format: engine.FormatJSONObject}
	if named {
		quoted, err := json.Marshal(name)
		if err != nil {
			return nil, sdk.Invalidf("tool_choice: function name %q: %v", name, err)
		}
		// The model writes the arguments object, held to the function's
		// parameters where the engine can enforce their schema (any object
		// where it cannot); the parser closes the outer object and the call.
		prefill += `{"name": ` + string(quoted) + `, "arguments": `
		f.Suffix = "}" + f.Suffix
		for _, t := range req.Tools {
			if t.Name == name && len(t.Parameters) > 0 {
				if s, err := jsonprefix.CompileSchema(t.Parameters); err == nil {
					f.Format, f.Schema = engine.FormatJSONSchema, s
				}
			}
		}
	} else {
		// The model writes the whole call object: the name one of the
		// tools', the arguments an object.
		var list []string
		for _, t := range req.Tools {
			list = append(list, t.Name)
		}
		names, _ := json.Marshal(list)
		s, err := jsonprefix.CompileSchema([]byte(`{"type":"object","properties":{"name":{"enum":` + string(names) +
			`},"arguments":{"type":"object"}},"required":["name","arguments"]}`))
		if err != nil {
			return nil, sdk.Invalidf("tool_choice required: %v", err)
		}
		f.Format, f.Schema = engine.FormatJSONSchema, s
	}
	f.Prefill = prefill
	return f, nil
}
