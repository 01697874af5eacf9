package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/matryer/is"
)

// TestSecurityDefaults runs the real server as an operator would, with API
// keys and nothing else set: it listens on loopback only, refuses requests
// without a valid key (probes exempt), sends no CORS headers, and logs no
// request content and no key, at debug level too.
func TestSecurityDefaults(t *testing.T) {
	const (
		key    = "sk-test-6f1c2b"
		secret = "SECRET-PROMPT-4b9d7e"
	)
	dir := t.TempDir()
	args := []string{"--log-level", "debug", "--api-key", key, "--api-key", "another-key-of-another-length",
		"--model", scriptedModel(t, dir, "a"), "--model-name", "a"}
	s := startServer(t, serverOpts{args: args})

	send := func(method, path, body string, header map[string]string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := httpClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		resp.Body.Close()
		return resp
	}
	chat := `{"messages":[{"role":"user","content":"` + secret + `"}],"max_tokens":2}`

	t.Run("listens on loopback only", func(t *testing.T) {
		is := is.New(t)
		is.True(strings.Contains(s.stderr.String(), "addr=http://127.0.0.1:")) // the default host
		_, port, err := net.SplitHostPort(strings.TrimPrefix(s.url, "http://"))
		is.NoErr(err)
		addrs, _ := net.InterfaceAddrs()
		for _, a := range addrs {
			ip, ok := a.(*net.IPNet)
			if !ok || ip.IP.IsLoopback() || ip.IP.To4() == nil {
				continue
			}
			if c, err := net.Dial("tcp", net.JoinHostPort(ip.IP.String(), port)); err == nil {
				c.Close()
				t.Errorf("the server answers on %s", ip.IP)
			}
		}
	})

	t.Run("API keys", func(t *testing.T) {
		tests := []struct {
			name   string
			method string
			path   string
			header map[string]string
			want   int
		}{
			{"no key", "POST", pathChat, nil, 401},
			{"wrong key", "POST", pathChat, map[string]string{"Authorization": "Bearer sk-test-6f1c2c"}, 401},
			{"a prefix of the key", "POST", pathChat, map[string]string{"Authorization": "Bearer sk-test"}, 401},
			{"the key with a suffix", "POST", pathChat, map[string]string{"Authorization": "Bearer " + key + "x"}, 401},
			{"bearer key", "POST", pathChat, map[string]string{"Authorization": "Bearer " + key}, 200},
			{"x-api-key", "POST", pathMessages, map[string]string{"x-api-key": "another-key-of-another-length", "anthropic-version": "2023-06-01"}, 200},
			{"health without a key", "GET", "/health", nil, 200},
			{"ready without a key", "GET", "/ready", nil, 200},
			{"livez without a key", "GET", "/livez", nil, 200},
			{"readyz without a key", "GET", "/readyz", nil, 200},
			{"models need a key", "GET", "/v1/models", nil, 401},
			{"tokenize needs a key", "POST", "/tokenize", nil, 401},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				is := is.New(t)
				body := chat
				if tt.path == pathMessages {
					body = `{"max_tokens":2,"messages":[{"role":"user","content":"` + secret + `"}]}`
				}
				resp := send(tt.method, tt.path, body, tt.header)
				is.Equal(resp.StatusCode, tt.want)
				if tt.want == 401 {
					is.True(resp.Header.Get("WWW-Authenticate") != "") // says how to authenticate
				}
			})
		}
	})

	t.Run("CORS is off unless configured", func(t *testing.T) {
		is := is.New(t)
		pre := send("OPTIONS", pathChat, "", map[string]string{"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
		is.Equal(pre.Header.Get("Access-Control-Allow-Origin"), "")
		resp := send("POST", pathChat, chat, map[string]string{"Origin": "https://evil.example", "Authorization": "Bearer " + key})
		is.Equal(resp.StatusCode, 200)
		is.Equal(resp.Header.Get("Access-Control-Allow-Origin"), "")
	})

	t.Run("no request content or key in the logs", func(t *testing.T) {
		is := is.New(t)
		s.waitIdle(t)
		logs := s.stdout.String() + s.stderr.String()
		is.True(!strings.Contains(logs, secret)) // prompts stay out of the logs
		is.True(!strings.Contains(logs, key))    // and so do keys
		is.True(!strings.Contains(logs, "another-key-of-another-length"))
	})
}

// TestRealBackendsLogNoContent serves a qwen3 and a deepseek4 model (the
// Qwen and ds4 backends, whose templates, tokenizers and parsers see the
// prompt) at the most verbose level, trace: requests on every API, streamed
// and not, token counts, and refusals (an error path is where content
// leaks into a message) leave no trace of their content in any log.
func TestRealBackendsLogNoContent(t *testing.T) {
	const secret = "SECRET-PROMPT-9a3e1f"
	qwen3, _ := tinyModels(t)
	ds4 := tinyDS4(t)
	args := []string{"--log-level", "trace", "--routing-policy", "by-name",
		"--model", qwen3, "--model-name", "qwen3", "--max-ctx", "1024",
		"--model", ds4, "--model-name", "ds4", "--max-ctx", "1024"}
	s := startServer(t, serverOpts{plugins: []string{"backend-qwen-dflash", "backend-ds4", "policy-by-name"}, args: args})
	for _, model := range []string{"qwen3", "ds4"} {
		t.Run(model, func(t *testing.T) {
			is := is.New(t)
			// Streamed and not, alternately (each generation of the tiny
			// deepseek4 model prefills token by token: kept few).
			for i, path := range []string{pathChat, pathCompletions, pathMessages, pathResponses, pathChat} {
				c := s.post(t, path, apiBody(path, model, secret, 2, i%2 == 1))
				is.Equal(c.status, 200)
			}
			count := s.post(t, "/v1/messages/count_tokens", apiBody(pathMessages, model, secret, 1, false))
			is.Equal(count.status, 200)
			tok := s.post(t, "/tokenize", map[string]any{"model": model, "content": secret})
			is.Equal(tok.status, 200)
			long := apiBody(pathChat, model, secret, 5000, false) // beyond the context
			refused := s.post(t, pathChat, long)
			is.Equal(refused.status, 400)
			// The client is told; the operator's log is not.
			t.Logf("refusal: %s", errorMessage(refused.bodyBytes()))
		})
	}
	s.waitIdle(t)
	is := is.New(t)
	logs := s.stdout.String() + s.stderr.String()
	is.True(strings.Contains(logs, "[TRACE]") || strings.Contains(logs, "[DEBUG]")) // the verbose levels were on
	is.True(!strings.Contains(logs, secret))                                        // no request content anywhere
}

// TestPinnedPluginChecksums pins the real ds4 backend with a
// <binary>.sha256 sidecar, as an operator does: with its digest the
// deepseek4 model loads and serves; with another digest the binary is
// never run, and the launch fails saying which plugin and why.
func TestPinnedPluginChecksums(t *testing.T) {
	ds4 := tinyDS4(t)
	bin, err := os.ReadFile(env.plugins["backend-ds4"])
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(bin)
	wrong := sum
	wrong[0] ^= 0xff
	tests := []struct {
		name   string
		digest [32]byte
		serves bool
	}{
		{"the binary's digest", sum, true},
		{"another digest", wrong, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			dir := pluginDir(t, "backend-ds4", "policy-primary-first")
			// sha256sum's format: the digest, two spaces, the file name.
			pin := hex.EncodeToString(tt.digest[:]) + "  dflash-backend-ds4\n"
			is.NoErr(os.WriteFile(filepath.Join(dir, "dflash-backend-ds4.sha256"), []byte(pin), 0o644))
			s := launchServer(t, dir, freePort(t), []string{"--model", ds4, "--model-name", "ds4"})
			if tt.serves {
				is.NoErr(s.waitReady())
				text, _ := generate(t, s, pathChat, "ds4")
				is.True(text != "")
				return
			}
			is.True(s.wait() != 0) // the launch fails
			lines := errorLines(s.stderr.String())
			is.Equal(len(lines), 1)
			// The one error line names the architecture left unserved,
			// the plugin and why it was not run.
			if len(lines) == 1 && !contains(lines[0], `"deepseek4"`, "dflash-backend-ds4", "checksum mismatch") {
				t.Errorf("error line %q does not say the pinned ds4 backend was refused", lines[0])
			}
			is.Equal(len(s.pluginProcs("backend-")), 0)
		})
	}
}
