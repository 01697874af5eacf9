package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/matryer/is"
)

// seedQwenBlock is the qwen block of the seed's example command line with
// the model replaced by a tiny real one and hip:0 by cpu:0. Its listener
// options stay in the block, as in the seed. draft adds the seed's
// --draft (and --draft-device when draftDevice).
func seedQwenBlock(model, draftModel string, draft, draftDevice bool) []string {
	b := []string{"--model", model, "--model-name", "qwen", "--target-device", "cpu:0"}
	if draft {
		b = append(b, "--draft", draftModel)
		if draftDevice {
			b = append(b, "--draft-device", "cpu:0")
		}
	}
	return append(b,
		"--max-ctx", "4096", "--max-concurrency", "4", "--kv-pool-tokens", "16384",
		"--cache-type-k", "q8_0", "--cache-type-v", "q8_0", "--fa-window", "0",
		"--default-max-tokens", "2048", "--hard-limit-reply-budget", "1024",
		"--host", "127.0.0.1", "--port", "{port}", "--routing-queue-limit", "32")
}

// seedDS4Block is the seed's ds4 block on cpu:1. Without ds4Flags it keeps
// only the options the qwen-dflash backend also declares, so that a tiny
// qwen35 model can stand in for DeepSeek V4 (no deepseek4 backend exists).
func seedDS4Block(model string, ds4Flags bool) []string {
	b := []string{"--model", model, "--model-name", "ds4", "--target-device", "cpu:1",
		"--max-ctx", "8192", "--max-concurrency", "1",
		"--default-max-tokens", "2048", "--hard-limit-reply-budget", "1024",
		"--prefix-cache-slots", "0", "--prefill-cache-slots", "0", "--disk-prefix-cache", "off"}
	if ds4Flags {
		b = append(b, "--ds4-fused-decode", "--ds4-expert-top-k", "6", "--ds4-prefill", "exact")
	}
	return b
}

var seedHead = []string{"--load-balancing", "--load-balancing-primary-gpu", "cpu:0"}

var realPlugins = []string{"backend-qwen-dflash", "policy-primary-first"}

// TestSeedCommandLine runs the seed's example launch with tiny real
// models, the qwen block with its DFlash draft on the target's device. What
// cannot run today: the ds4 block (there is no deepseek4 backend; its
// --ds4-* options belong to no backend), so a qwen35 model stands in for
// it with the seed's --disk-prefix-cache off and without the --ds4-* ones.
func TestSeedCommandLine(t *testing.T) {
	qwen3, qwen35 := tinyModels(t)
	draft := tinyDraft(t, qwen3)

	t.Run("a bad draft names the block", func(t *testing.T) {
		is := is.New(t)
		args := append(append(append([]string{}, seedHead...), seedQwenBlock(qwen3, qwen35, true, true)...), seedDS4Block(qwen35, false)...)
		code, _, stderr := runCLI(t, realPlugins, withPort(t, args)...)
		is.True(code != 0) // qwen35 is a model, not a draft
		if lines := errorLines(stderr); len(lines) != 1 || !contains(lines[0], qwen3, "draft "+qwen35) {
			t.Errorf("error lines %q do not name the block and its draft", lines)
		}
	})

	t.Run("ds4 options on a qwen35 stand-in name the block", func(t *testing.T) {
		is := is.New(t)
		args := append(append(append([]string{}, seedHead...), seedQwenBlock(qwen3, qwen35, false, false)...), seedDS4Block(qwen35, true)...)
		code, _, stderr := runCLI(t, realPlugins, withPort(t, args)...)
		is.Equal(code, 2)
		lines := errorLines(stderr)
		is.Equal(len(lines), 1)
		if len(lines) == 1 && !contains(lines[0], "--model #2 ("+qwen35+")", "unknown flag --ds4-fused-decode") {
			t.Errorf("error line %q does not name block 2 and its flag", lines[0])
		}
	})

	t.Run("a deepseek4 file names the missing backend", func(t *testing.T) {
		is := is.New(t)
		ds4 := filepath.Join(t.TempDir(), "deepseek-v4-flash.gguf")
		archModel(t, ds4, "deepseek4")
		args := append(append(append([]string{}, seedHead...), seedQwenBlock(qwen3, qwen35, false, false)...), seedDS4Block(ds4, true)...)
		code, _, stderr := runCLI(t, realPlugins, withPort(t, args)...)
		is.Equal(code, 2)
		lines := errorLines(stderr)
		is.Equal(len(lines), 1)
		if len(lines) == 1 && !contains(lines[0], "--model #2 ("+ds4+")", `architecture "deepseek4"`) {
			t.Errorf("error line %q does not name block 2 and its architecture", lines[0])
		}
	})

	t.Run("the rest of the line serves", func(t *testing.T) {
		testRealServer(t, qwen3, qwen35, draft)
	})
}

// withPort fills {port} in args with a free port.
func withPort(t *testing.T, args []string) []string {
	port := itoa(freePort(t))
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = strings.ReplaceAll(a, "{port}", port)
	}
	return out
}

// readyProbe records what /health and /ready answer while a server loads.
type readyProbe struct {
	mu             sync.Mutex
	healthFirst    bool   // /health answered 200 no later than /ready
	readyAnswered  bool   // /ready answered 200
	loadingAnswer  string // a /ready body seen while loading, if any
	loadingStatus  int
	generateStatus int // a generation request sent after that /ready
	generateAnswer string
	done           chan struct{}
}

func probeReadiness(url string) *readyProbe {
	p := &readyProbe{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		deadline := time.Now().Add(startBound)
		healthy := false
		for time.Now().Before(deadline) {
			if r, err := http.Get(url + "/health"); err == nil {
				r.Body.Close()
				healthy = healthy || r.StatusCode == 200
			}
			r, err := http.Get(url + "/ready")
			if err != nil {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			var body strings.Builder
			buf := make([]byte, 512)
			n, _ := r.Body.Read(buf)
			body.Write(buf[:n])
			r.Body.Close()
			p.mu.Lock()
			if r.StatusCode == 200 {
				p.readyAnswered, p.healthFirst = true, healthy
				p.mu.Unlock()
				return
			}
			if p.loadingAnswer == "" {
				p.loadingAnswer, p.loadingStatus = body.String(), r.StatusCode
				// The load may end between the two requests: a 200 is
				// possible, a 503 must say why.
				if c, err := http.Post(url+pathChat, "application/json",
					strings.NewReader(`{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`)); err == nil {
					n, _ := c.Body.Read(buf)
					c.Body.Close()
					p.generateStatus, p.generateAnswer = c.StatusCode, string(buf[:n])
				}
			}
			p.mu.Unlock()
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return p
}

func testRealServer(t *testing.T, qwen3, qwen35, draft string) {
	var probe *readyProbe
	args := append(append(append([]string{}, seedHead...), seedQwenBlock(qwen3, draft, true, true)...), seedDS4Block(qwen35, false)...)
	s := startServer(t, serverOpts{plugins: realPlugins, args: args, watch: func(url string) { probe = probeReadiness(url) }})

	t.Run("health answers before ready", func(t *testing.T) {
		is := is.New(t)
		<-probe.done
		probe.mu.Lock()
		defer probe.mu.Unlock()
		is.True(probe.readyAnswered)
		is.True(probe.healthFirst)
		if probe.loadingAnswer == "" {
			t.Log("the load finished before the first /ready probe: loading state not observed")
			return
		}
		is.Equal(probe.loadingStatus, 503)
		is.True(strings.Contains(probe.loadingAnswer, "loading"))
		if probe.generateStatus != 200 {
			is.Equal(probe.generateStatus, 503)
			is.True(strings.Contains(probe.generateAnswer, "server is loading"))
		}
	})

	t.Run("placement", func(t *testing.T) {
		is := is.New(t)
		st := s.status(t)
		is.Equal(st.Priority, []string{"qwen", "ds4"})
		is.Equal(st.model("qwen").Arch, "qwen3")
		is.Equal(st.model("ds4").Arch, "qwen35")
		is.Equal(st.model("ds4").Device, "cpu:1")
		is.Equal(st.model("qwen").DraftDevice, "cpu:0") // the seed's --draft-device
		is.Equal(st.model("ds4").DraftDevice, "")
		is.Equal(st.model("qwen").Capacity.KVPoolTokens, 16384)
		is.Equal(st.model("ds4").Capacity.MaxCtx, 8192)
	})

	t.Run("every API generates text", func(t *testing.T) {
		for _, api := range []string{pathChat, pathCompletions, pathMessages, pathResponses} {
			is := is.New(t)
			text, usage := generate(t, s, api, "qwen")
			is.True(text != "")
			is.True(usage[0] > 0)                  // prompt tokens
			is.True(usage[1] > 0 && usage[1] <= 8) // generated tokens within the budget
		}
		// qwen decoded through its draft (engine statistics reach /status/json within a second)
		waitFor(t, "qwen's acceptance length in /status/json", func() bool { return s.status(t).model("qwen").AcceptanceLength >= 1 })
	})

	t.Run("fallback to the second real model on every API", func(t *testing.T) {
		// Four long generations fill qwen's slots; the next requests go to
		// ds4 (the qwen35 model), one at a time.
		var holders []*call
		for i := 0; i < 4; i++ {
			holders = append(holders, s.hold(t, "", "qwen"))
		}
		defer release(holders...)
		for _, api := range []string{pathChat, pathCompletions, pathMessages, pathResponses} {
			is := is.New(t)
			text, usage := generate(t, s, api, "ds4")
			is.True(text != "")
			is.True(usage[0] > 0 && usage[1] > 0)
		}
		release(holders...)
		s.waitIdle(t)
	})

	t.Run("official clients", func(t *testing.T) {
		dir := filepath.Join(env.root, "test", "clients")
		if _, err := os.Stat(filepath.Join(dir, "node_modules")); err != nil {
			skip, err := npmCI(dir)
			if skip != "" {
				unavailable(t, skip)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command("npm", "test")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "DFLASH_URL="+s.url, "DFLASH_MODEL=qwen", "DFLASH_SCRIPTED=", "DFLASH_MAX_TOKENS=16")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("npm test against the real server: %v\n%s", err, tail(string(out), 80))
		}
		t.Logf("npm test: %s", summaryLines(string(out)))
	})
}

// generate sends a small non-streaming request on api and returns the
// generated text (content or reasoning) and [prompt, completion] tokens;
// want is the model that must answer.
func generate(t *testing.T, s *server, api, want string) (string, [2]int) {
	t.Helper()
	user := []any{map[string]any{"role": "user", "content": "Hello, who are you?"}}
	var body map[string]any
	switch api {
	case pathChat:
		body = map[string]any{"messages": user, "max_tokens": 8}
	case pathMessages:
		body = map[string]any{"messages": user, "max_tokens": 8}
	case pathResponses:
		body = map[string]any{"input": "Hello, who are you?", "max_output_tokens": 8}
	case pathCompletions:
		body = map[string]any{"prompt": "Hello, who are you?", "max_tokens": 8}
	}
	c := s.post(t, api, body)
	if c.status != 200 {
		t.Fatalf("%s: status %d: %s", api, c.status, c.bodyBytes())
	}
	if c.model() != want {
		t.Fatalf("%s: answered by %q, want %q", api, c.model(), want)
	}
	var text string
	var usage [2]int
	switch api {
	case pathChat:
		r := decode[chatResult](t, c.bodyBytes())
		text = r.Choices[0].Message.Content + r.Choices[0].Message.ReasoningContent
		usage = [2]int{r.Usage.PromptTokens, r.Usage.CompletionTokens}
	case pathCompletions:
		r := decode[struct {
			Choices []struct{ Text string }
			Usage   struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
			}
		}](t, c.bodyBytes())
		text = r.Choices[0].Text
		usage = [2]int{r.Usage.PromptTokens, r.Usage.CompletionTokens}
	case pathMessages:
		r := decode[struct {
			Content []struct{ Type, Text, Thinking string }
			Usage   struct {
				InputTokens  int `json:"input_tokens"`
				OutputTokens int `json:"output_tokens"`
			}
		}](t, c.bodyBytes())
		for _, b := range r.Content {
			text += b.Text + b.Thinking
		}
		usage = [2]int{r.Usage.InputTokens, r.Usage.OutputTokens}
	case pathResponses:
		var r struct {
			Output []struct {
				Type    string
				Content []struct{ Type, Text string }
			}
			Usage struct {
				InputTokens  int `json:"input_tokens"`
				OutputTokens int `json:"output_tokens"`
			}
		}
		if err := json.Unmarshal(c.bodyBytes(), &r); err != nil {
			t.Fatalf("decode %s: %v", c.bodyBytes(), err)
		}
		for _, o := range r.Output {
			for _, p := range o.Content {
				text += p.Text
			}
		}
		usage = [2]int{r.Usage.InputTokens, r.Usage.OutputTokens}
	}
	return text, usage
}

// summaryLines keeps the totals of node's test runner (TAP when its
// output is not a terminal).
func summaryLines(out string) string {
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		for _, p := range []string{"# tests ", "# pass ", "# fail ", "# skipped "} {
			if strings.HasPrefix(l, p) {
				keep = append(keep, strings.TrimPrefix(l, "# "))
			}
		}
	}
	return strings.Join(keep, ", ")
}
