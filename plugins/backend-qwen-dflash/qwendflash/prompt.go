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

// renderOptions are the template variables of a request.
func (m *model) renderOptions(req *sdk.ChatRequest) chat.RenderOptions {
	o := chat.RenderOptions{
		AddGenerationPrompt: true, EnableThinking: req.Reasoning.Enabled, Extra: req.TemplateKwargs,
		BOSToken: m.bos, EOSToken: m.eos,
	}
	if req.ToolChoice != "none" {
		o.Tools = req.Tools
	}
	return o
}

// Render turns a request into prompt text with the model's template.
func (m *model) Render(req *sdk.ChatRequest) (string, error) {
	if req.Prompt != nil {
		ids, err := m.rawPrompt(req.Prompt)
		if err != nil {
			return "", err
		}
		return m.Tok.Decode(ids), nil
	}
	if len(req.Messages) == 0 {
		return "", sdk.Invalidf("messages must not be empty")
	}
	s, err := m.Tmpl.Render(req.Messages, m.renderOptions(req))
	if err != nil {
		return "", sdk.Invalidf("%v", err)
	}
	return s, nil
}

// Prepare renders, tokenizes and applies the model's defaults; an error is
// the request's fault and is answered as invalid.
func (m *model) Prepare(req *sdk.ChatRequest) (*engine.Request, error) {
	if req.Prompt != nil {
		return m.prepareRaw(req)
	}
	format, schema, err := nativebackend.ResponseFormat(Name, req)
	if err != nil {
		return nil, err
	}
	prompt, err := m.Render(req)
	if err != nil {
		return nil, err
	}
	open := chat.ThinkingOpen(prompt)
	tools := len(req.Tools) > 0 && req.ToolChoice != "none"
	parser := chat.NewParser(m.family, chat.ParserOptions{ThinkingOpen: open, Tools: tools, ToolSchemas: req.Tools})
	var outParser engine.Parser = nativebackend.OutputParser{P: parser}
	forced, err := forcedCall(req, open)
	if err != nil {
		return nil, err
	}
	if forced != nil {
		if format != engine.FormatText {
			return nil, sdk.Invalidf("response_format cannot be combined with tool_choice %q: the reply is a tool call", req.ToolChoice)
		}
		prompt += forced.Prefill
		forced.P = parser
		outParser = forced
		format, schema = forced.format, forced.schema
	}
	ids := m.Tok.Encode(prompt, true, true)

	maxTok := nativebackend.MaxTokens(req, m.Desc)

	thinking := req.Reasoning.Enabled == nil || *req.Reasoning.Enabled
	if v, ok := req.TemplateKwargs["enable_thinking"].(bool); ok && req.Reasoning.Enabled == nil {
		thinking = v
	}
	s, err := m.sampling(req.Sampling, thinking)
	if err != nil {
		return nil, err
	}
	er := &engine.Request{
		ID: req.ID, Prompt: ids, MaxTokens: maxTok, MinTokens: req.MinTokens, IgnoreEOS: req.IgnoreEOS,
		Sampling: s, Stop: req.Stop, Logprobs: req.Logprobs, TopLogprobs: req.TopLogprobs,
		SnapshotAt:           generationStart(ids, m.imStart),
		ReasoningBudget:      nativebackend.ReasoningBudget(m.Cfg, req),
		HardLimitReplyBudget: m.Cfg.HardLimitReplyBudget,
		CloseReasoning:       m.Tok.Encode(parser.ReasoningCloseTag(), false, true),
		Detokenizer:          tokenizer.NewStreamDecoder(m.Tok),
		Parser:               outParser,
		Format:               format,
		Schema:               schema,
	}
	// A thinking model opens its reasoning itself unless the prompt did;
	// the JSON constraint then starts after the reasoning.
	if format != engine.FormatText && forced == nil && thinking && !open && m.thinkOpen >= 0 {
		er.OpenReasoning = []int32{m.thinkOpen}
	}
	if req.TopLogprobs > 0 {
		er.Logprobs = true
	}
	return er, nil
}

// sampling applies the family's recommended preset (thinking or not) to the
// settings the request leaves unset.
func (m *model) sampling(s sdk.Sampling, thinking bool) (engine.Sampling, error) {
	preset := engine.Sampling{Temperature: 0.7, TopP: 0.8, TopK: 20, RepeatPenalty: 1, PenaltyLastN: -1}
	if thinking {
		preset.Temperature, preset.TopP = 0.6, 0.95
		if m.family == chat.FamilyQwen35 {
			preset.Temperature = 1.0
		}
	}
	return nativebackend.Sampling(s, preset)
}

// generationStart is where the generation prompt (the last
// "<|im_start|>assistant" header) begins: the next turn of the conversation
// renders everything before it the same way, so a model with recurrent
// state snapshots there for the prefix cache. 0 when there is none.
func generationStart(ids []int32, imStart int32) int {
	if imStart < 0 {
		return 0
	}
	for i := len(ids) - 1; i > 0; i-- {
		if ids[i] == imStart {
			return i
		}
	}
	return 0
}

// rawPrompt is a text completion's prompt in tokens: text is tokenized with
// special tokens recognised (as llama.cpp's /completion does), so a client
// can write a chat turn by hand; ids are checked against the vocabulary.
func (m *model) rawPrompt(p *sdk.RawPrompt) ([]int32, error) {
	if p.Suffix != "" {
		return nil, sdk.Invalidf("suffix: model %s has no fill-in-the-middle; send the prompt without a suffix", m.Desc.Name)
	}
	if len(p.Tokens) > 0 {
		for i, id := range p.Tokens {
			if id < 0 || int(id) >= m.Tok.VocabSize() {
				return nil, sdk.Invalidf("prompt[%d]: token id %d out of range [0, %d)", i, id, m.Tok.VocabSize())
			}
		}
		return p.Tokens, nil
	}
	ids := m.Tok.Encode(p.Text, true, true)
	if len(ids) == 0 {
		return nil, sdk.Invalidf("prompt must not be empty")
	}
	return ids, nil
}

// prepareRaw is a text completion as engine work: the prompt as it is, no
// template and no output parser, so everything generated is text; the
// sampling preset is the family's non-thinking one.
func (m *model) prepareRaw(req *sdk.ChatRequest) (*engine.Request, error) {
	if req.ResponseFormat != "" && req.ResponseFormat != "text" {
		return nil, sdk.Invalidf("response_format is not supported on text completions")
	}
	ids, err := m.rawPrompt(req.Prompt)
	if err != nil {
		return nil, err
	}
	s, err := m.sampling(req.Sampling, false)
	if err != nil {
		return nil, err
	}
	return &engine.Request{
		ID: req.ID, Prompt: ids, MaxTokens: nativebackend.MaxTokens(req, m.Desc), MinTokens: req.MinTokens, IgnoreEOS: req.IgnoreEOS,
		Sampling: s, Stop: req.Stop, Logprobs: req.Logprobs || req.TopLogprobs > 0, TopLogprobs: req.TopLogprobs,
		Detokenizer: tokenizer.NewStreamDecoder(m.Tok),
	}, nil
}

// forcedTool is a forced call's parser and the constraint on what the
// model writes after the prefill.
type forcedTool struct {
	*nativebackend.ForcedCallParser
	format engine.Format
	schema *jsonprefix.Schema
}

// forcedCall is how a request whose tool_choice is "required" or names a
// function is made to call: the prompt ends with the opening of a Qwen
// tool call in its JSON form (which both Qwen families' parsers read), the
// function name written for the model where the choice (or a single tool)
// decides it, and the engine holds the rest to one JSON object. A prompt
// that opened the reasoning gets it closed first: a forced call skips
// thinking. Nil when the choice forces nothing.
func forcedCall(req *sdk.ChatRequest, thinkingOpen bool) (*forcedTool, error) {
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
	f := &forcedTool{ForcedCallParser: &nativebackend.ForcedCallParser{Suffix: "\n</tool_call>"}, format: engine.FormatJSONObject}
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
					f.format, f.schema = engine.FormatJSONSchema, s
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
		f.format, f.schema = engine.FormatJSONSchema, s
	}
	f.Prefill = prefill
	return f, nil
}
