package sdk

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

// toStatus turns a plugin implementation's error into a gRPC status once, on
// the plugin side.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	var inv *InvalidError
	switch {
	case errors.As(err, &inv):
		return status.Error(codes.InvalidArgument, inv.Msg)
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Unknown, err.Error())
}

// fromStatus turns a gRPC error into the domain error the core branches on,
// once, in the host adapter. ctx is the call's context: when it is done the
// caller's own cancellation wins over transport noise.
func fromStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.InvalidArgument:
		return &InvalidError{Msg: st.Message()}
	case codes.Canceled:
		return context.Canceled
	case codes.DeadlineExceeded:
		return context.DeadlineExceeded
	case codes.Unavailable:
		return fmt.Errorf("%w: %s", ErrUnavailable, st.Message())
	case codes.Unimplemented:
		return fmt.Errorf("%w: %s", ErrUnsupported, st.Message())
	}
	return errors.New(st.Message())
}
