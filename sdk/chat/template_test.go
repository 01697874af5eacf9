package chat

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
)

func TestTemplateErrors(t *testing.T) {
	is := is.New(t)
	_, err := NewTemplate("  ")
	is.True(err != nil)
	_, err = NewTemplate("{% if x %}")
	is.True(err != nil)

	tmpl, err := NewTemplate("{{ tools | tojson }}")
	is.NoErr(err)
	_, err = tmpl.Render(nil, RenderOptions{Tools: []sdk.Tool{{Name: "bad", Parameters: json.RawMessage(`{"x":`)}}})
	is.True(err != nil && strings.Contains(err.Error(), `tool "bad"`))

	tmpl, err = NewTemplate("{{ raise_exception('no user message') }}")
	is.NoErr(err)
	_, err = tmpl.Render(nil, RenderOptions{})
	is.True(err != nil && strings.Contains(err.Error(), "no user message"))
}

func TestRenderValues(t *testing.T) {
	tmpl, err := NewTemplate(`{{ n }} {{ f }} {{ enable_thinking }} {{ bos_token is defined }} {{ tools }}` +
		`{% for m in messages %}|{{ m.tool_calls[0].function.arguments | tojson }}{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	on := true
	cases := []struct {
		name string
		args string
		want string
	}{
		{"object kept in order", `{"b": 1, "a": [1.0, null]}`, `3 2.5 True False None|{"b": 1, "a": [1.0, null]}`},
		{"empty is an empty object", ``, `3 2.5 True False None|{}`},
		{"non-object stays a string", `[1, 2]`, `3 2.5 True False None|"[1, 2]"`},
		{"broken JSON stays a string", `{"a": `, `3 2.5 True False None|"{\"a\": "`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			is := is.New(t)
			msgs := []sdk.Message{{Role: "assistant", ToolCalls: []sdk.ToolCall{{ID: "1", Name: "f", Arguments: c.args}}}}
			got, err := tmpl.Render(msgs, RenderOptions{EnableThinking: &on,
				Extra: map[string]any{"n": float64(3), "f": 2.5, "enable_thinking": false}})
			is.NoErr(err)
			is.Equal(got, c.want)
		})
	}
}
