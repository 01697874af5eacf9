package server

import (
	"context"
	"net"
	"net/http"
	"time"
)

// connLimits bound how long a client may hold a connection without
// progress. The request body has its own deadline (api.Options.BodyTimeout).
type connLimits struct {
	// header is the time to send the request headers (slowloris).
	header time.Duration
	// idle is how long a keep-alive connection may wait for its next
	// request; without it idle connections are kept for ever.
	idle time.Duration
}

var defaultConnLimits = connLimits{header: 30 * time.Second, idle: 2 * time.Minute}

// newHTTPServer is the listener's server; requests' contexts derive from
// base, so the drain can cancel them.
func newHTTPServer(h http.Handler, base context.Context, lim connLimits) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: lim.header,
		IdleTimeout:       lim.idle,
		BaseContext:       func(net.Listener) context.Context { return base },
	}
}
