package qwendflash

import (
	"fmt"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
)

// TestSpeculativeDFlash2MatchesPlainOnCPU: a DFlash2 draft (block 8, non-causal sliding layers, dynamic convolutions
// and the candidate selector's greedy walk) proposes blocks that the target verifies: greedy output is token for
// token the target's own, and the draft really ran; sampled requests draw their proposals along the selector.
func TestSpeculativeDFlash2MatchesPlainOnCPU(t *testing.T) {
	q3, q35 := tinyModels(t)
	prompts := []string{"The cat sat on", "a much longer prompt that needs several prefill chunks of eight tokens each", "x", "hello there, model"}
	greedy := sdk.Sampling{Temperature: f64(0), Seed: i64(1)}
	for _, tc := range []struct {
		name, path, arch string
		draftArgs        []string
		options          map[string]string
	}{
		{name: "qwen3", path: q3, arch: "qwen3", draftArgs: []string{"--sliding-window", "8"}},
		{name: "qwen35, verify 5", path: q35, arch: "qwen35", options: map[string]string{"draft-block-size": "5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			is := is.New(t)
			cfg := blockConfig(t, tc.path)
			cfg.Architecture = tc.arch
			plain, _ := generate(t, cfg, prompts, greedy, 24)
			args := append([]string{"--dflash2", "--selector-top-k", "4"}, tc.draftArgs...)
			cfg.Options = map[string]string{"threads": "1", "draft": tinyDraft(t, tc.path, args...), "draft-pacing": "off"}
			for k, v := range tc.options {
				cfg.Options[k] = v
			}
			spec, fins := generate(t, cfg, prompts, greedy, 24)
			for i := range prompts {
				is.Equal(fmt.Sprint(spec[i]), fmt.Sprint(plain[i]))       // speculative greedy == target greedy
				is.True(fins[i] != nil && fins[i].Timings.DraftSteps > 0) // blocks were drafted and verified
			}
			// sampled requests with proposals drawn along the selector's lattice (--spec-sampling draft)
			cfg.Options["spec-sampling"] = "draft"
			sampled, fins := generate(t, cfg, prompts, sdk.Sampling{Temperature: f64(1), Seed: i64(3)}, 24)
			for i := range prompts {
				is.Equal(len(sampled[i]), 24)
				is.True(fins[i] != nil && fins[i].Timings.DraftSteps > 0)
			}
		})
	}
}
