package e2e

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/matryer/is"
)

// rawResponse is one answer to a raw request.
type rawResponse struct {
	status int
	header http.Header
	body   []byte
}

// postRaw sends body as it is (no JSON encoding on our side).
func (s *server) postRaw(t *testing.T, path string, body []byte, header map[string]string) rawResponse {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.url+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: read: %v", path, err)
	}
	return rawResponse{status: resp.StatusCode, header: resp.Header, body: b}
}

// errorMessage is the message of an error body in either API's shape.
func errorMessage(b []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil {
		return ""
	}
	return e.Error.Message
}

// TestBadRequests sends bad input to a server of two tiny real models: each
// request gets one answer, a refusal is a 4xx whose message names the
// culprit, nothing answers 5xx, and afterwards the server is unharmed (the
// same plugin processes, every slot and KV block back, normal requests
// served).
func TestBadRequests(t *testing.T) {
	qwen3, qwen35 := tinyModels(t)
	args := []string{"--routing-policy", "by-name",
		"--model", qwen3, "--model-name", "qwen3", "--max-ctx", "1024", "--max-tokens", "4",
		"--model", qwen35, "--model-name", "qwen35", "--max-ctx", "1024", "--max-tokens", "4"}
	s := startServer(t, serverOpts{plugins: []string{"backend-qwen-dflash", "policy-by-name"}, args: args})
	before := s.pluginProcs("")

	chat := func(extra string) []byte {
		return []byte(`{"model":"qwen3","messages":[{"role":"user","content":"hi"}]` + extra + `}`)
	}
	big := bytes.Repeat([]byte("hello world "), (5<<20)/12) // 5 MiB: over gRPC's default message size
	tests := []struct {
		name   string
		path   string
		body   []byte
		status int
		want   string // part of the error message (the culprit)
	}{
		{"not JSON", pathChat, []byte(`{"model":`), 400, "JSON"},
		{"empty body", pathMessages, nil, 400, "body"},
		{"messages of the wrong type", pathChat, []byte(`{"messages":"hi"}`), 400, "messages"},
		{"max_tokens 1e18", pathChat, chat(`,"max_tokens":1e18`), 400, "max_tokens"},
		{"max_tokens max int64", pathChat, chat(`,"max_tokens":9223372036854775807`), 400, "max_tokens"},
		{"max_tokens past int64", pathChat, chat(`,"max_tokens":9223372036854775808`), 400, "max_tokens"},
		{"max_tokens negative", pathMessages, []byte(`{"model":"qwen3","max_tokens":-1,"messages":[{"role":"user","content":"hi"}]}`), 400, "max_tokens"},
		{"max_output_tokens huge", pathResponses, []byte(`{"model":"qwen3","input":"hi","max_output_tokens":99999999999}`), 400, "max_output_tokens"},
		{"max_tokens above the model cap is clamped", pathChat, chat(`,"max_tokens":1000000`), 200, ""},
		{"temperature 1e999", pathChat, chat(`,"temperature":1e999`), 400, "temperature"},
		{"top_logprobs 100", pathChat, chat(`,"logprobs":true,"top_logprobs":100`), 400, "top_logprobs"},
		{"nested too deep", pathChat, []byte(strings.Repeat("[", 100000) + strings.Repeat("]", 100000)), 400, "nested"},
		{"invalid UTF-8 in content", pathChat, []byte("{\"model\":\"qwen3\",\"messages\":[{\"role\":\"user\",\"content\":\"a\xff\xfe\xc3\"}]}"), 200, ""},
		{"lone surrogate and NUL escapes", pathMessages, []byte(`{"model":"qwen3","max_tokens":2,"messages":[{"role":"user","content":"\ud800 \u0000 \udfff"}]}`), 200, ""},
		{"invalid UTF-8 in the model name", pathChat, []byte("{\"model\":\"q\xffwen3\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}"), 404, "not loaded"},
		{"invalid UTF-8 in responses input", pathResponses, []byte("{\"model\":\"qwen35\",\"input\":\"\xff\xff\",\"max_output_tokens\":2}"), 200, ""},
		{"5 MiB prompt", pathChat, []byte(`{"model":"qwen3","messages":[{"role":"user","content":"` + string(big) + `"}]}`), 400, "context"},
		{"33 MiB body", pathChat, append(append([]byte(`{"model":"qwen3","messages":[{"role":"user","content":"`), bytes.Repeat([]byte("a"), 33<<20)...), `"}]}`...), 413, "larger than"},
		{"detokenize ids outside the vocabulary", "/detokenize", []byte(`{"model":"qwen3","tokens":[-1,99999999]}`), 400, "token id -1"},
		{"detokenize half a character", "/detokenize", []byte(`{"model":"qwen3","tokens":[145]}`), 200, ""},
		{"tokenize invalid UTF-8", "/tokenize", []byte("{\"model\":\"qwen3\",\"content\":\"a\xffb<|im_start|>\"}"), 200, ""},
		{"count_tokens of nothing", "/v1/messages/count_tokens", []byte(`{"model":"qwen3","messages":[]}`), 400, "messages"},
	}
	t.Run("handcrafted", func(t *testing.T) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				is := is.New(t)
				r := s.postRaw(t, tt.path, tt.body, nil)
				if r.status != tt.status {
					t.Fatalf("status %d, want %d: %.300s", r.status, tt.status, r.body)
				}
				if tt.status != 200 {
					msg := errorMessage(r.body)
					is.True(strings.Contains(msg, tt.want)) // the message names the culprit
				}
			})
		}
	})

	// Deterministic mutations of valid bodies: byte flips, invalid UTF-8,
	// cuts, repeats and type swaps. Only the absence of 5xx and of lost
	// answers is asserted; the outcomes are logged.
	t.Run("fuzzed bodies", func(t *testing.T) {
		seeds := map[string][]string{
			pathChat: {`{"model":"qwen3","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}],"max_tokens":3,"temperature":0.7,"stop":["x"],"logprobs":true,"top_logprobs":2}`,
				`{"model":"qwen35","stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}`},
			pathMessages:                {`{"model":"qwen3","max_tokens":3,"system":"s","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"thinking":{"type":"enabled","budget_tokens":2}}`},
			pathResponses:               {`{"model":"qwen35","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"max_output_tokens":3,"stream":true}`},
			"/tokenize":                 {`{"model":"qwen3","content":"héllo <|im_start|>","add_special":true}`},
			"/v1/messages/count_tokens": {`{"model":"qwen35","messages":[{"role":"user","content":"hi"}],"tools":[{"name":"f","input_schema":{"type":"object"}}]}`},
		}
		rng := rand.New(rand.NewPCG(14, 2026))
		const perSeed = 60
		outcomes := map[int]int{}
		tried := 0
		for path, bodies := range seeds {
			for _, seed := range bodies {
				for i := 0; i < perSeed; i++ {
					body := mutate(rng, []byte(seed))
					r := s.postRaw(t, path, body, nil)
					tried++
					outcomes[r.status]++
					if r.status >= 500 {
						t.Errorf("%s %q: status %d: %.300s", path, body, r.status, r.body)
					}
					if r.status >= 400 && errorMessage(r.body) == "" {
						t.Errorf("%s %q: status %d without an error message: %.300s", path, body, r.status, r.body)
					}
				}
			}
		}
		t.Logf("fuzzed bodies: %d requests, outcomes by status %v", tried, outcomes)
	})

	t.Run("fuzzed headers and framing", func(t *testing.T) {
		rng := rand.New(rand.NewPCG(7, 14))
		body := string(chat(`,"max_tokens":1`))
		frames := []string{
			"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5\r\n\r\n" + body,
			"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n" + body,
			"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n" + body,
			"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n" + body,
			"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
			"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-\xff\xfe: \xff\r\nContent-Length: " + fmt.Sprint(len(body)) + "\r\n\r\n" + body,
			"POST /v1/chat/\xff\xfe HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
			"BREW /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n",
			"GET /" + strings.Repeat("a", 70000) + " HTTP/1.1\r\nHost: x\r\n\r\n",
			"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("b", 2<<20) + "\r\n\r\n",
			"POST /v1/chat/completions HTTP/9.9\r\nHost: x\r\n\r\n",
			"\x00\x01\x02\x03 garbage\r\n\r\n",
		}
		for i := 0; i < 60; i++ {
			var h strings.Builder
			h.WriteString("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
			for j := rng.IntN(6); j > 0; j-- {
				fmt.Fprintf(&h, "%s: %s\r\n", randomToken(rng, 1+rng.IntN(20)), randomBytes(rng, rng.IntN(200)))
			}
			fmt.Fprintf(&h, "Content-Type: %s\r\nContent-Length: %d\r\n\r\n%s", randomBytes(rng, rng.IntN(30)), len(body), body)
			frames = append(frames, h.String())
		}
		statuses := map[int]int{}
		for i, f := range frames {
			st := rawExchange(t, s.url, f)
			statuses[st]++
			// 505 is the right answer to an unknown HTTP version.
			if st >= 500 && st != http.StatusHTTPVersionNotSupported {
				t.Errorf("frame %d (%.80q): status %d", i, f, st)
			}
		}
		t.Logf("raw frames: %d sent, statuses %v (0: the server closed the connection without an answer)", len(frames), statuses)
	})

	t.Run("the server is unharmed", func(t *testing.T) {
		is := is.New(t)
		s.waitIdle(t)
		s.waitKVReturned(t)
		st := s.status(t)
		for _, m := range st.Models {
			is.Equal(m.State, "ready")
			is.Equal(m.Restarts, 0) // no backend crashed
		}
		is.Equal(len(s.pluginProcs("")), len(before)) // the same plugin processes
		for _, model := range []string{"qwen3", "qwen35"} {
			c := s.post(t, pathChat, chatReq(model, "hi", 2, false))
			is.Equal(c.status, 200)
		}
		is.True(!strings.Contains(s.stderr.String(), "panic")) // no panic, not even a recovered one
	})
}

// mutate returns a damaged copy of b.
func mutate(rng *rand.Rand, b []byte) []byte {
	out := append([]byte(nil), b...)
	for n := 1 + rng.IntN(4); n > 0; n-- {
		if len(out) == 0 {
			out = append(out, '{')
		}
		i := rng.IntN(len(out))
		switch rng.IntN(8) {
		case 0: // flip a byte
			out[i] ^= byte(1 + rng.IntN(255))
		case 1: // invalid UTF-8
			out = append(out[:i], append([]byte{0xff, 0xc3, 0x28, 0xed, 0xa0, 0x80}[:1+rng.IntN(6)], out[i:]...)...)
		case 2: // cut
			out = out[:i]
		case 3: // repeat a stretch
			j := min(len(out), i+1+rng.IntN(40))
			out = append(out[:j], append(append([]byte(nil), out[i:j]...), out[j:]...)...)
		case 4: // a JSON token of another type
			tok := []string{`null`, `1e309`, `-1`, `9223372036854775808`, `"x"`, `[]`, `{}`, `true`, `""`, `0.5`}[rng.IntN(10)]
			out = append(out[:i], append([]byte(tok), out[i:]...)...)
		case 5: // drop a byte
			out = append(out[:i], out[i+1:]...)
		case 6: // escape sequences
			esc := []string{`\ud800`, `\u0000`, `\"`, `\\`, `\x`, `\u12`}[rng.IntN(6)]
			out = append(out[:i], append([]byte(esc), out[i:]...)...)
		case 7: // a structural byte
			out = append(out[:i], append([]byte{"{}[],:\""[rng.IntN(7)]}, out[i:]...)...)
		}
	}
	return out
}

func randomBytes(rng *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.IntN(256))
		if b[i] == '\r' || b[i] == '\n' {
			b[i] = 'x' // keep the framing; the content is what is fuzzed
		}
	}
	return string(b)
}

func randomToken(rng *rand.Rand, n int) string {
	const chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_!#$%&'*+.^`|~"
	b := make([]byte, n)
	for i := range b {
		b[i] = chars[rng.IntN(len(chars))]
	}
	return string(b)
}

// rawExchange writes frame on a fresh connection and returns the status of
// the first response, or 0 when the server closed the connection without
// one. The read deadline only stops a broken run from hanging.
func rawExchange(t *testing.T, url, frame string) int {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(pollBound))
	go func() { _, _ = io.WriteString(conn, frame) }() // the server may answer before reading it all
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("no answer to %.80q within the poll bound", frame)
		}
		return 0
	}
	var proto string
	var status int
	if _, err := fmt.Sscanf(line, "%s %d", &proto, &status); err != nil {
		t.Fatalf("bad status line %q", line)
	}
	return status
}

// TestMalformedGGUF launches the server on broken model files: each launch
// fails with one error line that names the file and what is wrong, and no
// panic.
func TestMalformedGGUF(t *testing.T) {
	qwen3, _ := tinyModels(t)
	src, err := os.ReadFile(qwen3)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// Offsets of the first tensor's record (token_embd.weight): n_dims,
	// dims, type, offset follow its name.
	name := []byte("token_embd.weight")
	ti := bytes.Index(src, name) + len(name)
	nd := int(binary.LittleEndian.Uint32(src[ti:]))
	typeAt, offAt := ti+4+8*nd, ti+4+8*nd+4
	edit := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), src...)) }
	put32 := func(at int, v uint32) func([]byte) []byte {
		return func(b []byte) []byte { binary.LittleEndian.PutUint32(b[at:], v); return b }
	}
	put64 := func(at int, v uint64) func([]byte) []byte {
		return func(b []byte) []byte { binary.LittleEndian.PutUint64(b[at:], v); return b }
	}
	rename := func(from, to string) func([]byte) []byte {
		return func(b []byte) []byte { return bytes.Replace(b, []byte(from), []byte(to), 1) }
	}
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "not a GGUF file"},
		{"bad magic", edit(func(b []byte) []byte { copy(b, "GGUX"); return b }), "not a GGUF file"},
		{"cut in the header", src[:100], "impossible"},
		{"version 99", edit(put32(4, 99)), "unsupported GGUF version 99"},
		{"2^62 tensors", edit(put64(8, 1<<62)), "tensor count"},
		{"2^62 metadata records", edit(put64(16, 1<<62)), "metadata count"},
		{"key length 2^60", edit(put64(24, 1<<60)), "key length"},
		{"cut in the tensor data", src[:len(src)*6/10], "truncated file"},
		{"9 dimensions", edit(put32(ti, 9)), "9 dims"},
		{"dimension 2^40", edit(put64(ti+4, 1<<40)), "extends past the end"},
		{"unknown tensor type", edit(put32(typeAt, 99)), "unknown ggml type 99"},
		{"tensor offset 2^50", edit(put64(offAt, 1<<50)), "extends past the end"},
		{"no tokenizer vocabulary", edit(rename("tokenizer.ggml.tokens", "tokenizeX.ggml.tokens")), "tokenizer.ggml.tokens"},
		{"no block count", edit(rename("qwen3.block_count", "qwenX.block_count")), "qwen3.block_count"},
		{"a missing tensor", edit(rename("blk.0.attn_q.weight", "blk.9.attn_q.weight")), "blk.0.attn_q.weight is missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "_")+".gguf")
			is.NoErr(os.WriteFile(path, tt.data, 0o644))
			code, _, stderr := runCLI(t, []string{"backend-qwen-dflash", "policy-primary-first"}, "--port", "0", "--model", path)
			is.True(code != 0) // the launch fails
			lines := errorLines(stderr)
			if len(lines) != 1 {
				t.Fatalf("want one error line, got %d:\n%s", len(lines), tail(stderr, 20))
			}
			is.True(strings.Contains(lines[0], path))    // names the file
			is.True(strings.Contains(lines[0], tt.want)) // and what is wrong with it
			is.True(!strings.Contains(stderr, "panic"))
		})
	}
}
