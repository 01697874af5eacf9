package api

import (
	"net/http"
)

// sseWriter frames Server-Sent Events and flushes after each one. After the
// first failed write (the client is gone) every call is a no-op and err
// reports the failure, so writers need not check each call.
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte
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
	s.flush()
	return s
}

// event writes "event: name" (when name is not empty) and one data line
// holding v as compact JSON.
func (s *sseWriter) event(name string, v any) {
	if s.err != nil {
		return
	}
	b, err := marshal(v)
	if err != nil {
		s.err = err
		return
	}
	s.buf = s.buf[:0]
	if name != "" {
		s.buf = append(s.buf, "event: "...)
		s.buf = append(s.buf, name...)
		s.buf = append(s.buf, '\n')
	}
	s.buf = append(s.buf, "data: "...)
	s.buf = append(s.buf, b...)
	s.buf = append(s.buf, '\n', '\n')
	s.write(s.buf)
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
