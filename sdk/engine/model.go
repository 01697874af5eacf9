package engine

import (
	"context"
	"errors"

	"github.com/dflash/dflash_server/sdk"
)

// ErrNoKV is returned by Model.Reserve and Model.Forward when the KV pool has
// too few free blocks.
var ErrNoKV = errors.New("kv pool exhausted")

// SeqID names a sequence slot of a Model.
type SeqID int32

// LogitsMode says which rows of logits a batch entry wants.
type LogitsMode uint8

const (
	// LogitsNone: no logits (a prefill chunk that does not end the prompt).
	LogitsNone LogitsMode = iota
	// LogitsLast: one row, for the entry's last token.
	LogitsLast
	// LogitsAll: one row per token (speculative verification).
	LogitsAll
)

// SeqInput is what one sequence contributes to a forward: tokens appended
// after the sequence's current length, at consecutive positions.
type SeqInput struct {
	Seq    SeqID
	Tokens []int32
	Logits LogitsMode
	// Record keeps the model's recurrent state after every token, so that
	// Verifier.Truncate can cut the sequence anywhere inside this forward
	// (a speculative verify block).
	Record bool
	// Parents, when set, makes Tokens a tree (DDTree verification, for a
	// TreeVerifier): Parents[i] is the index of token i's parent (-1 for
	// token 0, the root; Parents[i] < i). Token i sits at the sequence's
	// length plus its depth and sees the sequence and its own ancestors.
	Parents []int32
}

// Sampling are the sampler settings of one request. Order of application
// (as the native sampler does it): penalties, temperature, top-k, top-p,
// min-p, then a draw. Temperature <= 0 is greedy.
type Sampling struct {
	Temperature      float32
	TopK             int     // <= 0: off
	TopP             float32 // >= 1: off
	MinP             float32 // <= 0: off
	RepeatPenalty    float32 // 1 (or 0): off
	PresencePenalty  float32
	FrequencyPenalty float32
	// PenaltyLastN is how many history tokens the penalties look at: -1 all,
	// 0 none.
	PenaltyLastN int
	// Seed seeds the request's random generator; the backend picks one when
	// the client gave none.
	Seed uint64
}

// Model is what the engine needs from a loaded model. The engine calls it
// from one goroutine only, so implementations need no locking, except
// Sample: it must not depend on any model state (it may be called between
// forwards) and may run on several goroutines at once for different rows.
type Model interface {
	// VocabSize is the number of logits per row.
	VocabSize() int
	// KVBlockSize is the number of tokens per KV block; KVBlocks the pool's
	// total number of blocks; MaxSeqs the number of sequence slots.
	KVBlockSize() int
	KVBlocks() int
	MaxSeqs() int
	// NewSeq takes a free sequence slot (empty, length 0).
	NewSeq() (SeqID, error)
	// FreeSeq returns the slot and all KV blocks it holds.
	FreeSeq(SeqID) error
	// Reserve makes the sequence hold blocks for tokens tokens in total, so
	// that forwards up to that length cannot fail for lack of KV. It returns
	// ErrNoKV (changing nothing) when the pool has too few free blocks.
	Reserve(seq SeqID, tokens int) error
	// Forward runs the model on a batch (a sequence appears at most once)
	// and returns the logits rows in entry order: one per LogitsLast entry,
	// len(Tokens) per LogitsAll entry, VocabSize floats each. The slice is
	// valid until the next Forward; the engine may modify it.
	Forward(ctx context.Context, batch []SeqInput) ([]float32, error)
	// Sample picks one token from a row of logits. history is the request's
	// generated tokens (for penalties); rng is the request's generator
	// state, advanced only when a random draw is made.
	Sample(logits []float32, s *Sampling, history []int32, rng *uint64) (int32, error)
}

// Vocab is what the engine needs from the tokenizer (a *tokenizer.Tokenizer
// satisfies it).
type Vocab interface {
	// EOG reports whether id ends generation.
	EOG(id int32) bool
	// EOGTokens lists every end-of-generation id (suppressed for
	// IgnoreEOS and MinTokens).
	EOGTokens() []int32
	// TokenBytes is the raw text of a token (for logprobs).
	TokenBytes(id int32) []byte
}

// Detokenizer turns a request's generated ids into text incrementally,
// never cutting a UTF-8 character (a *tokenizer.StreamDecoder satisfies it).
type Detokenizer interface {
	Add(id int32) string
	Flush() string
}

// Output is a piece of parsed generated text.
type Output struct {
	Reasoning string
	Text      string
	ToolCalls []sdk.ToolCallDelta
}

// Parser splits a request's generated text into reasoning, visible text and
// tool calls (the backend adapts its chat-format parser to it).
type Parser interface {
	// Feed takes the next piece of generated text.
	Feed(text string) Output
	// Close ends the text and returns whatever the parser held back.
	Close() Output
	// InReasoning reports whether the text so far is inside the reasoning
	// section.
	InReasoning() bool
}

// Candidates are the logits rows of a CandidateModel forward: K best per row (ids and logits, larger first, lower id
// on ties; id -1 pads a row with fewer finite logits), rows in entry order as Forward's, and each row's log-sum-exp.
type Candidates struct {
	K      int
	IDs    []int32
	Logits []float32
	LSE    []float32
	// Probs, from a Drafter, holds for the rows of entries with DraftInput.Sample each candidate's probability
	// under the distribution the row's first candidate was drawn from (0 for padding and for other entries' rows);
	// nil when no entry sampled.
	Probs []float32
}

// Distributor is a Model that can say what Sample draws from. With it the engine samples a sampled request's draft
// proposals and accepts them by the speculative-sampling rule (spec.go); without it the draft proposes its best
// candidates and the target's samples must match them.
type Distributor interface {
	// SampleDist writes the distribution Sample draws from for the same arguments into ids and probs (room for
	// len(logits) entries each): the indices of logits it can return (in no particular order) and their
	// probabilities, summing to 1. It returns how many.
	SampleDist(logits []float32, s *Sampling, history []int32, ids []int32, probs []float64) (int, error)
}

// CandidateModel is a Model that can return each logits row as its k best candidates instead of the whole row (a
// GPU then moves k values per sequence instead of the vocabulary). The engine uses it for a step when every row's
// request needs nothing outside its candidates: greedy or top-k sampling without penalties, no logprobs, no
// constraint.
type CandidateModel interface {
	ForwardCandidates(ctx context.Context, batch []SeqInput, k int) (Candidates, error)
}

// CandidateSampler is a CandidateModel whose sampler draws a token without top-k from a row's candidates and
// log-sum-exp wherever they decide it, as Sample would from the whole row, and that hands back a whole row of its last
// forward where they do not. Sampled requests without top-k (a temperature in (0, 1], no min-p, no penalties) then
// take candidate steps too, and a whole row crosses to the host only for the few draws the candidates leave open.
type CandidateSampler interface {
	CandidateModel
	// SampleCandidates is Sample without history on a row given as its candidates and its log-sum-exp, suppressed
	// (nil or a flag a candidate) marking those that are -Inf in the row Sample would see: the token and true, or
	// false with rng unchanged where the candidates do not decide it.
	SampleCandidates(ids []int32, logits []float32, suppressed []bool, lse float32, s *Sampling, rng *uint64) (int32, bool, error)
	// LogitsRow copies row `row` of the last forward's logits (a candidate forward's too) into dst (VocabSize
	// floats), until the next forward.
	LogitsRow(row int, dst []float32) error
}

// Verifier is the part of a target Model that speculative decoding needs: forwards that hand back the hidden states
// a Drafter reads, and cutting a verified sequence back to its accepted tokens.
type Verifier interface {
	// ForwardCapture is Forward (k == 0) or ForwardCandidates (k > 0) that also returns the outputs of the capture
	// layers (after their FFN residual) for every token of the batch, in entry order, the layers' vectors
	// concatenated per token. The features may be the model's own memory, valid until its next forward.
	ForwardCapture(ctx context.Context, batch []SeqInput, capture []int, k int) (logits []float32, cands Candidates, features []float32, err error)
	// Truncate cuts a sequence to tokens: anywhere for attention-only models, inside its last Record forward for
	// models with recurrent state.
	Truncate(seq SeqID, tokens int) error
}

// TreeVerifier is a Verifier that verifies token trees (SeqInput.Parents) and then keeps one root-to-node path.
type TreeVerifier interface {
	Verifier
	// AcceptPath keeps the path path[0..] (indices into the last tree forward's tokens: path[0] = 0, each the child
	// of the one before) of seq's last tree forward: the sequence becomes its length before that forward plus
	// len(path).
	AcceptPath(seq SeqID, path []int32) error
}

// DraftInput is one sequence's part of a draft step.
type DraftInput struct {
	Seq SeqID
	// Features are target hidden states (FeatureSize floats per token) of the positions after the draft sequence's
	// context, appended to it.
	Features []float32
	// Block is the root token (the newest, not yet in the target's KV) followed by mask tokens.
	Block []int32
	// Sample, when set, asks for proposals drawn from the draft's distribution instead of its best candidates: each
	// block row's first candidate is the draw and Candidates.Probs the probabilities it was drawn with.
	Sample *DraftSample
}

// DraftSample is how a draft draws a sequence's proposals: each from softmax(score / Temperature) over its row's
// candidates (DrawCandidate), with the sequence's own generator.
type DraftSample struct {
	Temperature float32
	Rng         *uint64
}

// Drafter is a block draft model (DFlash): conditioned on the target's hidden states, one forward proposes the
// tokens that follow a root. Its sequences mirror the engine's target sequences; the engine calls it from the step
// loop only.
type Drafter interface {
	// BlockSize is the most block tokens (root included) one draft step takes.
	BlockSize() int
	MaskToken() int32
	// CaptureLayers are the target layers whose outputs the draft reads; FeatureSize the floats of one token's
	// features (the layers' outputs concatenated).
	CaptureLayers() []int
	FeatureSize() int
	NewSeq() (SeqID, error)
	FreeSeq(SeqID) error
	// Reserve makes the sequence hold room for tokens (context and block) so that a Draft cannot fail for lack of it.
	Reserve(seq SeqID, tokens int) error
	Truncate(seq SeqID, tokens int) error
	// Draft appends each input's Features to its sequence and proposes len(Block)-1 tokens after Block[0]: the k
	// best candidates of every block position but the root, rows in input order.
	Draft(ctx context.Context, in []DraftInput, k int) (Candidates, error)
}
