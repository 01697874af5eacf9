package router

import (
	"errors"
	"fmt"
)

// Reason says why the router refused a request. The router knows nothing
// of HTTP: core/api maps each reason to a status, a Retry-After and each
// API's error shape.
type Reason string

// Rejection reasons.
const (
	// The request is invalid for the model (a backend said so).
	ReasonInvalidRequest Reason = "invalid_request"
	// No model can ever hold the request.
	ReasonNeverFits Reason = "never_fits"
	// The model named is not loaded.
	ReasonUnknownModel Reason = "unknown_model"
	// Several models are loaded and the request names none.
	ReasonModelRequired Reason = "model_required"
	// Every candidate is busy and the waiting queue is full (or disabled).
	ReasonQueueFull Reason = "queue_full"
	// The request waited longer than --routing-queue-timeout.
	ReasonQueueTimeout Reason = "queue_timeout"
	// The server is draining.
	ReasonShuttingDown Reason = "shutting_down"
	// No backend that could serve the request is up.
	ReasonBackendUnavailable Reason = "backend_unavailable"
)

// ErrUnknownModel is the cause of an unknown_model Rejection.
var ErrUnknownModel = errors.New("model is not loaded")

// ErrNoFinish is returned by Stream.Recv when the backend ended a stream
// without a finish event.
var ErrNoFinish = errors.New("backend ended the stream without a finish event")

// Rejection is every routing refusal: a typed reason, a message and the
// cause. errors.Is sees the cause (admission.ErrQueueFull,
// admission.ErrQueueTimeout, admission.ErrShuttingDown, ErrUnknownModel,
// a backend's *sdk.InvalidError).
type Rejection struct {
	Reason Reason
	// Message is for people; never-fits lists the tokens needed against
	// each model's limit.
	Message string

	cause error
}

func rejection(reason Reason, cause error, format string, args ...any) *Rejection {
	return &Rejection{Reason: reason, Message: fmt.Sprintf(format, args...), cause: cause}
}

func (e *Rejection) Error() string { return string(e.Reason) + ": " + e.Message }

// Unwrap returns the refusal's cause, if any.
func (e *Rejection) Unwrap() error { return e.cause }
