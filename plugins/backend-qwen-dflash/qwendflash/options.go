package qwendflash

import (
	"slices"

	native "github.com/dflash/dflash_server/native/engine"
	"github.com/dflash/dflash_server/plugins/nativebackend"
	"github.com/dflash/dflash_server/sdk"
)

// optionSpecs are the block flags this backend owns: the engine's, then
// the Qwen and DFlash ones.
var optionSpecs = slices.Concat(nativebackend.EngineOptionSpecs(), []sdk.OptionSpec{
	sdk.OptionSpec{Name: "fa-window", Kind: sdk.OptionInt, Default: "0", Help: "Attention window in tokens (0 = full attention; only 0 is supported yet)."},
	nativebackend.PrefixCacheSpec(),
}, nativebackend.DiskCacheSpecs(), []sdk.OptionSpec{
	nativebackend.PrefillCacheSpec(),
	sdk.OptionSpec{Name: "draft", Kind: sdk.OptionString, Help: "DFlash draft model GGUF (upstream llama.cpp `dflash` files, and the Lucebox and pre-merge spellings) for lossless speculative decoding."},
	// Not a shared-process policy as such: only a remote draft (a device
	// other than the target's) is, and that is refused through
	// ModelConfig.MultiModel at load.
	sdk.OptionSpec{Name: "draft-device", Kind: sdk.OptionString, Help: "Device of the draft model (default: the target's device)."},
	sdk.OptionSpec{Name: "draft-block-size", Kind: sdk.OptionInt, Default: "0", Help: "Most block tokens (the root and the proposals) verified per step (0 = the draft's block size; never above it)."},
	sdk.OptionSpec{Name: "spec-tree-budget", Kind: sdk.OptionInt, Default: "0", Help: "DDTree verify budget in tree nodes (0 = verify the draft's chain)."},
	sdk.OptionSpec{Name: "spec-sampling", Kind: sdk.OptionEnum, Enum: []string{"draft", "match"}, Default: "draft", Help: "Sampled requests (temperature > 0): draft: proposals drawn from the draft's distribution, each kept with probability min(1, p/q) of the target's and the draft's; match: the draft's best candidates, kept while the target samples them. Both follow the target's distribution exactly; greedy requests and trees always match."},
	sdk.OptionSpec{Name: "draft-pacing", Kind: sdk.OptionEnum, Enum: []string{"on", "off"}, Default: "on", Help: "on: measure whether drafting pays (tokens per second with and without) and decode plainly in bursts while it does not; off: draft on every step."},
	sdk.OptionSpec{Name: "target-split", Kind: sdk.OptionString, Help: "Split the target's layers across devices (not supported yet).", SharedProcessPolicy: true},
})

// options are the parsed plugin-owned flags of a block.
type options struct {
	engine nativebackend.EngineOptions
}

// parseOptions checks every plugin-owned flag and reports all bad ones at
// once, each by name.
func parseOptions(m map[string]string) (options, error) {
	r := nativebackend.NewOptions(m)
	r.Known(Name, optionSpecs)
	o := options{engine: r.Engine()}

	r.ZeroOnly("fa-window")
	r.ZeroOnly("prefill-cache-slots")
	draftBlock, treeBudget := 0, 0
	r.Int("draft-block-size", &draftBlock, 0, 1024)
	r.Int("spec-tree-budget", &treeBudget, 0, 63)
	if draftBlock == 1 {
		r.Bad("draft-block-size", "1 leaves no proposal to verify; use 0 for the draft's block size or at least 2")
	}
	if path := r.Get("draft"); path != "" {
		o.engine.Draft = nativebackend.DraftOptions{Path: path, Device: r.Get("draft-device"), Block: draftBlock, TreeBudget: treeBudget}
		o.engine.Draft.Always = !r.OnOff("draft-pacing", true)
		o.engine.Draft.SampledDrafts = r.Enum("spec-sampling", []string{"draft", "match"}, "draft") == "draft"
		if dev := r.Get("draft-device"); dev != "" {
			if _, _, err := native.ParseDevice(dev); err != nil {
				r.Bad("draft-device", "%v", err)
			}
		}
	} else {
		if r.Get("draft-device") != "" {
			r.Bad("draft-device", "needs --draft")
		}
		if draftBlock != 0 {
			r.Bad("draft-block-size", "needs --draft")
		}
		if treeBudget != 0 {
			r.Bad("spec-tree-budget", "needs --draft")
		}
		if r.Get("spec-sampling") != "" {
			r.Bad("spec-sampling", "needs --draft")
		}
	}
	if r.Get("target-split") != "" {
		r.Bad("target-split", "splitting a target across devices is not supported by this build")
	}
	return o, r.Err()
}
