package api

import (
	"bytes"
	"encoding/json"
	"net/http"
)

// sseWriter frames Server-Sent Events and flushes after each one. After the
// first failed write (the client is gone) every call is a no-op and err
// reports the failure, so writers need not check each call.
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf bytes.Buffer
	// enc writes into buf; reused so that an event costs no encoder.
	enc *json.Encoder
	err error
}

// startSSE sends the event-stream headers with status 200.
func startSSE(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	// Stops nginx-style proxies from buffering the stream.
	h.Set("X-Accel-Buffering", "no")
	h.Del("Content-Length")
	w.WriteHeader(http.StatusOK)
	s := &sseWriter{w: w, rc: http.NewResponseController(w)}
	s.enc = json.NewEncoder(&s.buf)
	// Model output often holds <, > and &; clients must see them as written.
	s.enc.SetEscapeHTML(false)
	s.flush()
	return s
}

// event writes "event: name" (when name is not empty) and one data line
// holding v as compact JSON.
func (s *sseWriter) event(name string, v any) {
	if s.err != nil {
		return
	}
	s.buf.Reset()
	if name != "" {
		s.buf.WriteString("event: ")
		s.buf.WriteString(name)
		s.buf.WriteByte('\n')
	}
	s.buf.WriteString("data: ")
	// Encode ends the JSON with a newline; one more ends the event.
	if err := s.enc.Encode(v); err != nil {
		s.err = err
		return
	}
	s.buf.WriteByte('\n')
	s.write(s.buf.Bytes())
}

// raw writes pre-framed bytes (a comment or "data: [DONE]").
func (s *sseWriter) raw(b string) {
	if s.err != nil {
		return
	}
	s.write([]byte(b))
}

func (s *sseWriter) write(b []byte) {
	if _, err := s.w.Write(b); err != nil {
		s.err = err
		return
	}
	s.flush()
}

func (s *sseWriter) flush() {
	if err := s.rc.Flush(); err != nil && s.err == nil {
		s.err = err
	}
}
