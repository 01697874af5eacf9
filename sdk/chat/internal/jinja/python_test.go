package jinja

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/matryer/is"
)

func pythonVars() map[string]any {
	inner := NewDict()
	inner.Set("x", "y")
	d := NewDict()
	d.Set("b", int64(1))
	d.Set("a", List{int64(1), inner})
	return map[string]any{
		"f": 3.0, "big": 1234567.0, "tiny": 1e-7, "huge": 1e16, "n": nil,
		"l": List{int64(1), "a", nil, true, 2.5}, "d": d,
		"s": "  Hello, World  ", "q": `it's "q"`, "u": "Grüße 👋",
	}
}

// TestPythonSemantics renders small templates whose expected output came
// from Python Jinja2 (testdata/python_cases.json).
func TestPythonSemantics(t *testing.T) {
	data, err := os.ReadFile("testdata/python_cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var suite struct {
		Cases []struct {
			Src string  `json:"src"`
			Out *string `json:"out"`
			Err string  `json:"err"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(data, &suite); err != nil {
		t.Fatal(err)
	}
	for _, c := range suite.Cases {
		t.Run(c.Src, func(t *testing.T) {
			is := is.New(t)
			tmpl, err := Compile(c.Src)
			is.NoErr(err)
			got, err := tmpl.Render(pythonVars())
			if c.Out == nil {
				is.True(err != nil) // Python raised c.Err
				return
			}
			is.NoErr(err)
			is.Equal(got, *c.Out)
		})
	}
}

func TestCompileErrors(t *testing.T) {
	for _, src := range []string{
		"{% if x %}",
		"{{ x ",
		"{% for %}{% endfor %}",
		"{% unknown %}",
		"{{ 'unterminated }}",
		"{% endif %}",
		"{{ a b }}",
	} {
		t.Run(src, func(t *testing.T) {
			is := is.New(t)
			_, err := Compile(src)
			is.True(err != nil)
		})
	}
}

func TestUnknownFilterOnlyFailsWhenUsed(t *testing.T) {
	is := is.New(t)
	tmpl, err := Compile("{% if false %}{{ x | from_json }}{% endif %}ok")
	is.NoErr(err)
	out, err := tmpl.Render(nil)
	is.NoErr(err)
	is.Equal(out, "ok")
}
