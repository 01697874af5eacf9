package api

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dflash/dflash_server/core/router"
	"github.com/dflash/dflash_server/sdk"
)

// TestOfficialClients runs test/clients (the official openai and
// @anthropic-ai/sdk packages and the AI SDK's OpenAI-compatible provider,
// under node's test runner) against this package served over a scripted
// fake router. The same JS tests run against a real server when DFLASH_URL
// points at one; DFLASH_SCRIPTED=1 turns on the assertions that need this
// script's exact outputs.
func TestOfficialClients(t *testing.T) {
	if testing.Short() {
		t.Skip("client SDK tests need node; skipped with -short")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed: test/clients needs Node.js >= 20 and npm (Debian: apt-get install nodejs npm)")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatal("npm is not installed: test/clients needs Node.js >= 20 and npm (Debian: apt-get install nodejs npm)")
	}
	dir, err := filepath.Abs(filepath.Join("..", "..", "test", "clients"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := os.Stat(filepath.Join(dir, "node_modules")); err != nil {
		cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.test.mjs"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no *.test.mjs files in %s (%v)", dir, err)
	}
	sort.Strings(files)

	const key = "client-test-key"
	srv := httptest.NewServer(New(newScriptedRouter(), Options{Logger: discardLogger(), APIKeys: []string{key}}))
	defer srv.Close()
	cmd := exec.CommandContext(ctx, node, append([]string{"--test", "--test-reporter=spec"}, files...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "DFLASH_URL="+srv.URL, "DFLASH_SCRIPTED=1", "DFLASH_API_KEY="+key, "NO_COLOR=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test failed: %v\n%s", err, out)
	}
	t.Logf("node --test:\n%s", tail(string(out), 40))
}

func tail(s string, lines int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > lines {
		l = l[len(l)-lines:]
	}
	return strings.Join(l, "\n")
}

// newScriptedRouter answers by markers in the last user or tool message, so
// that the JS tests can ask for each behaviour:
//
//	[[503]]          refused: queue full, Retry-After 1s
//	[[503-once:N]]   refused the first time nonce N is seen, served after
//	[[never_fits]]   refused: 400 never fits
//	[[fail]]         "Partial", then a backend failure
//	[[reason]]       reasoning, then the answer
//	[[tool]]         a call of the first tool, arguments in pieces (also
//	                 what a forced tool_choice gets, naming its function)
//	json_schema      {"answer":"yes"} (response_format json_schema)
//	[[long]]         text, then finish by length
//	[[stop]]         text, then finish by the request's first stop string
//	a tool result    "The weather in Oslo is <result>."
//	anything else    "Hello from dflash! 😀 You said: <text>"
//
// Prompt tokens are the bytes of all message contents, the same count the
// fake CountTokens gives, so count_tokens agrees with usage.
func newScriptedRouter() *fakeRouter {
	var mu sync.Mutex
	seen := map[string]bool{}
	fr := &fakeRouter{}
	fr.script = func(req *sdk.ChatRequest) (*fakeStream, error) {
		_, prompt, _ := fr.CountTokens(context.Background(), req)
		last := sdk.Message{}
		if n := len(req.Messages); n > 0 {
			last = req.Messages[n-1]
		}
		text := last.Content
		if req.Prompt != nil {
			text = req.Prompt.Text // a text completion's prompt
		}
		forced := req.ToolChoice == "required" || strings.HasPrefix(string(req.ToolChoice), "function:")
		if i := strings.Index(text, "[[503-once:"); i >= 0 {
			nonce := text[i:]
			mu.Lock()
			first := !seen[nonce]
			seen[nonce] = true
			mu.Unlock()
			if first {
				return nil, &router.Rejection{Reason: router.ReasonQueueFull, Message: "all models are busy; the waiting queue is full (0)"}
			}
		}
		var evs []sdk.Event
		reason := sdk.FinishStop
		var stopSeq string
		var failure error
		switch {
		case strings.Contains(text, "[[503]]"):
			return nil, &router.Rejection{Reason: router.ReasonQueueFull, Message: "all models are busy; the waiting queue is full (0)"}
		case strings.Contains(text, "[[never_fits]]"):
			return nil, &router.Rejection{Reason: router.ReasonNeverFits, Message: "the request needs 9000 tokens; fake-model holds 4096"}
		case last.Role == "tool":
			evs = []sdk.Event{{Text: "The weather in Oslo is "}, {Text: last.Content}, {Text: "."}}
		case strings.Contains(text, "[[fail]]"):
			evs = []sdk.Event{{Text: "Partial"}}
			failure = errors.New("backend fake-model restarted during generation")
		case strings.Contains(text, "[[reason]]"):
			evs = []sdk.Event{{Reasoning: "Two plus two; "}, {Reasoning: "that is four."}, {Text: "2 + 2 = 4"}}
		case req.ResponseFormat == "json_schema":
			evs = []sdk.Event{{Text: `{"answer":`}, {Text: `"yes"}`}}
		case (forced || strings.Contains(text, "[[tool]]")) && len(req.Tools) > 0:
			name := req.Tools[0].Name
			if n, ok := strings.CutPrefix(string(req.ToolChoice), "function:"); ok {
				name = n
			}
			evs = []sdk.Event{
				{ToolCalls: []sdk.ToolCallDelta{{Index: 0, ID: "call_fake1", Name: name}}},
				{ToolCalls: []sdk.ToolCallDelta{{Index: 0, ArgumentsDelta: `{"city"`}}},
				{ToolCalls: []sdk.ToolCallDelta{{Index: 0, ArgumentsDelta: `:"Oslo"}`}}},
			}
			reason = sdk.FinishToolCalls
		case strings.Contains(text, "[[long]]"):
			evs = []sdk.Event{{Text: "This answer is cut"}}
			reason = sdk.FinishLength
		case strings.Contains(text, "[[stop]]") && len(req.Stop) > 0:
			evs = []sdk.Event{{Text: "1, 2, 3"}}
			reason, stopSeq = sdk.FinishStopSequence, req.Stop[0]
		default:
			evs = []sdk.Event{{Text: "Hello"}, {Text: " from dflash! \xF0\x9F"}, {Text: "\x98\x80 You said: "}, {Text: text}}
		}
		reasoningTokens := 0
		for _, e := range evs {
			if e.Reasoning != "" {
				reasoningTokens++
			}
		}
		if failure == nil {
			evs = append(evs, sdk.Event{Finish: &sdk.Finish{Reason: reason, StopSequence: stopSeq,
				Usage: sdk.Usage{PromptTokens: prompt, CompletionTokens: len(evs), ReasoningTokens: reasoningTokens}}})
		}
		return &fakeStream{route: "primary", admission: sdk.Admission{Outcome: sdk.OutcomeAdmitted, PromptTokens: prompt},
			events: evs, failWith: failure}, nil
	}
	return fr
}
