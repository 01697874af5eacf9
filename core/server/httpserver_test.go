package server

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/matryer/is"
)

// serveLimited serves h on loopback with short connection limits and
// returns the address.
func serveLimited(t *testing.T, lim connLimits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }),
		context.Background(), lim)
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	return ln.Addr().String()
}

// closedByServer reads from c until the server closes it. The deadline
// only stops a broken run from hanging.
func closedByServer(t *testing.T, r *bufio.Reader, c net.Conn) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	_, err := io.Copy(io.Discard, r)
	var ne net.Error
	return err == nil || !errors.As(err, &ne) || !ne.Timeout()
}

// TestConnLimits: a client that never finishes its headers, and a
// keep-alive connection left idle, are closed by the server.
func TestConnLimits(t *testing.T) {
	lim := connLimits{header: 50 * time.Millisecond, idle: 50 * time.Millisecond}
	t.Run("headers never finished", func(t *testing.T) {
		is := is.New(t)
		c, err := net.Dial("tcp", serveLimited(t, lim))
		is.NoErr(err)
		defer c.Close()
		_, err = io.WriteString(c, "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
		is.NoErr(err)
		is.True(closedByServer(t, bufio.NewReader(c), c)) // the connection does not stay open
	})
	t.Run("idle keep-alive", func(t *testing.T) {
		is := is.New(t)
		c, err := net.Dial("tcp", serveLimited(t, lim))
		is.NoErr(err)
		defer c.Close()
		_, err = io.WriteString(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
		is.NoErr(err)
		r := bufio.NewReader(c)
		resp, err := http.ReadResponse(r, nil)
		is.NoErr(err)
		is.Equal(resp.StatusCode, 200)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		is.True(closedByServer(t, r, c)) // the idle connection is closed
	})
	t.Run("defaults are set", func(t *testing.T) {
		is := is.New(t)
		hs := newHTTPServer(http.NotFoundHandler(), context.Background(), defaultConnLimits)
		is.True(hs.ReadHeaderTimeout > 0)
		is.True(hs.IdleTimeout > 0) // zero would keep idle connections for ever
	})
}
