package engine

import (
	"fmt"
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

const benchSchema = `{"type":"object","properties":{"name":{"type":"string","maxLength":40},
	"age":{"type":"integer","minimum":0,"maximum":150},"role":{"enum":["admin","user"]},
	"tags":{"type":"array","items":{"type":"string"}}},"required":["name","age"]}`

// BenchmarkMaskMisfits is the fallback of a constrained request that
// rejected maxRejections samples: one pass over a Qwen3.5-sized
// (248,320-token) vocabulary, inside a string (most tokens fit) and after a
// value (few do), for json_object and for a json_schema.
func BenchmarkMaskMisfits(b *testing.B) {
	const n = 248320
	vocab := newWordVocab(n)
	e := &Engine{vocab: vocab, special: make([]bool, n)}
	row := make([]float32, n)
	schema, err := jsonprefix.CompileSchema([]byte(benchSchema))
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name, prefix string
		format       Format
	}{
		{"object/in string", `{"name": "Ad`, FormatJSONObject},
		{"object/after value", `{"name": "Ada", "age": 36`, FormatJSONObject},
		{"schema/in string", `{"name": "Ad`, FormatJSONSchema},
		{"schema/after value", `{"name": "Ada", "age": 36`, FormatJSONSchema},
		{"schema/in key", `{"name": "Ada", "`, FormatJSONSchema},
	} {
		b.Run(bc.name, func(b *testing.B) {
			req := &Request{Format: bc.format, Schema: schema}
			s := &sequence{req: req, json: newConstraint(req)}
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

// BenchmarkFits is the common case of a constrained token: the sampled
// token is checked against the state once.
func BenchmarkFits(b *testing.B) {
	schema, err := jsonprefix.CompileSchema([]byte(benchSchema))
	if err != nil {
		b.Fatal(err)
	}
	vocab := wordVocab{[]byte("x"), []byte(" Lovelace")}
	e := &Engine{vocab: vocab, special: make([]bool, 2)}
	for _, f := range []Format{FormatJSONObject, FormatJSONSchema} {
		b.Run(fmt.Sprint(f), func(b *testing.B) {
			req := &Request{Format: f, Schema: schema}
			s := &sequence{req: req, json: newConstraint(req)}
			if !s.json.Feed([]byte(`{"name": "Ada`)) {
				b.Fatal("prefix refused")
			}
			for b.Loop() {
				if !e.fits(s, 1) {
					b.Fatal("token refused")
				}
			}
		})
	}
}

// slowPath hides the plain-string fast path of a constraint.
type slowPath struct{ constraint }

func (slowPath) PlainString() (bool, int) { return false, 0 }

// TestMaskFastPathAgrees checks that the plain-string table masks exactly
// what stepping the state for every token masks.
func TestMaskFastPathAgrees(t *testing.T) {
	const n = 20000
	vocab := newWordVocab(n)
	vocab[7] = []byte("\xc3") // half a character is never plain
	vocab[8] = []byte("é\"")
	vocab[9] = []byte("日本語です")
	schema, err := jsonprefix.CompileSchema([]byte(`{"type":"object","properties":{"a":{"type":"string","maxLength":6},"b":{"type":"string"},"c":{"enum":["xy","zz"]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	special := make([]bool, n)
	special[11] = true
	for _, tc := range []struct {
		name, prefix string
		format       Format
	}{
		{"object string", `{"k": "abc`, FormatJSONObject},
		{"object key", `{"k`, FormatJSONObject},
		{"schema bounded string", `{"a": "abcd`, FormatJSONSchema},
		{"schema free string", `{"b": "`, FormatJSONSchema},
		{"schema enum string", `{"c": "x`, FormatJSONSchema},
		{"schema after value", `{"b": "x"`, FormatJSONSchema},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &Engine{vocab: vocab, special: special, nv: n}
			req := &Request{Format: tc.format, Schema: schema}
			fast := &sequence{req: req, json: newConstraint(req)}
			slow := &sequence{req: req, json: slowPath{newConstraint(req)}}
			if !fast.json.Feed([]byte(tc.prefix)) || !slow.json.Feed([]byte(tc.prefix)) {
				t.Fatal("prefix refused")
			}
			rf, rs := make([]float32, n), make([]float32, n)
			lf, ls := e.maskMisfits(fast, rf), e.maskMisfits(slow, rs)
			if lf != ls {
				t.Fatalf("fast path leaves %d tokens, stepping the state %d", lf, ls)
			}
			for id := range rf {
				if rf[id] != rs[id] {
					t.Fatalf("token %d (%q): fast %v, slow %v", id, vocab[id], rf[id], rs[id])
				}
			}
		})
	}
}
