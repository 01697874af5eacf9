package transport

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dflash/dflash_server/sdk"
)

// toStatus turns a plugin implementation's error into a gRPC status once, on
// the plugin side.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	var inv *sdk.InvalidError
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
		return &sdk.InvalidError{Msg: st.Message()}
	case codes.Canceled:
		return context.Canceled
	case codes.DeadlineExceeded:
		return context.DeadlineExceeded
	case codes.Unavailable:
		return fmt.Errorf("%w: %s", sdk.ErrUnavailable, st.Message())
	case codes.Unimplemented:
		return fmt.Errorf("%w: %s", sdk.ErrUnsupported, st.Message())
	}
	return errors.New(st.Message())
}
