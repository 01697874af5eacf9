package sdk

// Outcome is a backend's engine-level admission answer, the first message of
// every Start stream.
type Outcome int

const (
	// OutcomeAdmitted: a sequence slot and the KV tokens were reserved;
	// deltas follow.
	OutcomeAdmitted Outcome = iota + 1
	// OutcomeBusy: the request fits this model but not now (no free slot or
	// not enough free KV); the core may try another model or wait.
	OutcomeBusy
	// OutcomeNeverFits: the request exceeds the model's context or total KV
	// capacity; the core skips this model.
	OutcomeNeverFits
	// OutcomeInvalid: the request is wrong for this model (template error,
	// bad parameter); the core answers 400 without fallback.
	OutcomeInvalid
)

func (o Outcome) String() string {
	switch o {
	case OutcomeAdmitted:
		return "admitted"
	case OutcomeBusy:
		return "busy"
	case OutcomeNeverFits:
		return "never_fits"
	case OutcomeInvalid:
		return "invalid"
	}
	return "unknown"
}

// Admission is the first event of a Start stream.
type Admission struct {
	Outcome Outcome
	// PromptTokens is the rendered prompt length in this model's tokens.
	PromptTokens int
	// NeededTokens is prompt plus output budget; LimitTokens the model's
	// limit that refused it (context or KV pool). Set with NeverFits.
	NeededTokens int
	LimitTokens  int
	// Reason explains Busy, NeverFits and Invalid in words for logs and 400s.
	Reason string
}

// FinishReason says why generation ended.
type FinishReason int

const (
	FinishNone FinishReason = iota
	// FinishStop: end-of-generation token.
	FinishStop
	// FinishLength: the max-tokens cap or the context was reached.
	FinishLength
	// FinishStopSequence: one of the request's stop strings matched.
	FinishStopSequence
	// FinishToolCalls: the model ended its turn with tool calls.
	FinishToolCalls
	// FinishCancelled: the stream context was cancelled.
	FinishCancelled
)

func (f FinishReason) String() string {
	switch f {
	case FinishStop:
		return "stop"
	case FinishLength:
		return "length"
	case FinishStopSequence:
		return "stop_sequence"
	case FinishToolCalls:
		return "tool_calls"
	case FinishCancelled:
		return "cancelled"
	}
	return "none"
}

// Event is one message of a Start stream after the admission: one decode
// step's worth of output. Several fields may be set in one event; the API
// writers emit them in the order Reasoning, Text, ToolCalls.
//
// The text fields (Reasoning, Text, tool-call pieces, logprob tokens) are the
// model's bytes and need not be valid UTF-8: a model can emit a byte token
// that never completes a character. They cross the plugin boundary exactly;
// the core's API writers replace what is not valid UTF-8 with U+FFFD.
type Event struct {
	// Reasoning is a piece of the thinking section (already split out by the
	// backend's output parser).
	Reasoning string
	// Text is a piece of the visible answer. Never splits a UTF-8 character.
	Text string
	// ToolCalls are tool-call pieces; a call's first piece carries ID and
	// Name, later pieces append ArgumentsDelta to the call with that Index.
	ToolCalls []ToolCallDelta
	// TokenIDs are the tokens accepted in this step (several with
	// speculative decoding).
	TokenIDs []int32
	// Logprobs, when requested, one entry per token in TokenIDs.
	Logprobs []TokenLogprob
	// Finish is set on the last event only.
	Finish *Finish
}

// ToolCallDelta is a piece of a tool call being streamed.
type ToolCallDelta struct {
	Index          int
	ID             string
	Name           string
	ArgumentsDelta string
}

// TokenLogprob is the log probability of a sampled token and its best
// alternatives.
type TokenLogprob struct {
	// Token is the token's text; with byte-level BPE it can be part of a
	// multi-byte character. Bytes are the same bytes, for the APIs' exact
	// "bytes" field.
	Token   string
	Logprob float64
	Bytes   []byte
	Top     []TopLogprob
}

// TopLogprob is one alternative token.
type TopLogprob struct {
	Token   string
	Logprob float64
	Bytes   []byte
}

// Finish ends a stream.
type Finish struct {
	Reason FinishReason
	// StopSequence is the stop string that matched, for FinishStopSequence.
	StopSequence string
	Usage        Usage
	Timings      Timings
}

// Usage counts tokens of one request.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// ReasoningTokens is the part of CompletionTokens spent thinking.
	ReasoningTokens int
	// CachedTokens is the part of PromptTokens served from a prefix cache.
	CachedTokens int
}

// Timings are engine timings of one request in milliseconds.
type Timings struct {
	PrefillMS float64
	DecodeMS  float64
	// DraftAccepted / DraftProposed count speculative tokens, when a draft
	// model is used.
	DraftAccepted int
	DraftProposed int
	// DraftSteps counts the target forwards that verified a draft block:
	// (DraftAccepted + DraftSteps) / DraftSteps is the acceptance length,
	// tokens committed per verify.
	DraftSteps int
}
