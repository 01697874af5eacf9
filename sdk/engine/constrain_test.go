package engine_test

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/engine"
	"github.com/dflash/dflash_server/sdk/engine/enginetest"
	"github.com/dflash/dflash_server/sdk/jsonprefix"
)

func jsonRequest(prompt string, maxTokens int) *engine.Request {
	req := request(prompt, maxTokens)
	req.Format = engine.FormatJSONObject
	return req
}

// isObject reports whether text parses as one JSON object.
func isObject(text string) bool {
	var v map[string]any
	return json.Unmarshal([]byte(text), &v) == nil
}

func TestJSONObject(t *testing.T) {
	const obj = `{"a": [1, 2.5, true], "b": {"c": null, "d": "x\"y"}}`
	for _, tc := range []struct {
		name      string
		reply     string // what the model wants to say (then EOG)
		maxTokens int
		special   string // bytes Config.Special marks as special
		text      string // "": any JSON object
		reason    sdk.FinishReason
	}{
		{name: "valid object untouched", reply: obj, maxTokens: 100, text: obj, reason: sdk.FinishStop},
		{name: "trailing text dropped", reply: obj + " hope this helps", maxTokens: 100, text: obj, reason: sdk.FinishStop},
		{name: "leading whitespace kept", reply: "\n " + obj, maxTokens: 100, text: "\n " + obj, reason: sdk.FinishStop},
		{name: "length cuts the object", reply: obj, maxTokens: 10, text: obj[:10], reason: sdk.FinishLength},
		{name: "prose instead of json", reply: "Sure! Here it is: " + obj, maxTokens: 200, reason: sdk.FinishStop},
		{name: "code fence", reply: "```json\n" + obj + "\n```", maxTokens: 200, reason: sdk.FinishStop},
		// The model wants to end: the fake's runner-up and then its lowest
		// ids take over (a string of spaces, as it happens), never EOG.
		{name: "early end of generation", reply: `{"a": [1`, maxTokens: 200, reason: sdk.FinishLength},
		{name: "special tokens refused", reply: `{"xyz": 1}`, maxTokens: 200, special: "x", reason: sdk.FinishStop},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			m := enginetest.NewFakeModel(4, 128, 1)
			m.Next = enginetest.Reply(1, enginetest.Encode(tc.reply))
			cfg := engine.Config{}
			if tc.special != "" {
				cfg.Special = func(id int32) bool { return id < 256 && strings.ContainsRune(tc.special, rune(id)) }
			}
			e := newEngine(t, m, cfg)
			c, err := run(e, jsonRequest("q", tc.maxTokens))
			is.NoErr(err)
			r := c.result()
			is.Equal(r.finish.Reason, tc.reason)
			if tc.text != "" {
				is.Equal(r.text, tc.text)
			}
			if tc.reason == sdk.FinishStop {
				is.True(isObject(r.text)) // a JSON object
			}
			var s jsonprefix.State
			is.True(s.Feed([]byte(r.text))) // a JSON object's prefix
			if tc.special != "" {
				is.True(!strings.ContainsAny(r.text, tc.special)) // special tokens left out
			}
			is.Equal(r.finish.Usage.CompletionTokens, len(r.tokens))
		})
	}
}

// garbage is a fake model's Next that favours, by a hash of the history,
// characters JSON is made of, in no sensible order.
func garbage(history []int32) int32 {
	h := fnv.New64a()
	for _, t := range history {
		h.Write([]byte{byte(t), byte(t >> 8)})
	}
	const alphabet = `{}}}]]][[":,,,,0123456789-.eEtrufalsn "\ab`
	return int32(alphabet[h.Sum64()%uint64(len(alphabet))])
}

func TestJSONObjectFromGarbage(t *testing.T) {
	m := enginetest.NewFakeModel(16, 1024, 4)
	m.Next = garbage
	e := newEngine(t, m, engine.Config{MaxCtx: 2048})
	complete := 0
	for i := range 40 {
		c, err := run(e, jsonRequest(fmt.Sprintf("prompt %d", i), 1500))
		if err != nil {
			t.Fatalf("prompt %d: %v", i, err)
		}
		r := c.result()
		var s jsonprefix.State
		if !s.Feed([]byte(r.text)) {
			t.Fatalf("prompt %d: %q is not the start of a JSON object", i, r.text)
		}
		switch r.finish.Reason {
		case sdk.FinishStop:
			if !isObject(r.text) {
				t.Fatalf("prompt %d: finished with %q, not a JSON object", i, r.text)
			}
			complete++
		case sdk.FinishLength:
		default:
			t.Fatalf("prompt %d: finish %q", i, r.finish.Reason)
		}
	}
	if complete == 0 {
		t.Fatal("no request produced a complete object")
	}
	t.Logf("%d of 40 complete", complete)
}

func TestJSONObjectWhitespaceRunsEnd(t *testing.T) {
	is := is.New(t)
	m := enginetest.NewFakeModel(16, 64, 1)
	m.Next = func([]int32) int32 { return '\n' } // would pad forever
	e := newEngine(t, m, engine.Config{})
	c, err := run(e, jsonRequest("q", 200))
	is.NoErr(err)
	r := c.result()
	is.Equal(r.finish.Reason, sdk.FinishLength)
	is.True(strings.Contains(r.text, "{")) // the object got started
	is.True(!strings.Contains(r.text, strings.Repeat("\n", 41)))
}

func TestJSONObjectAfterReasoning(t *testing.T) {
	const answer = `{"k": [1, 2]}`
	for _, tc := range []struct {
		name      string
		reply     []int32
		open      []int32
		reasoning string
		text      string
	}{
		{
			name:  "model opens the reasoning",
			reply: append(append([]int32{'\n', enginetest.ThinkOpen}, enginetest.Encode(`let me think: {{ "`)...), append([]int32{enginetest.ThinkClose, '\n'}, enginetest.Encode(answer)...)...),
			open:  []int32{enginetest.ThinkOpen}, reasoning: `let me think: {{ "`, text: "\n\n" + answer,
		},
		{
			name:  "no reasoning allowed",
			reply: append([]int32{enginetest.ThinkOpen}, enginetest.Encode(answer)...),
			text:  "",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			m := enginetest.NewFakeModel(4, 128, 1)
			m.Next = enginetest.Reply(1, tc.reply)
			e := newEngine(t, m, engine.Config{})
			req := jsonRequest("q", 100)
			req.Parser = &enginetest.ThinkParser{}
			req.OpenReasoning = tc.open
			c, err := run(e, req)
			is.NoErr(err)
			r := c.result()
			is.Equal(r.reasoning, tc.reasoning)
			if tc.text != "" {
				is.Equal(r.text, tc.text)
			}
			is.True(isObject(r.text))
			is.Equal(r.finish.Reason, sdk.FinishStop)
		})
	}
}

func TestJSONObjectReasoningInPrompt(t *testing.T) {
	is := is.New(t)
	m := enginetest.NewFakeModel(4, 128, 1)
	m.Next = enginetest.Reply(1, append(enginetest.Encode("hmm }"), append([]int32{enginetest.ThinkClose}, enginetest.Encode(`{"a":1}`)...)...))
	e := newEngine(t, m, engine.Config{})
	req := jsonRequest("q", 100)
	req.Parser = &enginetest.ThinkParser{In: true} // the prompt opened it
	c, err := run(e, req)
	is.NoErr(err)
	r := c.result()
	is.Equal(r.reasoning, "hmm }")
	is.Equal(r.text, `{"a":1}`)
	is.Equal(r.finish.Reason, sdk.FinishStop)
}

// TestJSONSchemaFromGarbage holds a model that emits JSON characters in no
// sensible order to a schema: every request that finishes is an object the
// schema admits.
func TestJSONSchemaFromGarbage(t *testing.T) {
	schema, err := jsonprefix.CompileSchema([]byte(`{"type":"object","properties":{
		"n":{"type":"integer","minimum":-5,"maximum":99},
		"ok":{"type":"boolean"},
		"list":{"type":"array","items":{"enum":["a","b",1]},"maxItems":3},
		"s":{"anyOf":[{"type":"string","maxLength":4},{"type":"null"}]}},
		"required":["n","list"]}`))
	is.New(t).NoErr(err)
	m := enginetest.NewFakeModel(16, 1024, 4)
	m.Next = garbage
	e := newEngine(t, m, engine.Config{MaxCtx: 2048})
	complete := 0
	for i := range 30 {
		is := is.New(t)
		req := request(fmt.Sprintf("prompt %d", i), 400)
		req.Format, req.Schema = engine.FormatJSONSchema, schema
		c, err := run(e, req)
		is.NoErr(err)
		r := c.result()
		st := jsonprefix.NewSchemaState(schema, 0)
		is.True(st.Feed([]byte(r.text))) // a prefix the schema admits
		if r.finish.Reason != sdk.FinishStop {
			is.Equal(r.finish.Reason, sdk.FinishLength)
			continue
		}
		complete++
		is.True(st.Complete())
		var v struct {
			N    *int  `json:"n"`
			List []any `json:"list"`
			S    any   `json:"s"`
		}
		is.NoErr(json.Unmarshal([]byte(r.text), &v))
		is.True(v.N != nil && *v.N >= -5 && *v.N <= 99) // required, in bounds
		is.True(v.List != nil && len(v.List) <= 3)
		for _, x := range v.List {
			is.True(x == "a" || x == "b" || x == 1.0) // enum
		}
		if s, ok := v.S.(string); ok {
			is.True(len([]rune(s)) <= 4)
		}
	}
	if complete == 0 {
		t.Fatal("no request produced a complete object")
	}
	t.Logf("%d of 30 complete", complete)
}
