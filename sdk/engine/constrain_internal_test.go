package engine

import (
	"math/rand/v2"
	"testing"

	"github.com/dflash/dflash_server/sdk/jsonprefix"
)

// wordVocab is a Qwen-sized vocabulary of random byte strings shaped like
// BPE pieces: words with or without a leading space, punctuation runs,
// digits.
type wordVocab [][]byte

func newWordVocab(n int) wordVocab {
	r := rand.New(rand.NewPCG(5, 6))
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	const punct = `{}[]":,.-_()!?;'/\ ` + "\n"
	v := make(wordVocab, n)
	for i := range v {
		var b []byte
		switch r.IntN(4) {
		case 0, 1:
			if r.IntN(2) == 0 {
				b = append(b, ' ')
			}
			for range 1 + r.IntN(8) {
				b = append(b, letters[r.IntN(len(letters))])
			}
		case 2:
			for range 1 + r.IntN(3) {
				b = append(b, punct[r.IntN(len(punct))])
			}
		default:
			for range 1 + r.IntN(3) {
				b = append(b, byte('0'+r.IntN(10)))
			}
		}
		v[i] = b
	}
	return v
}

func (v wordVocab) EOG(id int32) bool          { return id == 0 }
func (v wordVocab) EOGTokens() []int32         { return []int32{0} }
func (v wordVocab) TokenBytes(id int32) []byte { return v[id] }

// BenchmarkMaskMisfits is the fallback of a constrained request that
// rejected maxRejections samples: one pass over a 151,936-token vocabulary,
// inside a string (most tokens fit) and after a value (few do).
func BenchmarkMaskMisfits(b *testing.B) {
	const n = 151936
	vocab := newWordVocab(n)
	e := &Engine{vocab: vocab, special: make([]bool, n)}
	row := make([]float32, n)
	for _, bc := range []struct{ name, prefix string }{
		{"in string", `{"name": "Ad`},
		{"after value", `{"name": "Ada", "age": 36`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s := &sequence{req: &Request{Format: FormatJSONObject}, json: jsonprefix.WithMaxSpace(jsonMaxSpace)}
			if !s.json.Feed([]byte(bc.prefix)) {
				b.Fatal("prefix refused")
			}
			left := 0
			for b.Loop() {
				clear(row)
				left = e.maskMisfits(s, row)
			}
			b.ReportMetric(float64(left), "tokens-left")
		})
	}
}
