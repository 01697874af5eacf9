package api

import (
	"fmt"
	"time"
)

// rejection is the router's refusal type (router.Rejection in the contract
// with core/router). Until core/router lands this mirrors its fields; then it
// becomes an alias of router.Rejection.
type rejection struct {
	Status     int
	Reason     string
	Message    string
	RetryAfter time.Duration
}

func (e *rejection) Error() string { return fmt.Sprintf("%s: %s", e.Reason, e.Message) }
