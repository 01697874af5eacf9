package transport

import (
	"math"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
)

// grpcServer is the plugin side's gRPC server: go-plugin's default with the
// receive limit raised from gRPC's 4 MiB to the limit go-plugin already
// gives the host's side. Requests travel as JSON that can be several times
// the HTTP body the core accepted (a 32 MiB prompt is admissible); with the
// default limit such a request failed in the transport as if the backend
// were down, instead of reaching the backend's own checks.
func grpcServer(opts []grpc.ServerOption) *grpc.Server {
	return plugin.DefaultGRPCServer(append(opts, grpc.MaxRecvMsgSize(math.MaxInt32)))
}
