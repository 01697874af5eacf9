package ds4

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/sdktest"
)

// TestFusedDecodeRefusedOnCPU: a block on a cpu device that asks for
// captured decode graphs is refused before anything loads, naming the
// flag and the device.
func TestFusedDecodeRefusedOnCPU(t *testing.T) {
	is := is.New(t)
	cfg := blockConfig(t, tinyModel(t), map[string]string{"ds4-fused-decode": "true"})
	cfg.Device = "cpu:1"
	b := New()
	_, err := b.Load(context.Background(), cfg, nil)
	is.True(err != nil) // refused
	is.True(strings.Contains(err.Error(), "--ds4-fused-decode: captured decode graphs need a cuda device; this block's device is cpu:1"))
	is.True(b.Current() == nil) // nothing loaded
}

// TestGenerate: the tiny model loads on the CPU engine, is described as
// deepseek4, and generates greedily the same tokens every time.
func TestGenerate(t *testing.T) {
	is := is.New(t)
	_, c, desc := load(t, blockConfig(t, tinyModel(t), nil))
	is.Equal(desc.Architecture, "deepseek4")
	is.Equal(desc.Device, "cpu:0")
	is.Equal(desc.MaxConcurrency, 4)
	is.True(desc.Features.Tools && desc.Features.Reasoning && !desc.Features.Speculative)
	first := run(t, c, chatReq("Hello there", 12))
	is.Equal(first.Admission.Outcome, sdk.OutcomeAdmitted)
	is.Equal(len(first.Tokens), 12) // the whole budget (EOS ignored)
	is.True(first.Finish != nil)
	is.Equal(first.Finish.Usage.CompletionTokens, 12)
	again := run(t, c, chatReq("Hello there", 12))
	is.Equal(fmt.Sprint(again.Tokens), fmt.Sprint(first.Tokens)) // greedy is deterministic
	t.Logf("generated %v: text %q, reasoning %q", first.Tokens, first.Text, first.Reasoning)
}

// TestWarmupLeavesNoTrace: a load with the warm-up request (--warmup on; auto runs it on a GPU only) generates the
// same greedy tokens as one without, and counts only the client's tokens: the warm-up left nothing of its sequence
// (KV, compressed caches, hyper-connection state) behind.
func TestWarmupLeavesNoTrace(t *testing.T) {
	is := is.New(t)
	gen := func(warmup string) (tokens []int32, generated int64) {
		_, c, _ := load(t, blockConfig(t, tinyModel(t), map[string]string{"warmup": warmup}))
		r := run(t, c, chatReq("Hello there", 12))
		st, err := c.Stats(context.Background())
		is.NoErr(err)
		return r.Tokens, st.TokensGenerated
	}
	cold, coldN := gen("off")
	warm, warmN := gen("on")
	is.Equal(len(warm), 12)
	is.Equal(fmt.Sprint(warm), fmt.Sprint(cold)) // the warm-up left no state behind
	is.Equal(warmN, coldN)                       // nor counted its own tokens
}

// TestBatchedEqualsAlone: requests decoded together in one batch give
// each the tokens it gives alone, greedy and sampled with the model's
// preset (temperature 1, no top-k: drawn from the step's candidates where
// they decide it, else from the whole row the model keeps), with the
// default prefill (sparse: batched) and the token-by-token one (whose steps
// each overwrite the logits the one before left).
func TestBatchedEqualsAlone(t *testing.T) {
	for _, opts := range []map[string]string{nil, {"ds4-prefill": "exact"}} {
		t.Run(fmt.Sprint("prefill ", opts["ds4-prefill"]), func(t *testing.T) { batchedEqualsAlone(t, opts) })
	}
}

func batchedEqualsAlone(t *testing.T, opts map[string]string) {
	_, c, _ := load(t, blockConfig(t, tinyModel(t), opts))
	prompts := []string{"The weather today", "Write a haiku about the sea, please, in English", "1 2 3", "Who are you and what can you do for me?"}
	sampled := func(text string, n int, seed int64) *sdk.ChatRequest {
		r := chatReq(text, n)
		r.Sampling = sdk.Sampling{Seed: i64(seed)}
		return r
	}
	for _, mode := range []string{"greedy", "sampled"} {
		req := func(i int) *sdk.ChatRequest {
			if mode == "sampled" {
				return sampled(prompts[i], 10, int64(i+1))
			}
			return chatReq(prompts[i], 10)
		}
		alone := make([][]int32, len(prompts))
		for i := range prompts {
			alone[i] = run(t, c, req(i)).Tokens
		}
		together := make([][]int32, len(prompts))
		var wg sync.WaitGroup
		for i := range prompts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				together[i] = run(t, c, req(i)).Tokens
			}()
		}
		wg.Wait()
		for i := range prompts {
			t.Run(fmt.Sprint(mode, i), func(t *testing.T) {
				is := is.New(t)
				is.Equal(len(alone[i]), 10)
				is.Equal(fmt.Sprint(together[i]), fmt.Sprint(alone[i])) // batched equals alone
			})
		}
	}
}

// TestExpertTopK: routing fewer experts than the model was trained with
// loads (an approximation, which the load logs as a warning; see
// TestConfigure) and changes the output; the model's own count changes
// nothing; more is refused at load, naming the flag.
func TestExpertTopK(t *testing.T) {
	path := tinyModel(t)
	var log bytes.Buffer
	generate := func(t *testing.T, opts map[string]string) []int32 {
		t.Helper()
		log.Reset()
		b := New()
		b.log = hclog.New(&hclog.LoggerOptions{Output: &log})
		b, c, _ := loadInto(t, b, blockConfig(t, path, opts))
		defer b.Shutdown(context.Background())
		var out []int32
		for _, p := range []string{"Tell me a story", "A B C D E F"} {
			out = append(out, run(t, c, chatReq(p, 16)).Tokens...)
		}
		return out
	}
	full := generate(t, nil)
	t.Run("the trained count", func(t *testing.T) {
		is := is.New(t)
		is.Equal(fmt.Sprint(generate(t, map[string]string{"ds4-expert-top-k": "2"})), fmt.Sprint(full)) // same as the default
		is.Equal(log.String(), "")                                                                      // nothing to warn about
	})
	t.Run("fewer", func(t *testing.T) {
		is := is.New(t)
		is.True(fmt.Sprint(generate(t, map[string]string{"ds4-expert-top-k": "1"})) != fmt.Sprint(full)) // one expert of two changes the output
		is.Equal(strings.Count(log.String(), "[WARN]"), 1)                                               // one warning at load
		is.True(strings.Contains(log.String(), "--ds4-expert-top-k 1: routing 1 of the model's 2 experts per token"))
	})
	t.Run("more", func(t *testing.T) {
		is := is.New(t)
		_, err := New().Load(context.Background(), blockConfig(t, path, map[string]string{"ds4-expert-top-k": "3"}), nil)
		is.True(err != nil)
		is.True(strings.Contains(err.Error(), "--ds4-expert-top-k 3: the model routes 2 experts per token"))
	})
}

// TestDiskPrefixCache: with --disk-prefix-cache on, the state of a prompt
// up to its generation prompt goes to disk; a fresh backend (a restart)
// answers a later turn of the conversation from it, with the output of a
// backend without the cache.
func TestDiskPrefixCache(t *testing.T) {
	is := is.New(t)
	path := tinyModel(t)
	system := "You are a careful assistant. Answer in one short sentence, and never mention the weather or any of the other topics people like to talk about."
	turn := func(opts map[string]string, msgs ...string) sdktest.Result {
		t.Helper()
		b, c, _ := load(t, blockConfig(t, path, opts))
		defer b.Shutdown(context.Background())
		req := chatReq("", 12)
		req.Messages = []sdk.Message{{Role: "system", Content: system}}
		for i, m := range msgs {
			role := "user"
			if i%2 == 1 {
				role = "assistant"
			}
			req.Messages = append(req.Messages, sdk.Message{Role: role, Content: m})
		}
		return run(t, c, req)
	}
	conversation := []string{"What is Go?", "A language.", "Who made it?"}
	plain := turn(map[string]string{"disk-prefix-cache": "off"}, conversation...)
	dir := t.TempDir()
	on := map[string]string{"disk-prefix-cache": "on", "disk-prefix-cache-dir": dir}
	first := turn(on, conversation...)
	is.Equal(first.Finish.Usage.CachedTokens, 0)                 // nothing stored yet
	is.Equal(fmt.Sprint(first.Tokens), fmt.Sprint(plain.Tokens)) // storing changes nothing
	files, _ := filepath.Glob(filepath.Join(dir, "*", "*.state"))
	is.Equal(len(files), 1) // the prompt up to its generation prompt went to disk at shutdown
	again := turn(on, conversation...)
	is.True(again.Finish.Usage.CachedTokens > 20)                // a fresh backend started from the stored state
	is.Equal(fmt.Sprint(again.Tokens), fmt.Sprint(plain.Tokens)) // on and off answer the same
	// A damaged entry is ignored (a warning on the plugin's log), with the same answer.
	is.NoErr(os.WriteFile(files[0], []byte("garbage"), 0o644))
	damaged := turn(on, conversation...)
	is.Equal(damaged.Finish.Usage.CachedTokens, 0)
	is.Equal(fmt.Sprint(damaged.Tokens), fmt.Sprint(plain.Tokens))
	// States of the full model are not another expert count's.
	fewer := turn(map[string]string{"disk-prefix-cache": "on", "disk-prefix-cache-dir": dir, "ds4-expert-top-k": "1"}, conversation...)
	is.Equal(fewer.Finish.Usage.CachedTokens, 0)
}
