package api

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
)

// rawRequest writes head and a part of the body on a new connection to srv
// and returns the response status line and body.
func rawRequest(t *testing.T, srv *httptest.Server, head, partial string) (string, string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Minute)) // only stops a broken run from hanging
	if _, err := io.WriteString(conn, head+partial); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Status, string(b)
}

// TestSlowBody: a client that sends its headers and then trickles (or
// stops sending) the body is answered 408, in the route's error shape, once
// BodyTimeout passes, instead of holding a connection and a goroutine for
// ever (slowloris).
func TestSlowBody(t *testing.T) {
	fr := &fakeRouter{script: stream(sdk.Event{Text: "hi"}, finish(sdk.FinishStop, 1, 1))}
	srv := httptest.NewServer(newTestServer(fr, Options{BodyTimeout: 50 * time.Millisecond, Logger: discardLogger()}))
	defer srv.Close()
	for _, rc := range errorRoutes {
		t.Run(rc.path, func(t *testing.T) {
			is := is.New(t)
			head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", rc.path, len(rc.body))
			status, body := rawRequest(t, srv, head, rc.body[:5])
			is.Equal(status, "408 Request Timeout")
			checkErrorBody(t, []byte(body), rc.shape, "invalid_request_error", "request_timeout", "", "invalid_request_error")
			is.True(strings.Contains(body, "request body")) // says what was too slow
		})
	}
}

// TestBodyDeadlineEnds: the body deadline covers reading the body only; a
// stream that outlives it is not cut.
func TestBodyDeadlineEnds(t *testing.T) {
	is := is.New(t)
	gate := make(chan struct{})
	fr := &fakeRouter{script: func(*sdk.ChatRequest) (*fakeStream, error) {
		return &fakeStream{admission: sdk.Admission{Outcome: sdk.OutcomeAdmitted, PromptTokens: 1}, gate: gate,
			events: []sdk.Event{{Text: "a"}, {Text: "b"}, finish(sdk.FinishStop, 1, 2)}}, nil
	}}
	srv := httptest.NewServer(newTestServer(fr, Options{BodyTimeout: 20 * time.Millisecond, Logger: discardLogger()}))
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody+`,"stream":true}`))
	is.NoErr(err)
	defer resp.Body.Close()
	is.Equal(resp.StatusCode, 200)
	gate <- struct{}{}
	time.Sleep(100 * time.Millisecond) // well past the body deadline, mid-stream
	gate <- struct{}{}
	gate <- struct{}{}
	b, err := io.ReadAll(resp.Body)
	is.NoErr(err)
	is.True(strings.Contains(string(b), `"finish_reason":"stop"`)) // the stream ended normally
	is.True(strings.HasSuffix(strings.TrimSpace(string(b)), "data: [DONE]"))
}
