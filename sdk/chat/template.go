package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/chat/internal/jinja"
)

// Template is a compiled chat template. It is safe for concurrent use.
type Template struct {
	src  string
	tmpl *jinja.Template
}

// NewTemplate compiles a Jinja chat template (the GGUF's
// tokenizer.chat_template or an operator-supplied file).
func NewTemplate(source string) (*Template, error) {
	if strings.TrimSpace(source) == "" {
		return nil, errors.New("compile chat template: template is empty")
	}
	t, err := jinja.Compile(source)
	if err != nil {
		return nil, fmt.Errorf("compile chat template: %w", err)
	}
	return &Template{src: source, tmpl: t}, nil
}

// Source returns the template text.
func (t *Template) Source() string { return t.src }

// RenderOptions are the template variables besides the messages.
type RenderOptions struct {
	// Tools are rendered into the prompt; none means the template sees
	// tools = None, as with transformers when no tools are passed.
	Tools []sdk.Tool
	// AddGenerationPrompt appends the assistant header (and, per template,
	// the opening or closed thinking block).
	AddGenerationPrompt bool
	// EnableThinking sets the template's enable_thinking; nil leaves it
	// undefined so the template's default applies. It wins over Extra.
	EnableThinking *bool
	// Extra holds chat_template_kwargs (preserve_thinking, reasoning_effort,
	// …); values are JSON-like Go values.
	Extra map[string]any
	// BOSToken and EOSToken are the tokenizer's special-token strings,
	// passed as bos_token / eos_token when not empty.
	BOSToken string
	EOSToken string
}

// Render renders a conversation to prompt text. The variables match what
// transformers' apply_chat_template passes, so output is byte-identical to it.
func (t *Template) Render(msgs []sdk.Message, opts RenderOptions) (string, error) {
	vars := make(map[string]any, 8+len(opts.Extra))
	for k, v := range opts.Extra {
		vars[k] = goValue(v)
	}
	if opts.BOSToken != "" {
		vars["bos_token"] = opts.BOSToken
	}
	if opts.EOSToken != "" {
		vars["eos_token"] = opts.EOSToken
	}
	if opts.EnableThinking != nil {
		vars["enable_thinking"] = *opts.EnableThinking
	}
	list := make(jinja.List, len(msgs))
	for i, m := range msgs {
		list[i] = messageValue(m)
	}
	vars["messages"] = list
	vars["tools"] = nil
	if len(opts.Tools) > 0 {
		tools := make(jinja.List, len(opts.Tools))
		for i, tl := range opts.Tools {
			v, err := toolValue(tl)
			if err != nil {
				return "", fmt.Errorf("tool %q: %w", tl.Name, err)
			}
			tools[i] = v
		}
		vars["tools"] = tools
	}
	vars["documents"] = nil
	vars["add_generation_prompt"] = opts.AddGenerationPrompt

	out, err := t.tmpl.Render(vars)
	if err != nil {
		return "", fmt.Errorf("render chat template: %w", err)
	}
	return out, nil
}

// messageValue builds the dict a template reads for one message. The keys
// and their order mirror to_template_message in
// test/parity/chat/make_goldens.py.
func messageValue(m sdk.Message) *jinja.Dict {
	d := jinja.NewDict()
	d.Set("role", m.Role)
	d.Set("content", m.Content)
	if m.ReasoningContent != "" {
		d.Set("reasoning_content", m.ReasoningContent)
	}
	if len(m.ToolCalls) > 0 {
		calls := make(jinja.List, len(m.ToolCalls))
		for i, tc := range m.ToolCalls {
			fn := jinja.NewDict()
			fn.Set("name", tc.Name)
			fn.Set("arguments", argumentsValue(tc.Arguments))
			c := jinja.NewDict()
			c.Set("id", tc.ID)
			c.Set("type", "function")
			c.Set("function", fn)
			calls[i] = c
		}
		d.Set("tool_calls", calls)
	}
	if m.ToolCallID != "" {
		d.Set("tool_call_id", m.ToolCallID)
	}
	if m.Name != "" {
		d.Set("name", m.Name)
	}
	return d
}

// argumentsValue gives templates a mapping for a JSON-object argument
// string, as HF-compatible servers do (templates iterate arguments|items or
// pipe them through tojson); anything else stays the raw string.
func argumentsValue(text string) any {
	if strings.TrimSpace(text) == "" {
		return jinja.NewDict()
	}
	v, err := decodeOrdered([]byte(text))
	if d, ok := v.(*jinja.Dict); ok && err == nil {
		return d
	}
	return text
}

func toolValue(t sdk.Tool) (*jinja.Dict, error) {
	fn := jinja.NewDict()
	fn.Set("name", t.Name)
	if t.Description != "" {
		fn.Set("description", t.Description)
	}
	if len(bytes.TrimSpace(t.Parameters)) > 0 {
		p, err := decodeOrdered(t.Parameters)
		if err != nil {
			return nil, fmt.Errorf("parameters: %w", err)
		}
		fn.Set("parameters", p)
	}
	d := jinja.NewDict()
	d.Set("type", "function")
	d.Set("function", fn)
	return d, nil
}

// decodeOrdered decodes JSON keeping object key order and the int/float
// distinction of Python's json.loads, both of which show in tojson output.
func decodeOrdered(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("invalid JSON: data after the value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	switch x := tok.(type) {
	case json.Delim:
		switch x {
		case '{':
			d := jinja.NewDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, fmt.Errorf("invalid JSON: %w", err)
				}
				key, _ := kt.(string)
				v, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				d.Set(key, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, fmt.Errorf("invalid JSON: %w", err)
			}
			return d, nil
		case '[':
			items := jinja.List{}
			for dec.More() {
				v, err := decodeValue(dec)
				if err != nil {
					return nil, err
				}
				items = append(items, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, fmt.Errorf("invalid JSON: %w", err)
			}
			return items, nil
		}
		return nil, fmt.Errorf("invalid JSON: unexpected %v", x)
	case json.Number:
		// Python's json.loads: no '.', 'e' or 'E' means int.
		if !strings.ContainsAny(string(x), ".eE") {
			if n, err := x.Int64(); err == nil {
				return n, nil
			}
		}
		f, err := x.Float64()
		if err != nil {
			return nil, fmt.Errorf("invalid JSON number %s: %w", x, err)
		}
		return f, nil
	case string, bool, nil:
		return x, nil
	}
	return nil, fmt.Errorf("invalid JSON: unexpected token %v", tok)
}

// goValue converts chat_template_kwargs values. encoding/json decodes every
// number as float64; an integral one becomes an int, as Python would read it.
func goValue(v any) any {
	switch x := v.(type) {
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return int64(x)
		}
		return x
	case float32:
		return goValue(float64(x))
	case int:
		return int64(x)
	case []any:
		items := make(jinja.List, len(x))
		for i, it := range x {
			items[i] = goValue(it)
		}
		return items
	case map[string]any:
		d := jinja.NewDict()
		for _, k := range sortedKeys(x) {
			d.Set(k, goValue(x[k]))
		}
		return d
	case json.Number:
		if v, err := decodeOrdered([]byte(x)); err == nil {
			return v
		}
		return string(x)
	case json.RawMessage:
		if val, err := decodeOrdered(x); err == nil {
			return val
		}
		return string(x)
	}
	return v
}
