package qwendflash

import (
	"github.com/dflash/dflash_server/plugins/nativebackend"
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/chat"
	"github.com/dflash/dflash_server/sdk/engine"
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
	format, err := nativebackend.ResponseFormat(Name, req.ResponseFormat)
	if err != nil {
		return nil, err
	}
	prompt, err := m.Render(req)
	if err != nil {
		return nil, err
	}
	ids := m.Tok.Encode(prompt, true, true)
	open := chat.ThinkingOpen(prompt)
	tools := len(req.Tools) > 0 && req.ToolChoice != "none"
	parser := chat.NewParser(m.family, chat.ParserOptions{ThinkingOpen: open, Tools: tools, ToolSchemas: req.Tools})

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
		Parser:               nativebackend.OutputParser{P: parser},
		Format:               format,
	}
	// A thinking model opens its reasoning itself unless the prompt did;
	// the JSON constraint then starts after the reasoning.
	if format != engine.FormatText && thinking && !open && m.thinkOpen >= 0 {
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
