package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// limits bound what a request body may hold, before the router sees it.
type limits struct {
	maxBody     int64
	bodyTimeout time.Duration
	maxDepth    int
	maxMessages int
	maxTokens   int
}

// readBody reads the whole body under the byte limit.
func readBody(w http.ResponseWriter, r *http.Request, lim limits) ([]byte, *apiError) {
	// The server's header timeout ends with the headers; without a deadline
	// here a client trickling its body holds the connection for ever.
	clearDeadline := func() {}
	if lim.bodyTimeout > 0 {
		rc := http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(lim.bodyTimeout)) == nil {
			clearDeadline = func() { _ = rc.SetReadDeadline(time.Time{}) }
		}
	}
	body := http.MaxBytesReader(w, r.Body, lim.maxBody)
	b, err := io.ReadAll(body)
	if err != nil {
		// The deadline stays after a failed read, so the server's discard
		// of the unread rest of the body cannot block either.
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, &apiError{status: http.StatusRequestEntityTooLarge, code: "request_too_large",
				message: fmt.Sprintf("request body is larger than the limit of %d bytes", tooBig.Limit)}
		}
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			return nil, &apiError{status: http.StatusRequestTimeout, code: "request_timeout",
				message: fmt.Sprintf("the request body did not arrive within %s", lim.bodyTimeout)}
		}
		return nil, badRequest("", "read request body: %v", err)
	}
	// The server's background read, which notices a client leaving
	// mid-stream, inherits the deadline: it must go once the body is in.
	clearDeadline()
	return b, nil
}

// decodeJSON parses b into v after checking its nesting depth: encoding/json
// recurses without bound, so a deeply nested body is refused up front.
func decodeJSON(b []byte, lim limits, v any) *apiError {
	if len(bytes.TrimSpace(b)) == 0 {
		return badRequest("", "request body is empty; expected a JSON object")
	}
	if err := checkDepth(b, lim.maxDepth); err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return jsonError(err)
	}
	return nil
}

// checkDepth refuses JSON nested deeper than max objects/arrays. It does not
// validate the JSON; json.Unmarshal does that afterwards.
func checkDepth(b []byte, max int) *apiError {
	depth := 0
	inString := false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			depth++
			if depth > max {
				return badRequest("", "JSON is nested deeper than %d levels (at byte offset %d)", max, i)
			}
		case '}', ']':
			depth--
		}
	}
	return nil
}

// jsonError turns an encoding/json error into a 400 that names the field.
func jsonError(err error) *apiError {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return &apiError{status: http.StatusBadRequest, code: "invalid_json",
			message: fmt.Sprintf("invalid JSON at byte offset %d: %v", syn.Offset, syn)}
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			return &apiError{status: http.StatusBadRequest, code: "invalid_json",
				message: fmt.Sprintf("request body must be a JSON object, not %s", typ.Value)}
		}
		return badRequest(field, "%s: expected %s, got %s", field, jsonTypeName(typ.Type.String()), typ.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &apiError{status: http.StatusBadRequest, code: "invalid_json", message: "invalid JSON: unexpected end of input"}
	}
	return &apiError{status: http.StatusBadRequest, code: "invalid_json", message: "invalid JSON: " + err.Error()}
}

// jsonTypeName says a Go type in JSON words.
func jsonTypeName(goType string) string {
	t := strings.TrimPrefix(goType, "*")
	switch {
	case t == "string":
		return "a string"
	case t == "bool":
		return "a boolean"
	case strings.HasPrefix(t, "int") || strings.HasPrefix(t, "uint"):
		return "an integer"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case strings.HasPrefix(t, "[]"):
		return "an array"
	case strings.HasPrefix(t, "map[") || strings.HasPrefix(t, "api."):
		return "an object"
	}
	return t
}

// rawKind is the JSON kind of a raw value: 'n'ull, 's'tring, 'a'rray,
// 'o'bject, 'b'oolean, 'd'igit (number), or 0 for absent.
func rawKind(r json.RawMessage) byte {
	t := bytes.TrimLeft(r, " \t\r\n")
	if len(t) == 0 {
		return 0
	}
	switch t[0] {
	case 'n':
		return 'n'
	case '"':
		return 's'
	case '[':
		return 'a'
	case '{':
		return 'o'
	case 't', 'f':
		return 'b'
	}
	return 'd'
}

func kindName(k byte) string {
	switch k {
	case 'n':
		return "null"
	case 's':
		return "a string"
	case 'a':
		return "an array"
	case 'o':
		return "an object"
	case 'b':
		return "a boolean"
	case 'd':
		return "a number"
	}
	return "nothing"
}

// rawString decodes a value already known to be a JSON string.
func rawString(r json.RawMessage, field string) (string, *apiError) {
	var s string
	if err := json.Unmarshal(r, &s); err != nil {
		return "", badRequest(field, "%s: %v", field, err)
	}
	return s, nil
}

// compactObject re-encodes a value already known to be a JSON object as
// compact JSON text.
func compactObject(r json.RawMessage, field string) (string, *apiError) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, r); err != nil {
		return "", badRequest(field, "%s: %v", field, err)
	}
	return buf.String(), nil
}

// stringOrStrings decodes a field that is a string or an array of strings
// (OpenAI "stop").
func stringOrStrings(r json.RawMessage, field string) ([]string, *apiError) {
	switch rawKind(r) {
	case 0, 'n':
		return nil, nil
	case 's':
		s, err := rawString(r, field)
		if err != nil {
			return nil, err
		}
		return []string{s}, nil
	case 'a':
		var ss []string
		if err := json.Unmarshal(r, &ss); err != nil {
			return nil, badRequest(field, "%s: expected an array of strings", field)
		}
		return ss, nil
	}
	return nil, badRequest(field, "%s: expected a string or an array of strings, got %s", field, kindName(rawKind(r)))
}

// index names an element of an array field in error messages.
func index(field string, i int) string { return field + "[" + strconv.Itoa(i) + "]" }

// argumentsString accepts tool-call arguments as the JSON-encoded string the
// APIs specify, and also as a bare object, which some clients send.
func argumentsString(r json.RawMessage, field string) (string, *apiError) {
	switch rawKind(r) {
	case 0, 'n':
		return "", nil
	case 's':
		return rawString(r, field)
	case 'o':
		return compactObject(r, field)
	}
	return "", badRequest(field, "%s: expected a JSON-encoded string, got %s", field, kindName(rawKind(r)))
}
