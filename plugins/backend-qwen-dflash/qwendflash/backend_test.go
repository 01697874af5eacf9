package qwendflash

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/sdktest"
	"github.com/dflash/dflash_server/sdk/transport"
)

// stream records one Start stream.
type stream struct {
	mu       sync.Mutex
	adm      sdk.Admission
	events   []sdk.Event
	admitted chan struct{}
	onEvent  func(n int) error
}

func newStream() *stream { return &stream{admitted: make(chan struct{})} }

func (s *stream) Admit(a sdk.Admission) error {
	s.mu.Lock()
	s.adm = a
	s.mu.Unlock()
	close(s.admitted)
	return nil
}

func (s *stream) Emit(ev sdk.Event) error {
	s.mu.Lock()
	n := len(s.events)
	s.events = append(s.events, ev)
	s.mu.Unlock()
	if s.onEvent != nil {
		return s.onEvent(n)
	}
	return nil
}

type summary struct {
	reasoning, text string
	tokens          []int32
	logprobs        []sdk.TokenLogprob
	finish          *sdk.Finish
}

func (s *stream) summary() summary {
	s.mu.Lock()
	defer s.mu.Unlock()
	var r summary
	for _, ev := range s.events {
		r.reasoning += ev.Reasoning
		r.text += ev.Text
		r.tokens = append(r.tokens, ev.TokenIDs...)
		r.logprobs = append(r.logprobs, ev.Logprobs...)
		if ev.Finish != nil {
			r.finish = ev.Finish
		}
	}
	return r
}

func (s *stream) admission() sdk.Admission {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.adm
}

func blockConfig(t testing.TB, path string) sdk.ModelConfig {
	return sdk.ModelConfig{
		Path: path, Name: "tiny", Architecture: "qwen3", Device: "cpu:0", LibDir: libDirForTests(t),
		MaxCtx: 256, MaxConcurrency: 4, KVPoolTokens: 1024, DefaultMaxTokens: 32,
		Options: map[string]string{"threads": "1"},
	}
}

// load loads a model into a fresh backend served over in-process gRPC.
func load(t testing.TB, cfg sdk.ModelConfig) (*Backend, *transport.BackendClient, sdk.ModelDescription) {
	t.Helper()
	b := New()
	c := sdktest.Backend(t, b)
	desc, err := c.Load(context.Background(), cfg, nil)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() { _ = b.Shutdown(context.Background()) })
	return b, c, desc
}

func f64(v float64) *float64 { return &v }
func i64(v int64) *int64     { return &v }
func boolp(v bool) *bool     { return &v }

func chatReq(text string, maxTokens int) *sdk.ChatRequest {
	return &sdk.ChatRequest{
		Messages: []sdk.Message{{Role: "user", Content: text}}, MaxTokens: maxTokens, IgnoreEOS: true,
		Sampling: sdk.Sampling{Temperature: f64(0), Seed: i64(1)},
	}
}

func TestInfoAndOptions(t *testing.T) {
	c := sdktest.Backend(t, New())
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Run("info", func(t *testing.T) {
		is := is.New(t)
		is.Equal(info.Name, "qwen-dflash")
		is.Equal(info.Architectures, []string{"qwen3", "qwen35"})
		shared := map[string]bool{}
		for _, o := range info.Options {
			shared[o.Name] = o.SharedProcessPolicy
		}
		is.True(!shared["draft-device"]) // only a remote draft is unshareable, decided with MultiModel
		is.True(shared["target-split"])
		is.True(!shared["cache-type-k"])
		_, declared := shared["draft"]
		is.True(declared) // --draft is known to the CLI
	})
	for _, tc := range []struct {
		name string
		opts map[string]string
		want []string // substrings of the error; none = valid
	}{
		{"defaults", nil, nil},
		{"valid", map[string]string{"cache-type-k": "q8_0", "cache-type-v": "bf16", "threads": "2", "fa-window": "0", "prefix-cache-slots": "4"}, nil},
		{"draft", map[string]string{"draft": "/m/draft.gguf", "draft-device": "cpu", "draft-block-size": "8"}, nil},
		{"tree budget", map[string]string{"draft": "/m/draft.gguf", "spec-tree-budget": "22"}, nil},
		{"tree budget too large", map[string]string{"draft": "/m/draft.gguf", "spec-tree-budget": "64"}, []string{"--spec-tree-budget: 64 is outside [0, 63]"}},
		{"block of one", map[string]string{"draft": "/m/draft.gguf", "draft-block-size": "1"}, []string{"--draft-block-size: 1 leaves no proposal"}},
		{"sample and match", map[string]string{"draft": "/m/draft.gguf", "spec-sampling": "match"}, nil},
		{"bad spec sampling", map[string]string{"draft": "/m/draft.gguf", "spec-sampling": "argmax"}, []string{`--spec-sampling: "argmax" is not one of draft, match`}},
		{"spec sampling alone", map[string]string{"spec-sampling": "draft"}, []string{"--spec-sampling: needs --draft"}},
		{"bad draft device", map[string]string{"draft": "/m/draft.gguf", "draft-device": "cuda:x"}, []string{"--draft-device: device \"cuda:x\": bad device index"}},
		{"bad cache type", map[string]string{"cache-type-k": "q4_0"}, []string{`--cache-type-k: "q4_0" is not a KV cache type (want f32, f16, bf16, q8_0)`}},
		{"fa window", map[string]string{"fa-window": "128"}, []string{"--fa-window: 128 is not supported"}},
		{"prefill cache", map[string]string{"prefill-cache-slots": "4"}, []string{"--prefill-cache-slots: 4 is not supported"}},
		{"prefix cache negative", map[string]string{"prefix-cache-slots": "-1"}, []string{"--prefix-cache-slots: -1 is outside"}},
		{"draft device alone", map[string]string{"draft-device": "cuda:1"}, []string{"--draft-device: needs --draft"}},
		{"not a number", map[string]string{"threads": "many"}, []string{`--threads: "many" is not an integer`}},
		{"warm-up off", map[string]string{"warmup": "off"}, nil},
		{"bad warm-up", map[string]string{"warmup": "yes"}, []string{`--warmup: "yes" is not one of auto, on, off`}},
		{"unknown", map[string]string{"ds4-fused-decode": "true"}, []string{"--ds4-fused-decode: unknown option"}},
		{"all reported", map[string]string{"threads": "-1", "cache-type-v": "x"}, []string{"--threads: -1 is outside", "--cache-type-v:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			err := c.ValidateOptions(context.Background(), sdk.ModelConfig{Options: tc.opts})
			if len(tc.want) == 0 {
				is.NoErr(err)
				return
			}
			var inv *sdk.InvalidError
			is.True(errors.As(err, &inv)) // refused as invalid
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestGenerate(t *testing.T) {
	q3, q35 := tinyModels(t)
	for _, path := range []string{q3, q35} {
		t.Run(path[strings.LastIndex(path, "/")+1:], func(t *testing.T) {
			is := is.New(t)
			_, c, desc := load(t, blockConfig(t, path))
			is.Equal(desc.MaxCtx, 256)
			is.Equal(desc.KVPoolTokens, 1024)
			is.Equal(desc.MaxConcurrency, 4)
			req := chatReq("Tell me the time.", 12)
			req.Reasoning.Enabled = boolp(false)
			n, err := c.CountTokens(context.Background(), req)
			is.NoErr(err)
			s := newStream()
			is.NoErr(c.Start(context.Background(), req, s))
			is.Equal(s.admission().Outcome, sdk.OutcomeAdmitted)
			is.Equal(s.admission().PromptTokens, n)
			r := s.summary()
			is.Equal(len(r.tokens), 12)
			is.True(r.finish != nil)
			is.Equal(r.finish.Reason, sdk.FinishLength)
			is.Equal(r.finish.Usage.PromptTokens, n)
			is.Equal(r.finish.Usage.CompletionTokens, 12)
			is.Equal(r.reasoning, "") // thinking disabled: the prompt closed <think>
			is.True(r.text != "")
			st, err := c.Stats(context.Background())
			is.NoErr(err)
			is.Equal(st.ActiveSequences, 0)
			is.Equal(st.KVTokensUsed, 0)
			is.Equal(st.TokensGenerated, int64(12))
		})
	}
}

// TestWarmupLeavesNoTrace loads each model with the warm-up request (--warmup on; auto runs it on a GPU only) and
// without: the same greedy request gives the same tokens on both, and the warmed model's counters and KV hold the
// client's request alone (the warm-up ran on an engine of its own, with the prefix cache this block has).
func TestWarmupLeavesNoTrace(t *testing.T) {
	q3, q35 := tinyModels(t)
	for _, path := range []string{q3, q35} {
		t.Run(path[strings.LastIndex(path, "/")+1:], func(t *testing.T) {
			is := is.New(t)
			run := func(warmup string) (summary, sdk.ModelStats) {
				cfg := blockConfig(t, path)
				cfg.Options["warmup"] = warmup
				cfg.Options["prefix-cache-slots"] = "2"
				b := New()
				c := sdktest.Backend(t, b)
				var stages []string
				_, err := c.Load(context.Background(), cfg, func(p sdk.LoadProgress) { stages = append(stages, p.Stage) })
				is.NoErr(err)
				t.Cleanup(func() { _ = b.Shutdown(context.Background()) })
				is.Equal(slices.Contains(stages, "warming"), warmup == "on") // the load ran the warm-up (or not)
				st, err := c.Stats(context.Background())
				is.NoErr(err)
				is.Equal(st.TokensGenerated, int64(0)) // nothing counted at load
				is.Equal(st.PromptTokens, int64(0))
				is.Equal(st.KVTokensUsed, 0)
				s := newStream()
				is.NoErr(c.Start(context.Background(), chatReq("Tell me the time.", 12), s))
				st, err = c.Stats(context.Background())
				is.NoErr(err)
				return s.summary(), st
			}
			cold, coldStats := run("off")
			warm, warmStats := run("on")
			is.Equal(len(warm.tokens), 12)
			is.Equal(warm.tokens, cold.tokens) // the warm-up left no state behind
			is.Equal(warmStats.TokensGenerated, coldStats.TokensGenerated)
			is.Equal(warmStats.PromptTokens, coldStats.PromptTokens)
			is.Equal(warm.finish.Usage.PromptTokens, cold.finish.Usage.PromptTokens)
			is.Equal(warm.finish.Usage.CachedTokens, 0) // no prefix of the warm-up's was kept
		})
	}
}

func TestThinkingBudgets(t *testing.T) {
	q3, _ := tinyModels(t)
	for _, tc := range []struct {
		name      string
		think     int
		hard      int
		budget    int
		maxTokens int
		// reasoning tokens: the budget plus the close tag's tokens fed while
		// still inside <think> ("\n" and "</think>").
		reasonTok int
	}{
		{name: "think max tokens", think: 5, maxTokens: 20, reasonTok: 5 + 2},
		{name: "budget tokens tighter", think: 9, budget: 3, maxTokens: 20, reasonTok: 3 + 2},
		{name: "hard limit reply budget", hard: 8, maxTokens: 20, reasonTok: 12 + 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			cfg := blockConfig(t, q3)
			cfg.ThinkMaxTokens, cfg.HardLimitReplyBudget = tc.think, tc.hard
			_, c, _ := load(t, cfg)
			req := chatReq("Think first.", tc.maxTokens)
			req.Reasoning.BudgetTokens = tc.budget
			s := newStream()
			is.NoErr(c.Start(context.Background(), req, s))
			r := s.summary()
			is.Equal(r.finish.Usage.ReasoningTokens, tc.reasonTok)
			is.True(r.reasoning != "")
			is.True(!strings.Contains(r.reasoning, "</think>"))
			is.True(!strings.Contains(r.text, "</think>"))
			is.Equal(r.finish.Usage.CompletionTokens, tc.maxTokens)
		})
	}
}

func TestAdmission(t *testing.T) {
	q3, _ := tinyModels(t)
	is := is.New(t)
	cfg := blockConfig(t, q3)
	cfg.MaxConcurrency = 1
	b, c, _ := load(t, cfg)

	s := newStream()
	is.NoErr(c.Start(context.Background(), chatReq("hi", 1000), s))
	adm := s.admission()
	is.Equal(adm.Outcome, sdk.OutcomeNeverFits)
	is.Equal(adm.LimitTokens, 256)
	is.Equal(adm.NeededTokens, adm.PromptTokens+256) // max tokens clamped to --max-tokens (default: the context)
	is.True(strings.Contains(adm.Reason, "context of 256"))

	s = newStream()
	is.NoErr(c.Start(context.Background(), &sdk.ChatRequest{ResponseFormat: "json_schema", Messages: []sdk.Message{{Role: "user", Content: "x"}}}, s))
	is.Equal(s.admission().Outcome, sdk.OutcomeInvalid)
	is.True(strings.Contains(s.admission().Reason, "response_format"))

	// Hold the only slot with a consumer that waits (called directly, so no
	// gRPC buffer lets the sequence run ahead: the engine pauses it with a
	// full outbox), then ask again.
	hold := make(chan struct{})
	first := newStream()
	first.onEvent = func(n int) error {
		if n == 0 {
			<-hold
		}
		return nil
	}
	done := make(chan error)
	go func() { done <- b.Start(context.Background(), chatReq("hold the slot", 100), first) }()
	<-first.admitted
	s = newStream()
	is.NoErr(c.Start(context.Background(), chatReq("me too", 8), s))
	is.Equal(s.admission().Outcome, sdk.OutcomeBusy)
	is.True(strings.Contains(s.admission().Reason, "no free sequence slot"))
	close(hold)
	is.NoErr(<-done)
	is.Equal(len(first.summary().tokens), 100)
}

func TestCancelFreesKV(t *testing.T) {
	q3, _ := tinyModels(t)
	is := is.New(t)
	b, _, _ := load(t, blockConfig(t, q3))
	ctx, cancel := context.WithCancel(context.Background())
	s := newStream()
	s.onEvent = func(n int) error {
		if n == 2 {
			cancel()
		}
		return nil
	}
	err := b.Start(ctx, chatReq("go on and on", 200), s)
	is.True(errors.Is(err, context.Canceled))
	st, err := b.Stats(context.Background())
	is.NoErr(err)
	is.Equal(st.ActiveSequences, 0) // freed before Start returned
	is.Equal(st.KVTokensUsed, 0)
	kv, err := b.loaded().Native.KVStats()
	is.NoErr(err)
	is.Equal(kv.BlocksFree, kv.BlocksTotal)
	is.Equal(kv.SeqsFree, kv.SeqsTotal)
	is.True(s.summary().finish == nil)
}

func TestTokenizeRoundTrip(t *testing.T) {
	q3, _ := tinyModels(t)
	is := is.New(t)
	_, c, _ := load(t, blockConfig(t, q3))
	ids, err := c.Tokenize(context.Background(), "the answer <think>", false)
	is.NoErr(err)
	text, err := c.Detokenize(context.Background(), ids)
	is.NoErr(err)
	is.Equal(text, "the answer <think>")
	_, err = c.Detokenize(context.Background(), []int32{1 << 20})
	var inv *sdk.InvalidError
	is.True(errors.As(err, &inv))
}

func TestCancelOverGRPCFreesKV(t *testing.T) {
	q3, _ := tinyModels(t)
	is := is.New(t)
	_, c, _ := load(t, blockConfig(t, q3))
	ctx, cancel := context.WithCancel(context.Background())
	s := newStream()
	s.onEvent = func(n int) error {
		if n == 2 {
			cancel()
		}
		return nil
	}
	err := c.Start(ctx, chatReq("go on and on", 200), s)
	is.True(errors.Is(err, context.Canceled))
	// The host returns at once; the plugin frees the sequence when its
	// stream context ends. Wait (bounded) for that to show.
	var st sdk.ModelStats
	for range 2000 {
		st, err = c.Stats(context.Background())
		is.NoErr(err)
		if st.ActiveSequences == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	is.Equal(st.ActiveSequences, 0)
	is.Equal(st.KVTokensUsed, 0)
	is.True(st.TokensGenerated < 200) // it stopped early
}

func TestLoadErrors(t *testing.T) {
	q3, _ := tinyModels(t)
	for _, tc := range []struct {
		name string
		cfg  func(*sdk.ModelConfig)
		want string
	}{
		{"missing file", func(c *sdk.ModelConfig) { c.Path = "/nonexistent/model.gguf" }, "/nonexistent/model.gguf"},
		{"no library", func(c *sdk.ModelConfig) { c.Device = "cuda:0" }, "libdflash_cuda.so not found"},
		{"bad option", func(c *sdk.ModelConfig) { c.Options = map[string]string{"spec-tree-budget": "99"} }, "--spec-tree-budget:"},
		{"missing draft", func(c *sdk.ModelConfig) { c.Options = map[string]string{"draft": "/nonexistent/d.gguf"} }, "draft /nonexistent/d.gguf"},
		{"draft is not a draft", func(c *sdk.ModelConfig) { c.Options = map[string]string{"draft": c.Path} }, "draft "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			cfg := blockConfig(t, q3)
			tc.cfg(&cfg)
			c := sdktest.Backend(t, New())
			_, err := c.Load(context.Background(), cfg, nil)
			is.True(err != nil)
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestPrefixCacheOnCPU(t *testing.T) {
	q3, q35 := tinyModels(t)
	const sys = "You are a careful assistant. Keep every answer short and exact."
	for _, tc := range []struct {
		name, path string
		nextTurn   bool
		reused     bool
	}{
		// Attention only: any shared prefix is reused.
		{"qwen3 shared system prompt", q3, false, true},
		{"qwen3 next turn", q3, true, true},
		// Recurrent layers: only back to the snapshot taken where the
		// generation prompt starts.
		{"qwen35 shared system prompt", q35, false, false},
		{"qwen35 next turn", q35, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			cfg := blockConfig(t, tc.path)
			cfg.MaxConcurrency = 1
			cfg.Options = map[string]string{"threads": "1", "prefix-cache-slots": "2"}
			b, _, _ := load(t, cfg)
			msg := func(system, user string) *sdk.ChatRequest {
				r := chatReq(user, 10)
				r.Messages = []sdk.Message{{Role: "system", Content: system}, {Role: "user", Content: user}}
				return r
			}
			first := newStream()
			is.NoErr(b.Start(context.Background(), msg(sys, "Name a colour."), first))
			second := newStream()
			req := msg(sys, "What is two plus two?")
			if tc.nextTurn {
				req.Messages = append(msg(sys, "Name a colour.").Messages,
					sdk.Message{Role: "assistant", Content: first.summary().text},
					sdk.Message{Role: "user", Content: "And another?"})
			}
			is.NoErr(b.Start(context.Background(), req, second))
			r := second.summary()
			t.Logf("cached %d of %d prompt tokens", r.finish.Usage.CachedTokens, r.finish.Usage.PromptTokens)
			if tc.reused {
				is.True(r.finish.Usage.CachedTokens > 10) // the rendered system turn
			} else {
				is.Equal(r.finish.Usage.CachedTokens, 0)
			}

			// Same tokens as without the cache.
			cfg.Options = map[string]string{"threads": "1"}
			fresh, _, _ := load(t, cfg)
			alone := newStream()
			is.NoErr(fresh.Start(context.Background(), req, alone))
			is.Equal(r.tokens, alone.summary().tokens)
		})
	}
}

// TestLoadRefusesModelWithoutAttention: a qwen35 file whose layers are all
// recurrent (2 layers, full attention every 4th) has no KV to admit
// against; loading it must say so instead of failing deep in the engine.
func TestLoadRefusesModelWithoutAttention(t *testing.T) {
	is := is.New(t)
	tinyModels(t) // makes the test tokenizer in fixtureDir
	path := filepath.Join(t.TempDir(), "recurrent-only.gguf")
	out, err := exec.Command(modelTool(t), "mk", "qwen35", path, "--layers", "2", "--tokenizer", filepath.Join(fixtureDir, "tok"),
		"--type", "f32", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "16", "--ffn", "128").CombinedOutput()
	is.True(err == nil) // dflash-model mk
	if err != nil {
		t.Fatalf("dflash-model mk: %v\n%s", err, out)
	}
	c := sdktest.Backend(t, New())
	_, err = c.Load(context.Background(), blockConfig(t, path), nil)
	is.True(err != nil)
	is.True(strings.Contains(err.Error(), "no full-attention layer")) // names the problem
	is.True(strings.Contains(err.Error(), path))                      // and the file
}
