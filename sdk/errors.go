package sdk

import (
	"errors"
	"fmt"
)

// ErrUnavailable means the plugin process is gone (crashed, killed or
// restarting). The core fails that model's in-flight requests and restarts
// the plugin.
var ErrUnavailable = errors.New("plugin unavailable")

// ErrUnsupported means the plugin does not implement a method (an older
// plugin answering a newer core).
var ErrUnsupported = errors.New("unsupported plugin method")

// InvalidError marks a request or option the plugin refused; it travels as
// codes.InvalidArgument and is shown to the user as it is.
type InvalidError struct{ Msg string }

func (e *InvalidError) Error() string { return e.Msg }

// Invalidf builds an *InvalidError.
func Invalidf(format string, args ...any) error {
	return &InvalidError{Msg: fmt.Sprintf(format, args...)}
}
