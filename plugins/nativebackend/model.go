package nativebackend

import (
	"context"
	"errors"
	"fmt"

	native "github.com/dflash/dflash_server/native/engine"
	"github.com/dflash/dflash_server/sdk/engine"
)

// nativeModel adapts a native engine model to engine.Model.
type nativeModel struct {
	m     *native.Model
	info  native.Info
	batch []native.Entry
}

var (
	_ engine.Model            = (*nativeModel)(nil)
	_ engine.Rewinder         = (*nativeModel)(nil)
	_ engine.CandidateModel   = (*nativeModel)(nil)
	_ engine.CandidateSampler = (*nativeModel)(nil)
	_ engine.Verifier         = (*nativeModel)(nil)
	_ engine.TreeVerifier     = (*nativeModel)(nil)
	_ engine.StateModel       = (*nativeModel)(nil)
)

// NewModel adapts a loaded native model to engine.Model (and
// engine.Rewinder).
func NewModel(m *native.Model) engine.Model { return &nativeModel{m: m, info: m.Info()} }

func (n *nativeModel) VocabSize() int   { return n.info.Vocab }
func (n *nativeModel) KVBlockSize() int { return n.info.BlockSize }
func (n *nativeModel) KVBlocks() int    { return n.info.Blocks }
func (n *nativeModel) MaxSeqs() int     { return n.info.MaxSeqs }

func (n *nativeModel) NewSeq() (engine.SeqID, error) {
	s, err := n.m.NewSeq()
	return engine.SeqID(s), err
}

func (n *nativeModel) FreeSeq(s engine.SeqID) error { return n.m.FreeSeq(native.Seq(s)) }

func (n *nativeModel) Reserve(s engine.SeqID, tokens int) error {
	return kvErr(n.m.Reserve(native.Seq(s), tokens))
}

// entries is batch as the native engine's entries (in a buffer reused across forwards).
func (n *nativeModel) entries(batch []engine.SeqInput) []native.Entry {
	n.batch = n.batch[:0]
	for _, in := range batch {
		n.batch = append(n.batch, native.Entry{Seq: native.Seq(in.Seq), Tokens: in.Tokens, Logits: native.LogitsMode(in.Logits),
			Record: in.Record, Parents: in.Parents})
	}
	return n.batch
}

func (n *nativeModel) Forward(_ context.Context, batch []engine.SeqInput) ([]float32, error) {
	r, err := n.m.Forward(native.Batch{Entries: n.entries(batch)})
	if err != nil {
		return nil, kvErr(err)
	}
	return r.Logits, nil
}

// ForwardCandidates is Forward with each logits row reduced to its k best candidates by the engine library (on a
// GPU only those cross to the host).
func (n *nativeModel) ForwardCandidates(_ context.Context, batch []engine.SeqInput, k int) (engine.Candidates, error) {
	r, err := n.m.Forward(native.Batch{Entries: n.entries(batch), TopK: min(k, native.MaxTopK)})
	if err != nil {
		return engine.Candidates{}, kvErr(err)
	}
	return engine.Candidates{K: r.K, IDs: r.IDs, Logits: r.Logits, LSE: r.LSE}, nil
}

// ForwardCapture is Forward (k == 0) or ForwardCandidates (k > 0) that also returns the capture layers' outputs of
// every token, for a draft: read in place (valid until the next forward, as engine.Verifier allows).
func (n *nativeModel) ForwardCapture(_ context.Context, batch []engine.SeqInput, capture []int, k int) ([]float32, engine.Candidates, []float32, error) {
	b := native.Batch{Entries: n.entries(batch), Capture: capture, CaptureInPlace: true}
	if k > 0 {
		b.TopK = min(k, native.MaxTopK)
	}
	r, err := n.m.Forward(b)
	if err != nil {
		return nil, engine.Candidates{}, nil, kvErr(err)
	}
	if k > 0 {
		return nil, engine.Candidates{K: r.K, IDs: r.IDs, Logits: r.Logits, LSE: r.LSE}, r.Capture, nil
	}
	return r.Logits, engine.Candidates{}, r.Capture, nil
}

func (n *nativeModel) Sample(logits []float32, s *engine.Sampling, history []int32, rng *uint64) (int32, error) {
	return n.m.Sample(logits, samplingParams(s), history, rng)
}

// SampleCandidates draws a token without top-k from a row's candidates where they decide it (engine.CandidateSampler).
func (n *nativeModel) SampleCandidates(ids []int32, logits []float32, suppressed []bool, lse float32, s *engine.Sampling, rng *uint64) (int32, bool, error) {
	tok, err := n.m.SampleCandidates(ids, logits, suppressed, lse, n.info.Vocab, samplingParams(s), rng)
	return tok, err == nil && tok >= 0, err
}

// LogitsRow is a whole row of the last forward, for the draws the candidates leave open.
func (n *nativeModel) LogitsRow(row int, dst []float32) error { return n.m.LogitsRow(row, dst) }

// SampleDist is the distribution Sample draws from (engine.Distributor: sampled drafts).
func (n *nativeModel) SampleDist(logits []float32, s *engine.Sampling, history []int32, ids []int32, probs []float64) (int, error) {
	return n.m.SampleDist(logits, samplingParams(s), history, ids, probs)
}

func samplingParams(s *engine.Sampling) native.SamplingParams {
	return native.SamplingParams{
		Temperature: s.Temperature, TopK: s.TopK, TopP: s.TopP, MinP: s.MinP,
		RepeatPenalty: s.RepeatPenalty, PresencePenalty: s.PresencePenalty, FrequencyPenalty: s.FrequencyPenalty,
		PenaltyLastN: s.PenaltyLastN,
	}
}

func (n *nativeModel) Recurrent() bool { return n.info.RecurrentLayers > 0 }

func (n *nativeModel) Truncate(s engine.SeqID, tokens int) error {
	return n.m.Truncate(native.Seq(s), tokens)
}

// AcceptPath keeps a root-to-node path of the sequence's last tree forward.
func (n *nativeModel) AcceptPath(s engine.SeqID, path []int32) error {
	return n.m.AcceptPath(native.Seq(s), path)
}

// Export is the sequence's whole state at its length (KV rows and recurrent state), for the disk prefix cache.
func (n *nativeModel) Export(s engine.SeqID) ([]byte, error) { return n.m.Export(native.Seq(s)) }

// Import gives an empty sequence an exported state.
func (n *nativeModel) Import(s engine.SeqID, state []byte) error {
	return kvErr(n.m.Import(native.Seq(s), state))
}

func (n *nativeModel) Snapshot(s engine.SeqID) error { return n.m.Snapshot(native.Seq(s)) }
func (n *nativeModel) Rollback(s engine.SeqID) error { return n.m.Rollback(native.Seq(s)) }

// kvErr makes the native "pool full" error match engine.ErrNoKV too.
func kvErr(err error) error {
	if err != nil && errors.Is(err, native.ErrNoKV) {
		return fmt.Errorf("%w: %w", engine.ErrNoKV, err)
	}
	return err
}
