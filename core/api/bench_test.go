package api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/dflash/dflash_server/sdk"
)

// discardWriter is a ResponseWriter that keeps nothing, so benchmarks
// measure the API layer, not a recorder's buffer.
type discardWriter struct {
	h http.Header
	n int
}

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) WriteHeader(int)             {}
func (d *discardWriter) Write(b []byte) (int, error) { d.n += len(b); return len(b), nil }
func (d *discardWriter) Flush()                      {}

// tokenEvents is a stream of n one-token text events and a finish.
func tokenEvents(n int) []sdk.Event {
	evs := make([]sdk.Event, 0, n+1)
	for i := 0; i < n; i++ {
		evs = append(evs, sdk.Event{Text: " tok", TokenIDs: []int32{int32(i)}})
	}
	return append(evs, finish(sdk.FinishStop, 100, n))
}

// BenchmarkStream reports the API layer's cost per streamed token event
// (chunk/event encoding, SSE framing, flush) for each API.
func BenchmarkStream(b *testing.B) {
	const n = 256
	evs := tokenEvents(n)
	for _, tc := range []struct{ name, path, body string }{
		{"chat", "/v1/chat/completions", chatBody + `,"stream":true,"stream_options":{"include_usage":true}}`},
		{"messages", "/v1/messages", messagesBody + `,"stream":true}`},
		{"responses", "/v1/responses", responsesBody + `,"stream":true}`},
	} {
		b.Run(tc.name, func(b *testing.B) {
			fr := &fakeRouter{script: func(*sdk.ChatRequest) (*fakeStream, error) { return &fakeStream{events: evs}, nil }}
			s := New(fr, Options{})
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				req := httptest.NewRequest(http.MethodPost, tc.path, strings.NewReader(tc.body))
				s.ServeHTTP(&discardWriter{h: http.Header{}}, req)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/token")
		})
	}
}

// BenchmarkDecode reports request decoding and validation of a 40-message
// conversation with tools, per API.
func BenchmarkDecode(b *testing.B) {
	var chat, anth, resp strings.Builder
	chat.WriteString(`{"model":"m","max_tokens":256,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"string"}}}}}],"messages":[`)
	anth.WriteString(`{"model":"m","max_tokens":256,"tools":[{"name":"f","input_schema":{"type":"object","properties":{"a":{"type":"string"}}}}],"messages":[`)
	resp.WriteString(`{"model":"m","max_output_tokens":256,"tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{"a":{"type":"string"}}}}],"input":[`)
	for i := 0; i < 40; i++ {
		sep := ","
		if i == 39 {
			sep = ""
		}
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		text := strings.Repeat("lorem ipsum dolor sit amet ", 20)
		fmt.Fprintf(&chat, `{"role":%q,"content":%q}%s`, role, text, sep)
		fmt.Fprintf(&anth, `{"role":%q,"content":[{"type":"text","text":%q}]}%s`, role, text, sep)
		fmt.Fprintf(&resp, `{"role":%q,"content":%q}%s`, role, text, sep)
	}
	chat.WriteString("]}")
	anth.WriteString("]}")
	resp.WriteString("]}")
	lim := limits{maxBody: 32 << 20, maxDepth: 64, maxMessages: 4096, maxTokens: 1 << 20}
	for _, tc := range []struct {
		name   string
		body   []byte
		decode func([]byte) *apiError
	}{
		{"chat", []byte(chat.String()), func(b []byte) *apiError { _, _, e := decodeChat(b, lim); return e }},
		{"messages", []byte(anth.String()), func(b []byte) *apiError { _, _, e := decodeMessages(b, lim, false); return e }},
		{"responses", []byte(resp.String()), func(b []byte) *apiError { _, _, _, e := decodeResponses(b, lim); return e }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.SetBytes(int64(len(tc.body)))
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if e := tc.decode(tc.body); e != nil {
					b.Fatal(e)
				}
			}
		})
	}
}
