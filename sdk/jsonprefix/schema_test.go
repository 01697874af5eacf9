package jsonprefix

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/matryer/is"
)

const personSchema = `{"type":"object","title":"p","properties":{
	"name":{"type":"string","minLength":2,"maxLength":5},
	"age":{"type":"integer","minimum":0,"maximum":150},
	"role":{"enum":["admin","user",null]},
	"tags":{"type":"array","items":{"type":"string"},"minItems":1,"maxItems":2},
	"score":{"anyOf":[{"type":"number","exclusiveMinimum":0},{"type":"null"}]},
	"kind":{"const":"person"},
	"extra":{"type":"object"}},
	"required":["name","kind"]}`

func TestSchemaState(t *testing.T) {
	s, err := CompileSchema([]byte(personSchema))
	is.New(t).NoErr(err)
	for _, tc := range []struct {
		name, text string
		complete   bool // a whole object the schema admits
		valid      bool // a prefix the schema admits
	}{
		{"minimal", `{"name":"Al","kind":"person"}`, true, true},
		{"all, in order", `{"name": "Alice", "age": 30, "role": null, "tags": ["a","b"], "score": 0.5, "kind": "person", "extra": {"any": [1, {"x": null}]}}`, true, true},
		{"enum string", `{"name":"Al","role":"user","kind":"person"}`, true, true},
		{"anyOf null branch", `{"name":"Al","score":null,"kind":"person"}`, true, true},
		{"escape counts as one char", `{"name":"A\u00e9","kind":"person"}`, true, true},
		{"prefix", `{"name":"Al","age":1`, false, true},
		{"missing required at close", `{"name":"Al"}`, false, false},
		{"unknown property", `{"nick"`, false, false},
		{"unknown property prefix", `{"x`, false, false},
		{"out of order", `{"kind":"person","name"`, false, false},
		{"skipping a required property", `{"age"`, false, false},
		{"string too long", `{"name":"Alexander"`, false, false},
		{"string too short", `{"name":"A"`, false, false},
		{"integer with fraction", `{"name":"Al","age":1.5`, false, false},
		{"above maximum", `{"name":"Al","age":151`, false, false},
		{"cannot reach the bounds", `{"name":"Al","age":1000`, false, false},
		{"negative below minimum", `{"name":"Al","age":-1`, false, false},
		{"minus zero is zero", `{"name":"Al","age":-0,"kind":"person"}`, true, true},
		{"enum miss", `{"name":"Al","role":"adm1`, false, false},
		{"enum cut short", `{"name":"Al","role":"adm"`, false, false},
		{"wrong type", `{"name":5`, false, false},
		{"const miss", `{"name":"Al","kind":"animal"`, false, false},
		{"too few items", `{"name":"Al","tags":[]`, false, false},
		{"too many items", `{"name":"Al","tags":["a","b",`, false, false},
		{"item type", `{"name":"Al","tags":[1`, false, false},
		{"exclusive minimum", `{"name":"Al","score":0,`, false, false},
		{"anyOf no branch", `{"name":"Al","score":"x`, false, false},
		{"comma with nothing left", `{"name":"Al","kind":"person","extra":{},`, false, false},
		{"not an object", `[`, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			st := NewSchemaState(s, 40)
			ok := st.Feed([]byte(tc.text))
			if !tc.valid {
				is.True(!ok) // refused
				return
			}
			is.True(ok)                          // accepted
			is.Equal(st.Complete(), tc.complete) // complete
		})
	}
}

// TestSchemaRefs follows local $ref into $defs and definitions, as
// pydantic and zod emit for nested models.
func TestSchemaRefs(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		ok         bool
	}{
		{"nested object", `{"owner":{"name":"Al","age":3},"pets":[{"name":"Rex"}]}`, true},
		{"nested required", `{"owner":{"age":3}`, false},
		{"nested wrong type", `{"owner":{"name":"Al","age":"3"`, false},
		{"definitions", `{"owner":{"name":"Al"},"pets":[{"name":"Rex","kind":"dog"}]}`, true},
		{"definitions enum", `{"owner":{"name":"Al"},"pets":[{"name":"Rex","kind":"cow"`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			s, err := CompileSchema([]byte(`{"type":"object",
				"$defs":{"Person":{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name"]}},
				"definitions":{"Pet":{"type":"object","properties":{"name":{"type":"string"},"kind":{"enum":["dog","cat"]}}}},
				"properties":{"owner":{"$ref":"#/$defs/Person","description":"who"},"pets":{"type":"array","items":{"$ref":"#/definitions/Pet"}}},
				"required":["owner"]}`))
			is.NoErr(err)
			st := NewSchemaState(s, 0)
			is.Equal(st.Feed([]byte(tc.text)), tc.ok)
			if tc.ok {
				is.True(st.Complete())
			}
		})
	}
}

func TestSchemaStateFeedLeavesStateOnRefusal(t *testing.T) {
	is := is.New(t)
	s, err := CompileSchema([]byte(personSchema))
	is.NoErr(err)
	st := NewSchemaState(s, 0)
	is.True(st.Feed([]byte(`{"name":"Al"`)))
	is.True(!st.Feed([]byte(`}`))) // kind is required
	is.True(st.Accepts([]byte(`,"kind":"person"}`)))
	is.True(!st.AcceptsByte('}'))
	is.True(st.Feed([]byte(`,"kind":"person"}`)))
	is.True(st.Complete())
}

func TestCompileSchemaRefusals(t *testing.T) {
	for _, tc := range []struct{ schema, want string }{
		{`{"type":"object","properties":{"a":{"type":"string","pattern":"x+"}}}`, `schema.properties.a: keyword "pattern" is not supported`},
		{`{"type":"object","properties":{"a":{"$ref":"#/$defs/x"}}}`, `"#/$defs/x" is not supported`},
		{`{"type":"object","properties":{"a":{"$ref":"http://x/y"}}}`, `"http://x/y" is not supported`},
		{`{"$defs":{"N":{"type":"object","properties":{"next":{"$ref":"#/$defs/N"}}}},"$ref":"#/$defs/N"}`, "recursive schemas are not supported"},
		{`{"$defs":{"N":{"type":"object"}},"type":"object","properties":{"a":{"$ref":"#/$defs/N","type":"object"}}}`, `keyword "type" next to $ref`},
		{`{"type":"object","properties":{"a":{"type":"string","format":"date"}}}`, `keyword "format" is not supported`},
		{`{"type":"string"}`, "root must be an object"},
		{`{"type":"object","required":["a"],"properties":{}}`, `"a" is not in properties`},
		{`{"type":"object","properties":{"a":{"anyOf":[{"type":"object"},{"type":"object"}]}}}`, "branches that accept the same type"},
		{`{"type":"object","properties":{"a":{"enum":[[1]]}}}`, "objects or arrays are not supported"},
		{`{"type":"object","additionalProperties":{"type":"string"}}`, "only true or false"},
		{`{"type":"object","properties":{"a":{"type":"integer","minimum":5,"maximum":1}}}`, "admit nothing"},
		{`{"type":"object","properties":{"a":{"type":"thing"}}}`, `unknown type "thing"`},
	} {
		t.Run(tc.want, func(t *testing.T) {
			is := is.New(t)
			_, err := CompileSchema([]byte(tc.schema))
			is.True(err != nil)
			is.True(strings.Contains(err.Error(), tc.want)) // names the culprit
		})
	}
}

// FuzzSchemaState feeds arbitrary bytes one at a time: the state never
// panics, and whatever it calls complete is JSON that personSchema admits.
func FuzzSchemaState(f *testing.F) {
	for _, s := range []string{
		`{"name":"Al","kind":"person"}`,
		`{"name": "Alice", "age": 30, "role": null, "tags": ["a","b"], "score": 0.5, "kind": "person", "extra": {"any": [1]}}`,
		`{"name":"Al","age":-0,"score":null,"kind":"person"}`,
		`{"name":"A\u00e9","kind":"person","extra":{}}`,
	} {
		f.Add([]byte(s))
	}
	schema, err := CompileSchema([]byte(personSchema))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		st := NewSchemaState(schema, 40)
		var text []byte
		for _, c := range b {
			if st.Feed([]byte{c}) {
				text = append(text, c)
			}
		}
		if !st.Complete() {
			return
		}
		var v struct {
			Name  *string         `json:"name"`
			Age   *float64        `json:"age"`
			Role  json.RawMessage `json:"role"`
			Tags  *[]string       `json:"tags"`
			Score json.RawMessage `json:"score"`
			Kind  *string         `json:"kind"`
			Extra json.RawMessage `json:"extra"`
		}
		if err := json.Unmarshal(text, &v); err != nil {
			t.Fatalf("complete %q is not JSON of the schema's shape: %v", text, err)
		}
		switch {
		case v.Name == nil || len([]rune(*v.Name)) < 2 || len([]rune(*v.Name)) > 5:
			t.Fatalf("%q: name", text)
		case v.Kind == nil || *v.Kind != "person":
			t.Fatalf("%q: kind", text)
		case v.Age != nil && (*v.Age != float64(int(*v.Age)) || *v.Age < 0 || *v.Age > 150):
			t.Fatalf("%q: age", text)
		case v.Role != nil && !slices.Contains([]string{`"admin"`, `"user"`, `null`}, string(v.Role)):
			t.Fatalf("%q: role", text)
		case v.Tags != nil && (len(*v.Tags) < 1 || len(*v.Tags) > 2):
			t.Fatalf("%q: tags", text)
		}
		if v.Score != nil && string(v.Score) != "null" {
			var x float64
			if json.Unmarshal(v.Score, &x) != nil || x <= 0 {
				t.Fatalf("%q: score", text)
			}
		}
	})
}
