package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/matryer/is"
)

// seedDevices place the seed line's blocks: qwen on cpu:0 and ds4 on cpu:1
// in make test; on the GPU machine as the issue places them with
// DFLASH_E2E_QWEN_DEVICE=cuda:0 DFLASH_E2E_DS4_DEVICE=cpu:0.
var seedDevices = struct{ qwen, ds4 string }{
	qwen: envOr("DFLASH_E2E_QWEN_DEVICE", "cpu:0"),
	ds4:  envOr("DFLASH_E2E_DS4_DEVICE", "cpu:1"),
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// seedQwenBlock is the qwen block of the seed's example command line with
// the model replaced by a tiny real one and hip:0 by seedDevices.qwen. Its listener
// options stay in the block, as in the seed. draft adds the seed's
// --draft (and --draft-device when draftDevice).
func seedQwenBlock(model, draftModel string, draft, draftDevice bool) []string {
	b := []string{"--model", model, "--model-name", "qwen", "--target-device", seedDevices.qwen}
	if draft {
		b = append(b, "--draft", draftModel)
		if draftDevice {
			b = append(b, "--draft-device", seedDevices.qwen)
		}
	}
	return append(b,
		"--max-ctx", "4096", "--max-concurrency", "4", "--kv-pool-tokens", "16384",
		"--cache-type-k", "q8_0", "--cache-type-v", "q8_0", "--fa-window", "0",
		"--default-max-tokens", "2048", "--hard-limit-reply-budget", "1024",
		"--host", "127.0.0.1", "--port", "{port}", "--routing-queue-limit", "32")
}

// seedDS4Block is the seed's ds4 block on seedDevices.ds4, verbatim but for the
// model path and the device. --ds4-fused-decode (captured CUDA graphs) is
// refused on a cpu device, so it is only there when fused.
func seedDS4Block(model string, fused bool) []string {
	b := []string{"--model", model, "--model-name", "ds4", "--target-device", seedDevices.ds4,
		"--max-ctx", "8192", "--max-concurrency", "1",
		"--default-max-tokens", "2048", "--hard-limit-reply-budget", "1024",
		"--prefix-cache-slots", "0", "--prefill-cache-slots", "0", "--disk-prefix-cache", "off"}
	if fused {
		b = append(b, "--ds4-fused-decode")
	}
	return append(b, "--ds4-expert-top-k", "6", "--ds4-prefill", "exact")
}

// seedFused is whether the seed's --ds4-fused-decode is in the line: where ds4
// is on a cuda device (captured decode graphs), as the seed has it; a cpu
// device refuses the flag, which a subtest checks.
var seedFused = strings.HasPrefix(seedDevices.ds4, "cuda")

var seedHead = []string{"--load-balancing", "--load-balancing-primary-gpu", seedDevices.qwen}

// seedLine is the seed's whole example launch: head, qwen block (with
// its draft when draft is not ""), ds4 block.
func seedLine(head []string, qwen, draft, ds4 string, fused bool) []string {
	return slices.Concat(head, seedQwenBlock(qwen, draft, draft != "", true), seedDS4Block(ds4, fused))
}

var realPlugins = []string{"backend-qwen-dflash", "backend-ds4", "policy-primary-first"}

// TestSeedCommandLine runs the seed's example launch with tiny real
// models (on seedDevices): qwen (qwen35) with its DFlash2 draft on cpu:0, ds4 (a deepseek4
// model from dflash-model mk, 6 of 8 routed experts) on the ds4 backend on
// cpu:1. --ds4-fused-decode is in the served line where ds4 is on cuda
// (seedFused); a cpu device refuses it, which a subtest checks.
func TestSeedCommandLine(t *testing.T) {
	qwen3, qwen35 := tinyModels(t)
	draft := tinyDraft2(t, qwen35)
	ds4 := tinyDS4(t)

	t.Run("a bad draft names the block", func(t *testing.T) {
		is := is.New(t)
		code, _, stderr := runCLI(t, realPlugins, withPort(t, seedLine(seedHead, qwen35, qwen3, ds4, seedFused))...)
		is.True(code != 0) // qwen3 is a model, not a draft
		var named int
		for _, l := range errorLines(stderr) {
			switch {
			case contains(l, qwen35, "draft "+qwen3):
				named++
			default:
				t.Errorf("unexpected error line %q", l)
			}
		}
		is.Equal(named, 1) // one line names the block and its draft
	})

	t.Run("ds4 fused decode on a cpu device names the block, the flag and the device", func(t *testing.T) {
		if strings.HasPrefix(seedDevices.ds4, "cuda") {
			t.Skip("ds4 is on " + seedDevices.ds4 + ", which takes --ds4-fused-decode")
		}
		is := is.New(t)
		code, _, stderr := runCLI(t, realPlugins, withPort(t, seedLine(seedHead, qwen35, draft, ds4, true))...)
		is.True(code != 0)
		lines := errorLines(stderr)
		is.Equal(len(lines), 1)
		if len(lines) == 1 && !contains(lines[0], "--model #2 ("+ds4+")", "--ds4-fused-decode: captured decode graphs need a cuda device; this block's device is "+seedDevices.ds4) {
			t.Errorf("error line %q does not name block 2, its flag and its device", lines[0])
		}
	})

	t.Run("a ds4 option on the qwen block names the block", func(t *testing.T) {
		is := is.New(t)
		args := slices.Concat(seedHead, seedQwenBlock(qwen35, draft, true, true), []string{"--ds4-prefill", "exact"}, seedDS4Block(ds4, seedFused))
		code, _, stderr := runCLI(t, realPlugins, withPort(t, args)...)
		is.Equal(code, 2)
		lines := errorLines(stderr)
		is.Equal(len(lines), 1)
		if len(lines) == 1 && !contains(lines[0], "--model #1 ("+qwen35+")", "--ds4-prefill") {
			t.Errorf("error line %q does not name block 1 and its flag", lines[0])
		}
	})

	t.Run("the line serves", func(t *testing.T) {
		testRealServer(t, qwen35, ds4, draft)
	})

	t.Run("SIGTERM drains qwen and ds4 streams", func(t *testing.T) { testSeedDrain(t, qwen35, draft, ds4) })

	t.Run("balancing disabled", func(t *testing.T) { testSeedBalancingDisabled(t, qwen35, draft, ds4) })

	t.Run("primary "+seedDevices.ds4+" reverses the priority", func(t *testing.T) {
		head := []string{"--load-balancing", "--load-balancing-primary-gpu", seedDevices.ds4} // the only change
		s := startServer(t, serverOpts{plugins: realPlugins, args: seedLine(head, qwen35, draft, ds4, seedFused)})
		is := is.New(t)
		st := s.status(t)
		is.Equal(st.Priority, []string{"ds4", "qwen"})
		is.True(st.model("ds4").Primary)
		is.Equal(st.model("ds4").Device, seedDevices.ds4) // placement unchanged
		is.Equal(st.model("qwen").Device, seedDevices.qwen)
		for _, api := range []string{pathChat, pathMessages, pathResponses} {
			// ds4 has one slot: the request before may not have given it back yet when its reply has arrived, and
			// the request would then rightly fall back to qwen
			s.waitIdle(t)
			text, usage := generate(t, s, api, "ds4") // ds4 first now
			is.True(text != "")
			is.True(usage[0] > 0 && usage[1] > 0)
		}
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

func testRealServer(t *testing.T, qwen, ds4, draft string) {
	var probe *readyProbe
	s := startServer(t, serverOpts{plugins: realPlugins, args: seedLine(seedHead, qwen, draft, ds4, seedFused),
		watch: func(url string) { probe = probeReadiness(url) }})

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
		for _, path := range []string{"/status/json", "/props"} {
			is := is.New(t)
			var st status
			is.Equal(s.getJSON(t, path, &st), 200)
			is.True(st.LoadBalancing)
			is.Equal(st.Priority, []string{"qwen", "ds4"})
			is.True(st.model("qwen").Primary)
			is.Equal(st.model("qwen").Arch, "qwen35")
			is.Equal(st.model("qwen").Device, seedDevices.qwen)
			is.Equal(st.model("qwen").Backend, "qwen-dflash")
			is.Equal(st.model("ds4").Arch, "deepseek4")
			is.Equal(st.model("ds4").Device, seedDevices.ds4)
			is.Equal(st.model("ds4").Backend, "ds4")
			is.True(!st.model("ds4").Primary)
			is.Equal(st.model("qwen").DraftDevice, seedDevices.qwen) // the seed's --draft-device
			is.Equal(st.model("ds4").DraftDevice, "")
			is.Equal(st.model("qwen").Capacity.KVPoolTokens, 16384)
			is.Equal(st.model("qwen").Capacity.Slots, 4)
			is.Equal(st.model("ds4").Capacity.MaxCtx, 8192)
			is.Equal(st.model("ds4").Capacity.Slots, 1)
		}
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
		// ds4 (the deepseek4 model on the ds4 backend), one at a time.
		var holders []*call
		for range seedQwenSlots {
			holders = append(holders, s.holdWith(t, storyStream("", seedQwenHold), "qwen"))
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

	testSeedAdmission(t, s)

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

	// Last: it leaves ds4 with a restart behind it.
	testSeedDS4Killed(t, s, ds4)
}

// generate sends a small non-streaming request on api and returns the
// generated text (content or reasoning) and [prompt, completion] tokens;
// want is the model that must answer.
func generate(t *testing.T, s *server, api, want string) (string, [2]int) {
	t.Helper()
	body := apiBody(api, "", "Hello, who are you?", 8, false)
	body["temperature"] = 0 // greedy: a random model's sampled reply can be an immediate end of turn
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
