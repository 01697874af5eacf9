package router

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"
)

// Rejection reasons.
const (
	ReasonQueueFull          = "queue_full"
	ReasonQueueTimeout       = "queue_timeout"
	ReasonNeverFits          = "never_fits"
	ReasonShuttingDown       = "shutting_down"
	ReasonUnknownModel       = "unknown_model"
	ReasonInvalidRequest     = "invalid_request"
	ReasonBackendUnavailable = "backend_unavailable"
	ReasonModelRequired      = "model_required"
)

// retryAfter is the Retry-After of every 503: capacity turns over in
// seconds, and a plugin restart takes about that long too.
const retryAfter = time.Second

// ErrUnknownModel is the cause of an unknown_model Rejection.
var ErrUnknownModel = errors.New("model is not loaded")

// ErrNoFinish is returned by Stream.Recv when the backend ended a stream
// without a finish event.
var ErrNoFinish = errors.New("backend ended the stream without a finish event")

// Rejection is every routing refusal; the API layer maps it to the API's
// error shape. errors.Is sees its cause (admission.ErrQueueFull,
// admission.ErrQueueTimeout, admission.ErrShuttingDown, ErrUnknownModel,
// a backend's *sdk.InvalidError).
type Rejection struct {
	// Status is the HTTP status: 400, 404 or 503.
	Status int
	// Reason is one of the Reason* constants.
	Reason string
	// Message is for people; never-fits lists the tokens needed against
	// each model's limit.
	Message string
	// RetryAfter > 0 asks for a Retry-After header (seconds, rounded up).
	RetryAfter time.Duration

	cause error
}

func (e *Rejection) Error() string { return e.Reason + ": " + e.Message }

// Unwrap returns the refusal's cause, if any.
func (e *Rejection) Unwrap() error { return e.cause }

// RetryAfterSeconds is RetryAfter rounded up to whole seconds (0 for none).
func (e *Rejection) RetryAfterSeconds() int {
	if e.RetryAfter <= 0 {
		return 0
	}
	return int(math.Ceil(e.RetryAfter.Seconds()))
}

func rejection(status int, reason string, cause error, format string, args ...any) *Rejection {
	r := &Rejection{Status: status, Reason: reason, Message: fmt.Sprintf(format, args...), cause: cause}
	if status == http.StatusServiceUnavailable {
		r.RetryAfter = retryAfter
	}
	return r
}
