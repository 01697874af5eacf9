package sdk

import "encoding/json"

// ChatRequest is one generation request in API-neutral form. core/api decodes
// Chat Completions, Anthropic Messages and Responses bodies into it; a backend
// renders it with its own chat template, tokenizer and defaults.
//
// Optional numeric fields are pointers: nil means "use the model's default".
type ChatRequest struct {
	// ID is the request id the core generated (X-Request-Id); for logs.
	ID string `json:"id,omitempty"`
	// Model is the name the client sent. It never pins a model under the
	// primary-first policy; backends may ignore it.
	Model    string    `json:"model,omitempty"`
	Messages []Message `json:"messages"`
	// Prompt, when set, makes this a raw text completion (POST
	// /v1/completions): the backend tokenizes it as it is, with no chat
	// template and no output parser (all output is Text), and Messages,
	// Tools and Reasoning are empty. A backend that cannot serve it answers
	// OutcomeInvalid. It travels inside the request JSON, so adding it did
	// not change the plugin protocol.
	Prompt *RawPrompt `json:"prompt,omitempty"`

	Tools             []Tool     `json:"tools,omitempty"`
	ToolChoice        ToolChoice `json:"tool_choice,omitempty"`
	ParallelToolCalls *bool      `json:"parallel_tool_calls,omitempty"`

	// MaxTokens caps generated tokens (reasoning included); 0 means the
	// model's --default-max-tokens. Backends clamp it to --max-tokens.
	MaxTokens int `json:"max_tokens,omitempty"`

	Sampling Sampling `json:"sampling"`
	// Stop strings end generation when they appear in visible text; the
	// matched string is not emitted.
	Stop []string `json:"stop,omitempty"`

	Logprobs    bool `json:"logprobs,omitempty"`
	TopLogprobs int  `json:"top_logprobs,omitempty"`

	// ResponseFormat is "" / "text", "json_object" or "json_schema".
	ResponseFormat string          `json:"response_format,omitempty"`
	JSONSchema     json.RawMessage `json:"json_schema,omitempty"`

	Reasoning Reasoning `json:"reasoning"`

	// IgnoreEOS keeps generating past end-of-generation tokens (benchmarks).
	IgnoreEOS bool `json:"ignore_eos,omitempty"`
	// MinTokens suppresses end-of-generation before this many tokens.
	MinTokens int `json:"min_tokens,omitempty"`

	// TemplateKwargs are extra variables for the chat template
	// (chat_template_kwargs), e.g. {"enable_thinking": false}.
	TemplateKwargs map[string]any `json:"template_kwargs,omitempty"`

	// Whole says the client takes the answer as one body (not streamed): a
	// backend may then hold its events and emit them together at the finish,
	// sparing both processes a message per token. Latency metrics of such a
	// request come from Finish.Timings. It travels inside the request JSON.
	Whole bool `json:"whole,omitempty"`
}

// RawPrompt is the prompt of a text completion: text, or token ids of the
// serving model's vocabulary (exactly one of the two).
type RawPrompt struct {
	Text   string  `json:"text,omitempty"`
	Tokens []int32 `json:"tokens,omitempty"`
	// Suffix is the text after the insertion point (fill-in-the-middle);
	// a backend whose model has no FIM refuses a non-empty one.
	Suffix string `json:"suffix,omitempty"`
}

// Message is one conversation turn. Content parts are flattened to text by
// the API decoder (images are rejected there).
type Message struct {
	// Role is "system", "user", "assistant" or "tool".
	Role             string     `json:"role"`
	Content          string     `json:"content"`
	ReasoningContent string     `json:"reasoning_content,omitempty"`
	ToolCalls        []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID links a "tool" message to the call it answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
	// Name is the tool's name on "tool" messages, when the API carries it.
	Name string `json:"name,omitempty"`
}

// Tool is a function the model may call.
type Tool struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Parameters is the JSON Schema of the arguments object.
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// ToolCall is a complete call made by the model (or sent back in history).
type ToolCall struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Arguments is the JSON text of the arguments object.
	Arguments string `json:"arguments"`
}

// ToolChoice is "", "auto", "none", "required", or the name of one function
// prefixed with "function:".
type ToolChoice string

// Sampling holds the sampler settings; nil fields take the model's defaults.
type Sampling struct {
	Temperature       *float64 `json:"temperature,omitempty"`
	TopP              *float64 `json:"top_p,omitempty"`
	TopK              *int     `json:"top_k,omitempty"`
	MinP              *float64 `json:"min_p,omitempty"`
	Seed              *int64   `json:"seed,omitempty"`
	FrequencyPenalty  *float64 `json:"frequency_penalty,omitempty"`
	PresencePenalty   *float64 `json:"presence_penalty,omitempty"`
	RepetitionPenalty *float64 `json:"repetition_penalty,omitempty"`
}

// Reasoning holds the client's reasoning controls.
type Reasoning struct {
	// Enabled is nil for the model's default, else thinking on/off
	// (chat_template_kwargs.enable_thinking, Anthropic thinking.type).
	Enabled *bool `json:"enabled,omitempty"`
	// Effort is "", "low", "medium" or "high" (reasoning_effort); the backend
	// maps it to a token budget from the operator's effort budgets.
	Effort string `json:"effort,omitempty"`
	// BudgetTokens is an explicit thinking budget (Anthropic budget_tokens);
	// 0 means none.
	BudgetTokens int `json:"budget_tokens,omitempty"`
}
