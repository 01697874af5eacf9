package chat

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"

	"github.com/dflash/dflash_server/sdk"
)

// valueKind is how a tool-call parameter value becomes JSON.
type valueKind uint8

const (
	vkUnset   valueKind = iota
	vkAuto              // no schema: JSON literals as such, anything else a string
	vkString            // streamed as a JSON string
	vkInt               // integer
	vkNumber            // number
	vkBool              // boolean
	vkJSON              // object or array
	vkRawJSON           // DSML string="false": JSON text, checked
)

// paramTypes maps tool name → parameter name → kind, from the schemas.
type paramTypes map[string]map[string]valueKind

func newParamTypes(tools []sdk.Tool) paramTypes {
	if len(tools) == 0 {
		return nil
	}
	pt := make(paramTypes, len(tools))
	for _, t := range tools {
		var schema struct {
			Properties map[string]json.RawMessage `json:"properties"`
		}
		if json.Unmarshal(t.Parameters, &schema) != nil || schema.Properties == nil {
			continue
		}
		kinds := make(map[string]valueKind, len(schema.Properties))
		for name, prop := range schema.Properties {
			kinds[name] = kindOfSchema(prop)
		}
		pt[t.Name] = kinds
	}
	return pt
}

// kind types a parameter: by its schema; a parameter the schema lacks is a
// string (as vLLM's qwen3_coder parser has it); a tool without a schema
// guesses from the value.
func (pt paramTypes) kind(tool, param string) valueKind {
	props, ok := pt[tool]
	if !ok {
		return vkAuto
	}
	if k, ok := props[param]; ok {
		return k
	}
	return vkString
}

func kindOfSchema(raw json.RawMessage) valueKind {
	var s struct {
		Type json.RawMessage `json:"type"`
		Enum []any           `json:"enum"`
	}
	if json.Unmarshal(raw, &s) != nil {
		return vkAuto
	}
	var types []string
	var one string
	if json.Unmarshal(s.Type, &one) == nil {
		types = []string{one}
	} else {
		_ = json.Unmarshal(s.Type, &types)
	}
	for _, t := range types {
		switch strings.ToLower(t) {
		case "string", "str", "text", "varchar", "char", "enum":
			return vkString
		case "integer", "int":
			return vkInt
		case "number", "float", "double":
			return vkNumber
		case "boolean", "bool":
			return vkBool
		case "object", "array", "dict", "list":
			return vkJSON
		}
	}
	if len(types) == 0 && len(s.Enum) > 0 {
		if _, ok := s.Enum[0].(string); ok {
			return vkString
		}
	}
	return vkAuto
}

// convertValue renders a parameter value as JSON for its kind, falling back
// to a JSON string when the text does not fit the kind.
func convertValue(k valueKind, s string) string {
	t := strings.TrimSpace(s)
	if k != vkString && (t == "null" || t == "None") {
		return "null"
	}
	switch k {
	case vkInt:
		if n, err := strconv.ParseInt(t, 10, 64); err == nil {
			return strconv.FormatInt(n, 10)
		}
		if f, err := strconv.ParseFloat(t, 64); err == nil && f == math.Trunc(f) && math.Abs(f) < 1<<53 {
			return strconv.FormatInt(int64(f), 10)
		}
	case vkNumber:
		if t != "" && t[0] != '"' && json.Valid([]byte(t)) {
			if _, err := strconv.ParseFloat(t, 64); err == nil {
				return t
			}
		}
		if f, err := strconv.ParseFloat(t, 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
			return strconv.FormatFloat(f, 'g', -1, 64)
		}
	case vkBool:
		switch strings.ToLower(t) {
		case "true":
			return "true"
		case "false":
			return "false"
		}
	case vkJSON:
		if t != "" && (t[0] == '{' || t[0] == '[') && json.Valid([]byte(t)) {
			return compactJSON(t)
		}
	case vkAuto, vkRawJSON:
		switch t {
		case "True":
			return "true"
		case "False":
			return "false"
		}
		if t != "" && t[0] != '"' && json.Valid([]byte(t)) {
			return compactJSON(t)
		}
	}
	return jsonString(s)
}
