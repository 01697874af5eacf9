package engine

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/dflash/dflash_server/sdk/jsonprefix"
)

// Format is the shape a request's visible text must take.
type Format uint8

const (
	// FormatText: any text.
	FormatText Format = iota
	// FormatJSONObject: one JSON object (response_format json_object).
	// Tokens that would break it are never sampled, end-of-generation
	// waits for the closing brace, and the request finishes with
	// FinishStop as soon as the object is closed. The constraint covers
	// the visible answer only: a reasoning section is free text (see
	// OpenReasoning).
	FormatJSONObject
	// FormatJSONSchema: one JSON object valid against Request.Schema,
	// held to it the way FormatJSONObject holds text to any object.
	FormatJSONSchema
)

// Request is one generation request as the engine runs it: the backend has
// already rendered and tokenized the prompt and resolved its defaults.
type Request struct {
	// ID is for logs.
	ID     string
	Prompt []int32
	// MaxTokens caps generated tokens, reasoning included (> 0).
	MaxTokens int
	// MinTokens suppresses end-of-generation tokens before this many
	// tokens; IgnoreEOS suppresses them always.
	MinTokens int
	IgnoreEOS bool
	Sampling  Sampling
	// Stop strings end generation when they appear in the visible text; the
	// matched string is not emitted.
	Stop []string
	// Logprobs asks for the log probability of each generated token and
	// TopLogprobs alternatives.
	Logprobs    bool
	TopLogprobs int
	// ReasoningBudget caps reasoning tokens (0: no cap); HardLimitReplyBudget
	// closes reasoning when that many tokens of MaxTokens remain (0: off).
	// Both close reasoning by forcing CloseReasoning as the next tokens.
	ReasoningBudget      int
	HardLimitReplyBudget int
	CloseReasoning       []int32
	// Format constrains the visible text.
	Format Format
	// Schema is the schema of FormatJSONSchema.
	Schema *jsonprefix.Schema
	// OpenReasoning lists the tokens that open a reasoning section. A
	// constrained request may begin with one of them (nothing but
	// whitespace before it, no reasoning yet); its constraint then starts
	// once the section closes. Leave it empty when the model is not to
	// think.
	OpenReasoning []int32
	// SnapshotAt is where in the prompt a model with recurrent state takes
	// the snapshot the prefix cache can go back to (0: the prompt's end).
	// Backends set it to the start of the generation prompt, so that the
	// next turn of the conversation, which renders this prompt's messages
	// but not its generation prompt, can continue from it.
	SnapshotAt int
	// Whole: the consumer takes the answer at the end (sdk.ChatRequest.Whole),
	// so Run emits all its events together, after the finish.
	Whole bool
	// Detokenizer is this request's incremental detokenizer (required).
	Detokenizer Detokenizer
	// Parser splits the text; nil makes everything visible text.
	Parser Parser
}

type seqState uint8

const (
	statePending seqState = iota // admitted, not yet given a model slot
	statePrefill
	stateDecode
	stateDone
)

// sequence is one admitted request inside the engine.
type sequence struct {
	req *Request
	ctx context.Context
	out *outbox
	// abort is set by the sender when its consumer is gone.
	abort atomic.Bool

	// Ledger fields, guarded by Engine.mu.
	held  int // KV blocks promised or reserved
	pos   int // tokens the sequence will hold after its next step
	limit int // prompt + max tokens

	// reuse is the prefix-cache entry admission gave the request (its
	// blocks are in held) and cached the prompt tokens it covers.
	reuse  *cacheEntry
	cached int

	// Loop-only fields.
	state      seqState
	id         SeqID
	hasID      bool
	nPast      int     // tokens in the model's KV
	reservedTk int     // tokens reserved in the model
	feed       []int32 // next decode input
	generated  []int32
	reasoning  int
	forced     []int32
	toolCalls  bool
	stop       stopMatcher
	json       constraint // the visible text so far, for the JSON formats
	parser     Parser
	rng        uint64
	drawn      drawn    // the next token, drawn ahead by presample
	snapLen    int      // length of the snapshot taken at the prompt's end
	spec       *specSeq // the draft side, when the sequence speculates
	counts     specCounts
	// stored is the longest prefix of the prompt the state store holds (its length and state), found at admission.
	stored      int
	storedState []byte
	storedDone  bool  // the state at the prompt's snapshot point went to the store
	err         error // why it ended with an error
	tAdmit      time.Time
	tFirst      time.Time
}

// textParser is the Parser of requests without one: all text is visible.
type textParser struct{}

func (textParser) Feed(t string) Output { return Output{Text: t} }
func (textParser) Close() Output        { return Output{} }
func (textParser) InReasoning() bool    { return false }

// seedRNG spreads a seed into a non-zero generator state (splitmix64).
func seedRNG(seed uint64) uint64 {
	if z := rngNext(&seed); z != 0 {
		return z
	}
	return 1
}
