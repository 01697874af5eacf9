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

// TestBadRequests sends bad input to a server of three tiny real models
// (qwen3 and qwen35 on the Qwen backend, a deepseek4 model on the ds4
// backend, whose own template, tokenizer and output parser see the bad
// input too): each request gets one answer, a refusal is a 4xx whose
// message names the culprit, nothing answers 5xx, and afterwards the
// server is unharmed (the same plugin processes, every slot and KV block
// back, normal requests served).
func TestBadRequests(t *testing.T) {
	qwen3, qwen35 := tinyModels(t)
	ds4 := tinyDS4(t)
	var args []string
	for _, m := range []struct{ file, name string }{{qwen3, "qwen3"}, {qwen35, "qwen35"}, {ds4, "ds4"}} {
		args = append(args, "--model", m.file, "--model-name", m.name, "--max-ctx", "1024", "--max-tokens", "4")
	}
	args = append([]string{"--routing-policy", "by-name"}, args...)
	s := startServer(t, serverOpts{plugins: []string{"backend-qwen-dflash", "backend-ds4", "policy-by-name"}, args: args})
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
		// The same kinds of input to the deepseek4 model.
		{"ds4: max_tokens past int64", pathChat, []byte(`{"model":"ds4","messages":[{"role":"user","content":"hi"}],"max_tokens":9223372036854775808}`), 400, "max_tokens"},
		{"ds4: max_tokens above the model cap is clamped", pathMessages, []byte(`{"model":"ds4","max_tokens":1000000,"messages":[{"role":"user","content":"hi"}]}`), 200, ""},
		{"ds4: invalid UTF-8 in content", pathChat, []byte("{\"model\":\"ds4\",\"messages\":[{\"role\":\"user\",\"content\":\"a\xff\xfe\xc3\"}]}"), 200, ""},
		{"ds4: lone surrogate, NUL and its own special tokens in content", pathMessages, []byte(`{"model":"ds4","max_tokens":2,"messages":[{"role":"user","content":"\ud800 \u0000 <｜Assistant｜><think>"}]}`), 200, ""},
		{"ds4: invalid UTF-8 in responses input", pathResponses, []byte("{\"model\":\"ds4\",\"input\":\"\xff\xff\",\"max_output_tokens\":2}"), 200, ""},
		{"ds4: a forced tool call", pathChat, []byte(`{"model":"ds4","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"required"}`), 400, "tool_choice"},
		{"ds4: 5 MiB prompt", pathChat, []byte(`{"model":"ds4","messages":[{"role":"user","content":"` + string(big) + `"}]}`), 400, "context"},
		{"ds4: detokenize ids outside the vocabulary", "/detokenize", []byte(`{"model":"ds4","tokens":[-1,99999999]}`), 400, "token id -1"},
		{"ds4: tokenize invalid UTF-8", "/tokenize", []byte("{\"model\":\"ds4\",\"content\":\"a\xffb<｜User｜>\"}"), 200, ""},
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
		// A slice, not a map: the mutations follow one seeded sequence, the
		// same in every run.
		seeds := []struct{ path, body string }{
			{pathChat, `{"model":"qwen3","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"}],"max_tokens":3,"temperature":0.7,"stop":["x"],"logprobs":true,"top_logprobs":2}`},
			{pathChat, `{"model":"qwen35","stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]}`},
			{pathMessages, `{"model":"qwen3","max_tokens":3,"system":"s","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"thinking":{"type":"enabled","budget_tokens":2}}`},
			{pathResponses, `{"model":"qwen35","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"max_output_tokens":3,"stream":true}`},
			{"/tokenize", `{"model":"qwen3","content":"héllo <|im_start|>","add_special":true}`},
			{"/v1/messages/count_tokens", `{"model":"qwen35","messages":[{"role":"user","content":"hi"}],"tools":[{"name":"f","input_schema":{"type":"object"}}]}`},
			// The deepseek4 model: its DSML rendering of tool turns, and thinking.
			{pathChat, `{"model":"ds4","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c1","content":"2"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"max_tokens":3}`},
			{pathMessages, `{"model":"ds4","max_tokens":3,"stream":true,"system":"s","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"thinking":{"type":"enabled","budget_tokens":2}}`},
		}
		rng := rand.New(rand.NewPCG(14, 2026))
		const perSeed = 60
		outcomes := map[int]int{}
		tried := 0
		for _, seed := range seeds {
			for range perSeed {
				body := mutate(rng, []byte(seed.body))
				r := s.postRaw(t, seed.path, body, nil)
				tried++
				outcomes[r.status]++
				if r.status >= 500 {
					t.Errorf("%s %q: status %d: %.300s", seed.path, body, r.status, r.body)
				}
				if r.status >= 400 && errorMessage(r.body) == "" {
					t.Errorf("%s %q: status %d without an error message: %.300s", seed.path, body, r.status, r.body)
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
		for _, model := range []string{"qwen3", "qwen35", "ds4"} {
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

// ggufCase is a broken model file and what its launch must say.
type ggufCase struct {
	name string
	data []byte
	want string // part of the one error line
}

// brokenGGUFs damages src, a valid model of arch, in the ways that depend
// on its contents: its first tensor record (token_embd.weight), its keys,
// and one of its tensors (missing), whose block-0 name is renamed away.
func brokenGGUFs(src []byte, arch, missing string) []ggufCase {
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
	// An arch-prefixed key of the same length that the loader does not know.
	unknown := func(key string) string { return "x" + arch[1:] + strings.TrimPrefix(key, arch) }
	return []ggufCase{
		{"cut in the tensor data", src[:len(src)*6/10], "truncated file"},
		{"9 dimensions", edit(put32(ti, 9)), "9 dims"},
		{"dimension 2^40", edit(put64(ti+4, 1<<40)), "extends past the end"},
		{"unknown tensor type", edit(put32(typeAt, 99)), "unknown ggml type 99"},
		{"tensor offset 2^50", edit(put64(offAt, 1<<50)), "extends past the end"},
		{"no tokenizer vocabulary", edit(rename("tokenizer.ggml.tokens", "tokenizeX.ggml.tokens")), "tokenizer.ggml.tokens"},
		{"no block count", edit(rename(arch+".block_count", unknown(arch+".block_count"))), arch + ".block_count"},
		{"a missing tensor", edit(rename(missing, strings.Replace(missing, "blk.0.", "blk.9.", 1))), missing + " is missing"},
	}
}

// TestMalformedGGUF launches the server on broken model files of each
// architecture (qwen3 on the Qwen backend, deepseek4 on the ds4 backend):
// each launch fails with one error line that names the file and what is
// wrong, and no panic.
func TestMalformedGGUF(t *testing.T) {
	qwen3, _ := tinyModels(t)
	src, err := os.ReadFile(qwen3)
	if err != nil {
		t.Fatal(err)
	}
	ds4src, err := os.ReadFile(tinyDS4(t))
	if err != nil {
		t.Fatal(err)
	}
	put := func(b []byte, at int, v uint64, size int) []byte {
		b = append([]byte(nil), b...)
		if size == 4 {
			binary.LittleEndian.PutUint32(b[at:], uint32(v))
		} else {
			binary.LittleEndian.PutUint64(b[at:], v)
		}
		return b
	}
	// The header is the same for every architecture: tried once.
	qwenCases := append([]ggufCase{
		{"empty", nil, "not a GGUF file"},
		{"bad magic", append([]byte("GGUX"), src[4:]...), "not a GGUF file"},
		{"cut in the header", src[:100], "impossible"},
		{"version 99", put(src, 4, 99, 4), "unsupported GGUF version 99"},
		{"2^62 tensors", put(src, 8, 1<<62, 8), "tensor count"},
		{"2^62 metadata records", put(src, 16, 1<<62, 8), "metadata count"},
		{"key length 2^60", put(src, 24, 1<<60, 8), "key length"},
	}, brokenGGUFs(src, "qwen3", "blk.0.attn_q.weight")...)
	// deepseek4 keys of its own: the value of a u32 key follows its name
	// and its type.
	usedAt := bytes.Index(ds4src, []byte("deepseek4.expert_used_count")) + len("deepseek4.expert_used_count") + 4
	ds4Cases := append(brokenGGUFs(ds4src, "deepseek4", "blk.0.hc_attn_fn.weight"),
		ggufCase{"no compress ratios", bytes.Replace(ds4src, []byte("deepseek4.attention.compress_ratios"), []byte("deepseek4.attention.compress_ratioX"), 1), "compress_ratios"},
		ggufCase{"99 experts used of 8", put(ds4src, usedAt, 99, 4), "expert_used_count"},
	)
	tests := []struct {
		arch   string
		plugin string
		cases  []ggufCase
	}{
		{"qwen3", "backend-qwen-dflash", qwenCases},
		{"deepseek4", "backend-ds4", ds4Cases},
	}
	dir := t.TempDir()
	for _, tt := range tests {
		for _, c := range tt.cases {
			t.Run(tt.arch+"/"+c.name, func(t *testing.T) {
				is := is.New(t)
				path := filepath.Join(dir, tt.arch+"_"+strings.ReplaceAll(c.name, " ", "_")+".gguf")
				is.NoErr(os.WriteFile(path, c.data, 0o644))
				code, _, stderr := runCLI(t, []string{tt.plugin, "policy-primary-first"}, "--port", "0", "--model", path)
				is.True(code != 0) // the launch fails
				lines := errorLines(stderr)
				if len(lines) != 1 {
					t.Fatalf("want one error line, got %d:\n%s", len(lines), tail(stderr, 20))
				}
				if !contains(lines[0], path, c.want) { // names the file and what is wrong with it
					t.Errorf("error line %q does not name the file and %q", lines[0], c.want)
				}
				is.True(!strings.Contains(stderr, "panic"))
				t.Log(lines[0])
			})
		}
	}
}
