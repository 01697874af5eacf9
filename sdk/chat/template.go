package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/dflash/dflash_server/sdk"
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
	vars := make(map[string]jinja.Value, 8+len(opts.Extra))
	for k, v := range opts.Extra {
		vars[k] = goValue(v)
	}
	if opts.BOSToken != "" {
		vars["bos_token"] = jinja.NewString(opts.BOSToken)
	}
	if opts.EOSToken != "" {
		vars["eos_token"] = jinja.NewString(opts.EOSToken)
	}
	if opts.EnableThinking != nil {
		vars["enable_thinking"] = jinja.NewBool(*opts.EnableThinking)
	}
	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		v, err := messageValue(m)
		if err != nil {
			return "", fmt.Errorf("message %d (%s): %w", i, m.Role, err)
		}
		list[i] = v
	}
	vars["messages"] = jinja.NewList(list)
	vars["tools"] = jinja.None()
	if len(opts.Tools) > 0 {
		tools := make([]jinja.Value, len(opts.Tools))
		for i, tl := range opts.Tools {
			v, err := toolValue(tl)
			if err != nil {
				return "", fmt.Errorf("tool %q: %w", tl.Name, err)
			}
			tools[i] = v
		}
		vars["tools"] = jinja.NewList(tools)
	}
	vars["documents"] = jinja.None()
	vars["add_generation_prompt"] = jinja.NewBool(opts.AddGenerationPrompt)

	out, err := t.tmpl.RenderValues(vars)
	if err != nil {
		return "", fmt.Errorf("render chat template: %w", err)
	}
	return out, nil
}

// messageValue builds the dict a template reads for one message. The keys
// and their order mirror to_template_message in
// test/parity/chat/make_goldens.py.
func messageValue(m sdk.Message) (jinja.Value, error) {
	d := jinja.NewDict()
	dict := d.AsDict()
	dict.Set("role", jinja.NewString(m.Role))
	dict.Set("content", jinja.NewString(m.Content))
	if m.ReasoningContent != "" {
		dict.Set("reasoning_content", jinja.NewString(m.ReasoningContent))
	}
	if len(m.ToolCalls) > 0 {
		calls := make([]jinja.Value, len(m.ToolCalls))
		for i, tc := range m.ToolCalls {
			fn := jinja.NewDict()
			fn.AsDict().Set("name", jinja.NewString(tc.Name))
			fn.AsDict().Set("arguments", argumentsValue(tc.Arguments))
			c := jinja.NewDict()
			c.AsDict().Set("id", jinja.NewString(tc.ID))
			c.AsDict().Set("type", jinja.NewString("function"))
			c.AsDict().Set("function", fn)
			calls[i] = c
		}
		dict.Set("tool_calls", jinja.NewList(calls))
	}
	if m.ToolCallID != "" {
		dict.Set("tool_call_id", jinja.NewString(m.ToolCallID))
	}
	if m.Name != "" {
		dict.Set("name", jinja.NewString(m.Name))
	}
	return d, nil
}

// argumentsValue gives templates a mapping for a JSON-object argument
// string, as HF-compatible servers do (templates iterate arguments|items or
// pipe them through tojson); anything else stays the raw string.
func argumentsValue(text string) jinja.Value {
	if strings.TrimSpace(text) == "" {
		return jinja.NewDict()
	}
	v, err := decodeOrdered([]byte(text))
	if err != nil || !v.IsDict() {
		return jinja.NewString(text)
	}
	return v
}

func toolValue(t sdk.Tool) (jinja.Value, error) {
	fn := jinja.NewDict()
	fn.AsDict().Set("name", jinja.NewString(t.Name))
	if t.Description != "" {
		fn.AsDict().Set("description", jinja.NewString(t.Description))
	}
	if len(bytes.TrimSpace(t.Parameters)) > 0 {
		p, err := decodeOrdered(t.Parameters)
		if err != nil {
			return jinja.Value{}, fmt.Errorf("parameters: %w", err)
		}
		fn.AsDict().Set("parameters", p)
	}
	d := jinja.NewDict()
	d.AsDict().Set("type", jinja.NewString("function"))
	d.AsDict().Set("function", fn)
	return d, nil
}

// decodeOrdered decodes JSON keeping object key order and the int/float
// distinction of Python's json.loads, both of which show in tojson output.
func decodeOrdered(data []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return jinja.Value{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return jinja.Value{}, errors.New("invalid JSON: data after the value")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Value{}, fmt.Errorf("invalid JSON: %w", err)
	}
	switch x := tok.(type) {
	case json.Delim:
		switch x {
		case '{':
			d := jinja.NewDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return jinja.Value{}, fmt.Errorf("invalid JSON: %w", err)
				}
				key, _ := kt.(string)
				v, err := decodeValue(dec)
				if err != nil {
					return jinja.Value{}, err
				}
				d.AsDict().Set(key, v)
			}
			if _, err := dec.Token(); err != nil {
				return jinja.Value{}, fmt.Errorf("invalid JSON: %w", err)
			}
			return d, nil
		case '[':
			var items []jinja.Value
			for dec.More() {
				v, err := decodeValue(dec)
				if err != nil {
					return jinja.Value{}, err
				}
				items = append(items, v)
			}
			if _, err := dec.Token(); err != nil {
				return jinja.Value{}, fmt.Errorf("invalid JSON: %w", err)
			}
			return jinja.NewList(items), nil
		}
		return jinja.Value{}, fmt.Errorf("invalid JSON: unexpected %v", x)
	case json.Number:
		return jinja.FromGoValue(x), nil
	case string:
		return jinja.NewString(x), nil
	case bool:
		return jinja.NewBool(x), nil
	case nil:
		return jinja.None(), nil
	}
	return jinja.Value{}, fmt.Errorf("invalid JSON: unexpected token %v", tok)
}

// goValue converts chat_template_kwargs values. encoding/json decodes every
// number as float64; an integral one becomes an int, as Python would read it.
func goValue(v any) jinja.Value {
	switch x := v.(type) {
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return jinja.NewInt(int64(x))
		}
		return jinja.NewFloat(x)
	case float32:
		return goValue(float64(x))
	case []any:
		items := make([]jinja.Value, len(x))
		for i, it := range x {
			items[i] = goValue(it)
		}
		return jinja.NewList(items)
	case map[string]any:
		d := jinja.FromGoValue(map[string]any{}) // empty ordered dict
		for _, k := range sortedKeys(x) {
			d.AsDict().Set(k, goValue(x[k]))
		}
		return d
	case json.RawMessage:
		if val, err := decodeOrdered(x); err == nil {
			return val
		}
		return jinja.NewString(string(x))
	}
	return jinja.FromGoValue(v)
}
