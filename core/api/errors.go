package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/dflash/dflash_server/core/router"
	"github.com/dflash/dflash_server/sdk"
)

// shape is the error and body convention of a route family.
type shape int

const (
	shapeOpenAI shape = iota
	shapeAnthropic
)

// shapeOf picks the error shape by path, so that 404, 405, 401 and panics
// on Anthropic routes still answer in Anthropic's shape.
func shapeOf(path string) shape {
	if path == "/v1/messages" || strings.HasPrefix(path, "/v1/messages/") {
		return shapeAnthropic
	}
	return shapeOpenAI
}

// apiError is an answer that fails a request before any byte of the response
// was written. It renders in either API's error shape.
type apiError struct {
	status int
	// kind is the OpenAI error "type"; empty means derived from status.
	kind    string
	code    string // OpenAI "code"; empty renders null
	param   string // OpenAI "param"; empty renders null
	message string
	// retryAfter > 0 adds a Retry-After header (whole seconds, rounded up).
	retryAfter time.Duration
	// reason is the routing refusal reason for X-Dflash-Reject-Reason.
	reason string
}

func (e *apiError) Error() string { return e.message }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, code: "invalid_value", param: param, message: fmt.Sprintf(format, args...)}
}

func missingParam(param string) *apiError {
	return &apiError{status: http.StatusBadRequest, code: "missing_required_parameter", param: param,
		message: fmt.Sprintf("%s is required", param)}
}

func unsupported(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, code: "unsupported_parameter", param: param, message: fmt.Sprintf(format, args...)}
}

func internalError(format string, args ...any) *apiError {
	return &apiError{status: http.StatusInternalServerError, code: "internal_error", message: fmt.Sprintf(format, args...)}
}

// backendFailure is the error a generation that failed in the backend
// answers with, in every API and in-band in a chat stream.
func backendFailure(err error) *apiError {
	return &apiError{status: http.StatusInternalServerError, kind: "server_error", code: "backend_error", message: err.Error()}
}

// openAIType is the OpenAI error "type" of e.
func (e *apiError) openAIType() string {
	if e.kind != "" {
		return e.kind
	}
	switch {
	case e.status == http.StatusUnauthorized:
		return "authentication_error"
	case e.status == http.StatusForbidden:
		return "permission_error"
	case e.status == http.StatusTooManyRequests:
		return "rate_limit_error"
	case e.status == http.StatusServiceUnavailable || e.status == 529:
		// llama.cpp's precedent for "try again later".
		return "unavailable_error"
	case e.status >= 500:
		return "server_error"
	}
	return "invalid_request_error"
}

// anthropicType is the Anthropic error.type of e (docs.claude.com/en/api/errors).
func (e *apiError) anthropicType() string {
	switch e.status {
	case http.StatusUnauthorized:
		return "authentication_error"
	case http.StatusForbidden:
		return "permission_error"
	case http.StatusNotFound:
		return "not_found_error"
	case http.StatusRequestEntityTooLarge:
		return "request_too_large"
	case http.StatusTooManyRequests:
		return "rate_limit_error"
	case http.StatusServiceUnavailable, 529:
		return "overloaded_error"
	}
	if e.status >= 500 {
		return "api_error"
	}
	return "invalid_request_error"
}

type openAIErrorBody struct {
	Error openAIErrorObject `json:"error"`
}

type openAIErrorObject struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

type anthropicErrorBody struct {
	Type      string               `json:"type"`
	Error     anthropicErrorObject `json:"error"`
	RequestID string               `json:"request_id,omitempty"`
}

type anthropicErrorObject struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (e *apiError) openAIObject() openAIErrorObject {
	return openAIErrorObject{Message: e.message, Type: e.openAIType(), Param: nullable(e.param), Code: nullable(e.code)}
}

// body renders e in the given shape.
func (e *apiError) body(sh shape, requestID string) any {
	if sh == shapeAnthropic {
		return anthropicErrorBody{Type: "error", Error: anthropicErrorObject{Type: e.anthropicType(), Message: e.message}, RequestID: requestID}
	}
	return openAIErrorBody{Error: e.openAIObject()}
}

// retryAfterSeconds rounds d up to whole seconds, at least 1: clients read
// Retry-After as an integer delay.
func retryAfterSeconds(d time.Duration) string {
	s := int64(math.Ceil(d.Seconds()))
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(s, 10)
}

// rejectReasonHeader carries the routing refusal reason in the dashed form of
// llm-d's drop-reason header, so gateway logs explain a shed request.
const rejectReasonHeader = "X-Dflash-Reject-Reason"

// writeError answers e in shape sh. Callers guarantee nothing was written yet.
func writeError(w http.ResponseWriter, sh shape, requestID string, e *apiError) {
	h := w.Header()
	if e.retryAfter > 0 {
		h.Set("Retry-After", retryAfterSeconds(e.retryAfter))
	}
	if e.reason != "" {
		h.Set(rejectReasonHeader, strings.ReplaceAll(e.reason, "_", "-"))
	}
	writeJSON(w, e.status, e.body(sh, requestID))
}

// writeJSON writes v as the whole response body with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"message":"encode response","type":"server_error","param":null,"code":"internal_error"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// marshal encodes v as compact JSON without HTML escaping: model output often
// holds <, > and &, and clients must see them as written.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte{'\n'}), nil
}

// rejectionAnswer is how the HTTP APIs answer one kind of routing refusal.
type rejectionAnswer struct {
	status     int
	retryAfter time.Duration // > 0 sends Retry-After
	// kind, code and param are the OpenAI error type, code and param.
	kind, code, param string
	// overload refusals follow Options.OverloadStatus.
	overload bool
}

// unavailableRetry is the Retry-After of every 503: capacity turns over in
// seconds, and a plugin restart takes about that long too.
const unavailableRetry = time.Second

// rejectionAnswers is the one table from router reasons to HTTP.
var rejectionAnswers = map[router.Reason]rejectionAnswer{
	router.ReasonQueueFull:          {http.StatusServiceUnavailable, unavailableRetry, "unavailable_error", "queue_full", "", true},
	router.ReasonQueueTimeout:       {http.StatusServiceUnavailable, unavailableRetry, "unavailable_error", "queue_timeout", "", true},
	router.ReasonShuttingDown:       {http.StatusServiceUnavailable, unavailableRetry, "unavailable_error", "shutting_down", "", false},
	router.ReasonBackendUnavailable: {http.StatusServiceUnavailable, unavailableRetry, "unavailable_error", "backend_unavailable", "", false},
	router.ReasonNeverFits:          {http.StatusBadRequest, 0, "invalid_request_error", "context_length_exceeded", "", false},
	router.ReasonInvalidRequest:     {http.StatusBadRequest, 0, "invalid_request_error", "invalid_value", "", false},
	router.ReasonUnknownModel:       {http.StatusNotFound, 0, "invalid_request_error", "model_not_found", "model", false},
	router.ReasonModelRequired:      {http.StatusBadRequest, 0, "invalid_request_error", "model_required", "model", false},
}

// errorFor turns any error from the router into the answer for route shape
// sh. Routing refusals keep their status and reason; anything else is a 500.
func (s *Server) errorFor(err error, sh shape) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	var inv *sdk.InvalidError
	if errors.As(err, &inv) {
		// A plugin refused what the client sent (e.g. a token id outside
		// the vocabulary): the message names the culprit.
		return badRequest("", "%v", err)
	}
	var rj *router.Rejection
	if !errors.As(err, &rj) {
		return internalError("%v", err)
	}
	reason := string(rj.Reason)
	e := &apiError{status: http.StatusServiceUnavailable, retryAfter: unavailableRetry, message: rj.Message, reason: reason, code: reason}
	if e.message == "" {
		e.message = strings.ReplaceAll(reason, "_", " ")
	}
	a, ok := rejectionAnswers[rj.Reason]
	if ok {
		e.status, e.retryAfter, e.kind, e.code, e.param = a.status, a.retryAfter, a.kind, a.code, a.param
	}
	if a.overload {
		switch s.opts.OverloadStatus {
		case http.StatusTooManyRequests:
			e.status, e.kind = http.StatusTooManyRequests, "rate_limit_error"
		case 529:
			// Anthropic's own overload status; OpenAI routes keep 503.
			if sh == shapeAnthropic {
				e.status = 529
			}
		}
	}
	if e.kind == "unavailable_error" && e.status == http.StatusTooManyRequests {
		e.kind = "rate_limit_error"
	}
	return e
}
