package chat

import "github.com/dflash/dflash_server/sdk"

// RequestRenderOptions maps a request's tools, thinking switch and
// chat_template_kwargs onto RenderOptions. The caller adds the model's
// BOS/EOS tokens and decides AddGenerationPrompt (normally true).
func RequestRenderOptions(req *sdk.ChatRequest) RenderOptions {
	opts := RenderOptions{
		AddGenerationPrompt: true,
		Extra:               req.TemplateKwargs,
		EnableThinking:      req.Reasoning.Enabled,
	}
	if req.ToolChoice != "none" {
		opts.Tools = req.Tools
	}
	return opts
}

// RequestParserOptions configures the output parser for a request whose
// prompt was rendered as prompt.
func RequestParserOptions(req *sdk.ChatRequest, prompt string) ParserOptions {
	tools := len(req.Tools) > 0 && req.ToolChoice != "none"
	opts := ParserOptions{ThinkingOpen: ThinkingOpen(prompt), Tools: tools}
	if tools {
		opts.ToolSchemas = req.Tools
	}
	return opts
}
