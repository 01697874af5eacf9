package nativebackend

import (
	"strings"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/chat"
	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/jsonprefix"
	"github.com/dflash/dflash_server/sdk/tokenizer"
)

// Chat is what a backend says about its model family for requests to be
// turned into engine work: the parts that differ between families (which
// token opens the generation prompt, whether a request thinks by default,
// the sampling presets, how a tool call is forced). ChatModel does the rest
// the same way for every family.
type Chat struct {
	// Backend is the backend's name, for messages.
	Backend string
	// Family parses the output and renders tool calls.
	Family chat.Family
	// BOS and EOS are the tokenizer's special-token strings, passed to the
	// template ("" when the vocabulary has none).
	BOS, EOS string
	// TurnStart is the token that opens the generation prompt (Qwen's
	// <|im_start|>, DeepSeek's <｜Assistant｜>); -1 if the vocabulary has
	// none. Its last occurrence in a prompt is where the prefix cache
	// snapshots: the next turn renders everything before it the same way.
	TurnStart int32
	// ThinkOpen is the token that opens reasoning, -1 if none.
	ThinkOpen int32
	// ThinkByDefault is whether a request that neither enables nor
	// disables reasoning thinks, as the family's template decides.
	ThinkByDefault bool
	// Preset is the family's recommended sampling, thinking or not; a
	// request's own settings go over it.
	Preset func(thinking bool) engine.Sampling
	// Force ends the prompt so that the model calls a tool when the
	// request's tool_choice forces one; nil when the choice forces
	// nothing. A nil Force refuses forcing choices.
	Force func(req *sdk.ChatRequest, thinkingOpen bool) (*ForcedCall, error)
}

// ForcedCall is how a forced tool call is generated: the parser (with the
// prefill the prompt ends with) and the constraint on what the model writes
// after it.
type ForcedCall struct {
	*ForcedCallParser
	Format engine.Format
	Schema *jsonprefix.Schema
}

// ChatModel is a loaded model with its family's Chat: it implements Model
// for every chat backend on the native engine.
type ChatModel struct {
	*Loaded
	Chat
}

var _ Model = (*ChatModel)(nil)

// NewChatModel completes l with c, reading BOS and EOS from the tokenizer.
func NewChatModel(l *Loaded, c Chat) *ChatModel {
	if id := l.Tok.BOS(); id >= 0 {
		c.BOS = l.Tok.TokenText(id)
	}
	if id := l.Tok.EOS(); id >= 0 {
		c.EOS = l.Tok.TokenText(id)
	}
	return &ChatModel{Loaded: l, Chat: c}
}

// SpecialID is the id of special token text, -1 if the vocabulary lacks it.
func SpecialID(tok *tokenizer.Tokenizer, text string) int32 {
	if id, ok := tok.Special(text); ok {
		return id
	}
	return -1
}

// Base is the shared loaded model.
func (m *ChatModel) Base() *Loaded { return m.Loaded }

// renderOptions are the template variables of a request.
func (m *ChatModel) renderOptions(req *sdk.ChatRequest) chat.RenderOptions {
	o := chat.RenderOptions{
		AddGenerationPrompt: true, EnableThinking: req.Reasoning.Enabled, Extra: req.TemplateKwargs,
		BOSToken: m.BOS, EOSToken: m.EOS,
	}
	if req.ToolChoice != "none" {
		o.Tools = req.Tools
	}
	return o
}

// Render turns a request into prompt text with the model's template.
func (m *ChatModel) Render(req *sdk.ChatRequest) (string, error) {
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

// thinking is whether the request reasons: its own setting, else the
// template kwarg enable_thinking, else the family's default.
func (m *ChatModel) thinking(req *sdk.ChatRequest) bool {
	if req.Reasoning.Enabled != nil {
		return *req.Reasoning.Enabled
	}
	if v, ok := req.TemplateKwargs["enable_thinking"].(bool); ok {
		return v
	}
	return m.ThinkByDefault
}

// Prepare renders, tokenizes and applies the model's defaults; an error is
// the request's fault and is answered as invalid.
func (m *ChatModel) Prepare(req *sdk.ChatRequest) (*engine.Request, error) {
	if req.Prompt != nil {
		return m.prepareRaw(req)
	}
	format, schema, err := ResponseFormat(m.Backend, req)
	if err != nil {
		return nil, err
	}
	prompt, err := m.Render(req)
	if err != nil {
		return nil, err
	}
	open := chat.ThinkingOpen(prompt)
	tools := len(req.Tools) > 0 && req.ToolChoice != "none"
	parser := chat.NewParser(m.Family, chat.ParserOptions{ThinkingOpen: open, Tools: tools, ToolSchemas: req.Tools})
	var outParser engine.Parser = OutputParser{P: parser}
	forced, err := m.force(req, open)
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
		format, schema = forced.Format, forced.Schema
	}
	ids := m.Tok.Encode(prompt, true, true)

	thinking := m.thinking(req)
	s, err := Sampling(req.Sampling, m.Preset(thinking))
	if err != nil {
		return nil, err
	}
	er := &engine.Request{
		ID: req.ID, Prompt: ids, MaxTokens: MaxTokens(req, m.Desc), MinTokens: req.MinTokens, IgnoreEOS: req.IgnoreEOS,
		Sampling: s, Stop: req.Stop, Logprobs: req.Logprobs || req.TopLogprobs > 0, TopLogprobs: req.TopLogprobs,
		SnapshotAt:           lastIndex(ids, m.TurnStart),
		Whole:                req.Whole,
		ReasoningBudget:      ReasoningBudget(m.Cfg, req),
		HardLimitReplyBudget: m.Cfg.HardLimitReplyBudget,
		CloseReasoning:       m.Tok.Encode(parser.ReasoningCloseTag(), false, true),
		Detokenizer:          tokenizer.NewStreamDecoder(m.Tok),
		Parser:               outParser,
		Format:               format,
		Schema:               schema,
	}
	// A thinking model opens its reasoning itself unless the prompt did;
	// the JSON constraint then starts after the reasoning.
	if format != engine.FormatText && forced == nil && thinking && !open && m.ThinkOpen >= 0 {
		er.OpenReasoning = []int32{m.ThinkOpen}
	}
	return er, nil
}

// force is the family's forced call of the request, refusing a forcing
// tool_choice when the family has no way to force one.
func (m *ChatModel) force(req *sdk.ChatRequest, open bool) (*ForcedCall, error) {
	if m.Force != nil {
		return m.Force(req, open)
	}
	if req.ToolChoice == "required" || strings.HasPrefix(string(req.ToolChoice), "function:") {
		return nil, sdk.Invalidf("tool_choice %q is not supported by the %s backend (use auto or none)", req.ToolChoice, m.Backend)
	}
	return nil, nil
}

// lastIndex is the position of tok's last occurrence in ids after the
// first token, 0 when there is none (or tok is -1).
func lastIndex(ids []int32, tok int32) int {
	if tok < 0 {
		return 0
	}
	for i := len(ids) - 1; i > 0; i-- {
		if ids[i] == tok {
			return i
		}
	}
	return 0
}

// rawPrompt is a text completion's prompt in tokens: text is tokenized with
// special tokens recognised (as llama.cpp's /completion does), so a client
// can write a chat turn by hand; ids are checked against the vocabulary.
func (m *ChatModel) rawPrompt(p *sdk.RawPrompt) ([]int32, error) {
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
func (m *ChatModel) prepareRaw(req *sdk.ChatRequest) (*engine.Request, error) {
	if req.ResponseFormat != "" && req.ResponseFormat != "text" {
		return nil, sdk.Invalidf("response_format is not supported on text completions")
	}
	ids, err := m.rawPrompt(req.Prompt)
	if err != nil {
		return nil, err
	}
	s, err := Sampling(req.Sampling, m.Preset(false))
	if err != nil {
		return nil, err
	}
	return &engine.Request{
		ID: req.ID, Prompt: ids, MaxTokens: MaxTokens(req, m.Desc), MinTokens: req.MinTokens, IgnoreEOS: req.IgnoreEOS,
		Sampling: s, Stop: req.Stop, Logprobs: req.Logprobs || req.TopLogprobs > 0, TopLogprobs: req.TopLogprobs,
		Detokenizer: tokenizer.NewStreamDecoder(m.Tok), Whole: req.Whole,
	}, nil
}
