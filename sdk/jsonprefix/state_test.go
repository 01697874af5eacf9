package jsonprefix_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk/jsonprefix"
)

// feed reports how many bytes of text the state takes before refusing one
// (len(text) when it takes them all), and the state after them.
func feed(text string) (int, jsonprefix.State) {
	var s jsonprefix.State
	for i := 0; i < len(text); i++ {
		if !s.Feed([]byte{text[i]}) {
			return i, s
		}
	}
	return len(text), s
}

func TestState(t *testing.T) {
	tests := []struct {
		name     string
		text     string
		bad      int // index of the first refused byte; -1: all taken
		complete bool
	}{
		{"empty object", `{}`, -1, true},
		{"leading and trailing whitespace", " \n\t{ } \r\n", -1, true},
		{"nothing yet", "", -1, false},
		{"only whitespace", "  \n", -1, false},
		{"open object", `{"a":`, -1, false},
		{"every kind of value", `{"s":"x","n":-1.5e+3,"z":0,"t":true,"f":false,"u":null,"a":[1,[],{}],"o":{"k":[]}}`, -1, true},
		{"escapes", `{"e":"\"\\\/\b\f\n\r\t\u00e9\uD83D\uDE00"}`, -1, true},
		{"raw utf-8", `{"ü":"日本語 😀"}`, -1, true},
		{"top-level array", `[1]`, 0, false},
		{"top-level string", `"x"`, 0, false},
		{"top-level number", `1`, 0, false},
		{"text after the object", `{} x`, 3, true},
		{"second object", `{}{}`, 2, true},
		{"unquoted key", `{a:1}`, 1, false},
		{"trailing comma in object", `{"a":1,}`, 7, false},
		{"trailing comma in array", `{"a":[1,]}`, 8, false},
		{"missing colon", `{"a" 1}`, 5, false},
		{"missing comma", `{"a":1 "b":2}`, 7, false},
		{"mismatched bracket", `{"a":[1}`, 7, false},
		{"mismatched brace", `{"a":{]}`, 6, false},
		{"leading zero", `{"a":01}`, 6, false},
		{"plus sign", `{"a":+1}`, 5, false},
		{"bare dot", `{"a":1.}`, 7, false},
		{"bare exponent", `{"a":1e}`, 7, false},
		{"minus alone", `{"a":-}`, 6, false},
		{"hex number", `{"a":0x1}`, 6, false},
		{"bad literal", `{"a":tru}`, 8, false},
		{"literal too long", `{"a":truee}`, 9, false},
		{"capital literal", `{"a":True}`, 5, false},
		{"bad escape", `{"a":"\x"}`, 7, false},
		{"short unicode escape", `{"a":"\u12"}`, 10, false},
		{"newline in string", "{\"a\":\"x\ny\"}", 7, false},
		{"tab in string", "{\"a\":\"\t\"}", 6, false},
		{"single quotes", `{'a':1}`, 1, false},
		{"invalid utf-8 byte", "{\"a\":\"\xff\"}", 6, false},
		{"overlong encoding", "{\"a\":\"\xc0\x80\"}", 6, false},
		{"encoded surrogate", "{\"a\":\"\xed\xa0\x80\"}", 7, false},
		{"truncated character", "{\"a\":\"\xe6\x97\"}", 8, false},
		{"above U+10FFFF", "{\"a\":\"\xf4\x90\x80\x80\"}", 7, false},
		{"comment", `{/*x*/}`, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			n, s := feed(tt.text)
			want := tt.bad
			if want < 0 {
				want = len(tt.text)
			}
			is.Equal(n, want)                   // bytes accepted
			is.Equal(s.Complete(), tt.complete) // complete
			if tt.complete && tt.bad < 0 {
				var v map[string]any
				is.NoErr(json.Unmarshal([]byte(tt.text), &v)) // encoding/json agrees
			}
		})
	}
}

func TestStateFeedLeavesStateOnFailure(t *testing.T) {
	is := is.New(t)
	var s jsonprefix.State
	is.True(s.Feed([]byte(`{"a":[1`)))
	before := s
	is.True(!s.Feed([]byte(`,2}`))) // the brace does not close the array
	is.Equal(s, before)             // unchanged
	is.True(s.Accepts([]byte(`,2]}`)))
	is.Equal(s, before) // Accepts never changes the state
	is.True(s.Feed([]byte(`,2]}`)))
	is.True(s.Complete())
	is.True(!s.AcceptsByte(','))
	is.True(s.AcceptsByte('\n'))
}

func TestStateMaxSpace(t *testing.T) {
	is := is.New(t)
	s := jsonprefix.WithMaxSpace(3)
	is.True(s.Feed([]byte(" \n {\t\t\t\"a   b\"\n\n\n:1  \n,\"c\":[ 1 ]")))
	is.True(!s.Accepts([]byte("    }")))  // four in a row
	is.True(s.Accepts([]byte("   }   "))) // three, three
	unlimited := jsonprefix.State{}
	is.True(unlimited.Feed([]byte("{" + strings.Repeat(" ", 100000) + "}")))
}

func TestStateDepth(t *testing.T) {
	is := is.New(t)
	var s jsonprefix.State
	is.True(s.Feed([]byte(`{"a":` + strings.Repeat(`[`, 127) + "{")))
	is.Equal(s.Depth(), 129)
	deep := `{` + strings.Repeat(`"a":{`, jsonprefix.MaxDepth-1)
	s = jsonprefix.State{}
	is.True(s.Feed([]byte(deep)))
	is.Equal(s.Depth(), jsonprefix.MaxDepth)
	is.True(!s.Accepts([]byte(`"b":{`))) // one level too deep
	is.True(s.Feed([]byte(`"b":1` + strings.Repeat("}", jsonprefix.MaxDepth))))
	is.True(s.Complete())
}

// TestStateUTF8 checks every one-, two- and three-byte string body, and
// the four-byte ones around each boundary, against unicode/utf8.
func TestStateUTF8(t *testing.T) {
	check := func(body []byte) {
		t.Helper()
		if bytes.ContainsAny(body, "\"\\") {
			return // quotes and escapes are the other tests' business
		}
		var s jsonprefix.State
		s.Feed([]byte(`{"a":"`))
		ok := s.Feed(append(append([]byte{}, body...), '"', '}')) && s.Complete()
		valid := utf8.Valid(body) && !bytes.ContainsFunc(body, func(r rune) bool { return r < 0x20 })
		if ok != valid {
			t.Fatalf("string body % x: accepted %v, valid UTF-8 without controls %v", body, ok, valid)
		}
	}
	for a := range 256 {
		check([]byte{byte(a)})
		for b := range 256 {
			check([]byte{byte(a), byte(b)})
		}
	}
	for a := 0xC0; a < 0x100; a++ {
		for b := 0x70; b < 0xD0; b++ {
			for c := 0x70; c < 0xD0; c++ {
				check([]byte{byte(a), byte(b), byte(c)})
			}
		}
	}
	for _, a := range []byte{0xF0, 0xF1, 0xF3, 0xF4, 0xF5} {
		for _, b := range []byte{0x7F, 0x80, 0x8F, 0x90, 0xBF, 0xC0} {
			for _, c := range []byte{0x7F, 0x80, 0xBF, 0xC0} {
				check([]byte{a, b, c, 0x80})
				check([]byte{a, b, 0x80, c})
			}
		}
	}
}

// randomValue builds a random JSON-able value; ascii keeps strings ASCII.
func randomValue(r *rand.Rand, depth int, ascii bool) any {
	k := r.IntN(9)
	if depth > 4 {
		k = r.IntN(6)
	}
	switch k {
	case 0:
		return nil
	case 1:
		return r.IntN(2) == 0
	case 2:
		return r.NormFloat64() * math.Pow(10, float64(r.IntN(40)-20))
	case 3:
		return r.Int64N(2000) - 1000
	case 4, 5:
		return randomString(r, ascii)
	case 6:
		a := make([]any, r.IntN(4))
		for i := range a {
			a[i] = randomValue(r, depth+1, ascii)
		}
		return a
	}
	return randomObject(r, depth+1, ascii)
}

func randomObject(r *rand.Rand, depth int, ascii bool) map[string]any {
	m := map[string]any{}
	for range r.IntN(4) {
		m[randomString(r, ascii)] = randomValue(r, depth, ascii)
	}
	return m
}

func randomString(r *rand.Rand, ascii bool) string {
	const chars = "abc xyz\"\\/\n\t\x01<>&"
	var b strings.Builder
	for range r.IntN(8) {
		if !ascii && r.IntN(4) == 0 {
			b.WriteRune([]rune("éü日本😀\u2028")[r.IntN(6)])
			continue
		}
		b.WriteByte(chars[r.IntN(len(chars))])
	}
	return b.String()
}

// randomText is a random JSON object, compact or indented, sometimes with
// its non-ASCII characters escaped.
func randomText(r *rand.Rand, ascii bool) string {
	v := randomObject(r, 0, ascii)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(r.IntN(2) == 0)
	if r.IntN(2) == 0 {
		enc.SetIndent(strings.Repeat(" ", r.IntN(3)), "\t")
	}
	if err := enc.Encode(v); err != nil {
		panic(err)
	}
	return strings.Repeat(" ", r.IntN(2)) + buf.String()
}

func TestStateRandomValidTexts(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		text := randomText(r, i%2 == 0)
		n, s := feed(text)
		if n != len(text) || !s.Complete() {
			t.Fatalf("text %q: refused byte %d (complete %v)", text, n, s.Complete())
		}
		// Split at every byte: the two halves fed as chunks give the same.
		for cut := range len(text) {
			var s jsonprefix.State
			if !s.Feed([]byte(text[:cut])) || s.Complete() && strings.TrimSpace(text[cut:]) != "" || !s.Feed([]byte(text[cut:])) || !s.Complete() {
				t.Fatalf("text %q split at %d: not accepted whole", text, cut)
			}
		}
	}
}

// oracle says where encoding/json first refuses text as the start of a
// JSON object: the index of the refused byte, or -1 when every byte is
// fine (a complete or incomplete object). Only for ASCII text: encoding/json
// does not check UTF-8.
func oracle(text string) int {
	if i := strings.IndexFunc(text, func(r rune) bool { return !strings.ContainsRune(" \t\n\r", r) }); i >= 0 && text[i] != '{' {
		return i
	}
	// A NUL can continue no JSON text, so encoding/json refuses it, at the
	// end, exactly when it took every byte before it; that also keeps its
	// end-of-input checks (an unfinished literal) out of the answer.
	err := json.Unmarshal([]byte(text+"\x00"), new(any))
	var se *json.SyntaxError
	if errors.As(err, &se) && int(se.Offset)-1 < len(text) {
		return int(se.Offset) - 1
	}
	return -1
}

func checkOracle(t *testing.T, text string) {
	t.Helper()
	want := oracle(text)
	n, s := feed(text)
	if want < 0 {
		want = len(text)
	}
	if n != want {
		t.Fatalf("text %q: refused byte %d, encoding/json refuses byte %d", text, n, want)
	}
	if n == len(text) {
		complete := json.Valid([]byte(text))
		if s.Complete() != complete {
			t.Fatalf("text %q: complete %v, encoding/json valid %v", text, s.Complete(), complete)
		}
	}
}

func TestStateRandomMutations(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const alphabet = "{}[]:,\"\\ \n-+.0123456789eEtrufalsnbx/u"
	for range 2000 {
		text := []byte(randomText(r, true))
		for range 1 + r.IntN(2) {
			i := r.IntN(len(text))
			switch r.IntN(3) {
			case 0:
				text[i] = alphabet[r.IntN(len(alphabet))]
			case 1:
				text = append(text[:i], text[i+1:]...)
			default:
				text = append(text[:i], append([]byte{alphabet[r.IntN(len(alphabet))]}, text[i:]...)...)
			}
		}
		checkOracle(t, string(text))
	}
}

func FuzzState(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":[1,2.5e-3,{"b":null}],"c":"\u00e9"}`, `{"a":tru`, `[1]`, ` {"x":-0.0E+1} `} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		for i := 0; i < len(text); i++ {
			if text[i] >= 0x80 {
				t.Skip("encoding/json does not check UTF-8")
			}
		}
		if strings.Count(text, "{")+strings.Count(text, "[") >= jsonprefix.MaxDepth {
			t.Skip("deeper than MaxDepth")
		}
		checkOracle(t, text)
	})
}

func ExampleState() {
	var s jsonprefix.State
	fmt.Println(s.Feed([]byte(`{"answer": 4`)), s.Complete())
	fmt.Println(s.Accepts([]byte(`]`)), s.Accepts([]byte(`2}`)))
	fmt.Println(s.Feed([]byte(`2}`)), s.Complete())
	// Output:
	// true false
	// false true
	// true true
}
