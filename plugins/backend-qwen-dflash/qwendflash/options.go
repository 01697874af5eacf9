package qwendflash

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/go-multierror"

	native "github.com/dflash/dflash_server/native/engine"
	"github.com/dflash/dflash_server/sdk"
)

var cacheTypes = []string{"f32", "f16", "bf16", "q8_0"}

// optionSpecs are the block flags this backend owns.
var optionSpecs = []sdk.OptionSpec{
	{Name: "cache-type-k", Kind: sdk.OptionEnum, Enum: cacheTypes, Default: "f16", Help: "KV cache element type of keys."},
	{Name: "cache-type-v", Kind: sdk.OptionEnum, Enum: cacheTypes, Default: "f16", Help: "KV cache element type of values."},
	{Name: "kv-block-size", Kind: sdk.OptionInt, Default: "16", Help: "Tokens per KV cache block."},
	{Name: "threads", Kind: sdk.OptionInt, Default: "0", Help: "CPU worker threads (0 = every core)."},
	{Name: "step-tokens", Kind: sdk.OptionInt, Default: "512", Help: "Most tokens one forward processes: decode tokens first, prefill chunks fill the rest."},
	{Name: "decode-headroom", Kind: sdk.OptionInt, Default: "64", Help: "KV tokens each sequence reserves ahead, and keeps free for every running sequence at admission."},
	{Name: "fa-window", Kind: sdk.OptionInt, Default: "0", Help: "Attention window in tokens (0 = full attention; only 0 is supported yet)."},
	{Name: "prefix-cache-slots", Kind: sdk.OptionInt, Default: "0", Help: "Finished sequences kept with their KV for later prompts that share their prefix (0 = off); their KV is evicted as soon as running requests need it."},
	{Name: "prefill-cache-slots", Kind: sdk.OptionInt, Default: "0", Help: "Prefill snapshot cache slots (not supported yet: 0)."},
	{Name: "draft", Kind: sdk.OptionString, Help: "DFlash draft model GGUF for speculative decoding (not supported yet)."},
	// Not a shared-process policy as such: only a remote draft (a device
	// other than the target's) is, and that is refused through
	// ModelConfig.MultiModel once --draft is implemented.
	{Name: "draft-device", Kind: sdk.OptionString, Help: "Device of the draft model (default: the target's device)."},
	{Name: "draft-block-size", Kind: sdk.OptionInt, Default: "0", Help: "Draft block size (0 = the draft's own)."},
	{Name: "target-split", Kind: sdk.OptionString, Help: "Split the target's layers across devices (not supported yet).", SharedProcessPolicy: true},
}

// options are the parsed plugin-owned flags of a block.
type options struct {
	cacheK, cacheV native.CacheType
	kvBlockSize    int
	threads        int
	stepTokens     int
	decodeHeadroom int
	prefixSlots    int
}

// parseOptions checks every plugin-owned flag and reports all bad ones at
// once, each by name.
func parseOptions(m map[string]string) (options, error) {
	o := options{kvBlockSize: 16, stepTokens: 512, decodeHeadroom: 64}
	var errs *multierror.Error
	bad := func(name, format string, args ...any) {
		errs = multierror.Append(errs, fmt.Errorf("--%s: %s", name, fmt.Sprintf(format, args...)))
	}
	known := map[string]bool{}
	for _, s := range optionSpecs {
		known[s.Name] = true
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if !known[k] {
			bad(k, "unknown option of the qwen-dflash backend")
		}
	}
	intOpt := func(name string, dst *int, lo, hi int) {
		v, ok := m[name]
		if !ok || v == "" {
			return
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			bad(name, "%q is not an integer", v)
			return
		}
		if n < lo || n > hi {
			bad(name, "%d is outside [%d, %d]", n, lo, hi)
			return
		}
		*dst = n
	}
	cacheOpt := func(name string, dst *native.CacheType) {
		v := m[name]
		if v == "" {
			v = "f16"
		}
		c, err := native.ParseCacheType(strings.ToLower(v))
		if err != nil {
			bad(name, "%q is not a KV cache type (want %s)", v, strings.Join(cacheTypes, ", "))
			return
		}
		*dst = c
	}
	cacheOpt("cache-type-k", &o.cacheK)
	cacheOpt("cache-type-v", &o.cacheV)
	intOpt("kv-block-size", &o.kvBlockSize, 1, 4096)
	intOpt("threads", &o.threads, 0, 4096)
	intOpt("step-tokens", &o.stepTokens, 1, 1<<20)
	intOpt("decode-headroom", &o.decodeHeadroom, 1, 1<<20)
	intOpt("prefix-cache-slots", &o.prefixSlots, 0, 1024)

	var unsupported int
	for _, name := range []string{"fa-window", "prefill-cache-slots"} {
		intOpt(name, &unsupported, 0, 1<<30)
		if unsupported != 0 {
			bad(name, "%d is not supported by this build yet (only 0)", unsupported)
			unsupported = 0
		}
	}
	draftBlock := 0
	intOpt("draft-block-size", &draftBlock, 0, 1024)
	if m["draft"] != "" {
		bad("draft", "DFlash speculative decoding is not implemented in this build yet; remove --draft to serve the model without a draft")
	} else {
		if m["draft-device"] != "" {
			bad("draft-device", "needs --draft")
		}
		if draftBlock != 0 {
			bad("draft-block-size", "needs --draft")
		}
	}
	if m["target-split"] != "" {
		bad("target-split", "splitting a target across devices is not supported by this build")
	}
	if err := errs.ErrorOrNil(); err != nil {
		errs.ErrorFormat = func(es []error) string {
			s := make([]string, len(es))
			for i, e := range es {
				s[i] = e.Error()
			}
			return strings.Join(s, "; ")
		}
		return o, sdk.Invalidf("%s", errs.Error())
	}
	return o, nil
}
