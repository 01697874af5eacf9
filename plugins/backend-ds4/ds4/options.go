package ds4

import (
	"fmt"
	"math"
	"reflect"
	"slices"

	native "github.com/dflash/dflash_server/native/engine"
	"github.com/dflash/dflash_server/plugins/nativebackend"
	"github.com/dflash/dflash_server/sdk"
)

// Metadata keys the --ds4-* options override.
const (
	keyExpertsUsed = Arch + ".expert_used_count"
	keyPrefill     = Arch + ".engine.prefill"
	keyFusedDecode = Arch + ".engine.fused_decode"
)

// Prefill modes of --ds4-prefill.
var prefillModes = []string{"exact", "dense", "sparse"}

// optionSpecs are the block flags this backend owns: the engine's, the
// caches', then the DeepSeek V4 ones.
var optionSpecs = slices.Concat(nativebackend.EngineOptionSpecs(), []sdk.OptionSpec{
	nativebackend.PrefixCacheSpec(),
}, nativebackend.DiskCacheSpecs(), []sdk.OptionSpec{
	nativebackend.PrefillCacheSpec(),
	{Name: "ds4-fused-decode", Kind: sdk.OptionBool, Default: "false", Help: "Decode steps as captured CUDA graphs (one graph replay per step, same output); cuda devices only."},
	{Name: "ds4-expert-top-k", Kind: sdk.OptionInt, Default: "0", Help: "Routed experts per token (0 = the model's own count); fewer is faster and an approximation, more is refused."},
	{Name: "ds4-prefill", Kind: sdk.OptionEnum, Enum: prefillModes, Default: "sparse", Help: "Prefill mode: sparse (batched, with the indexer's top-k attention as in decoding: the model's own math, another reduction order), exact (the decode path, token by token: bit for bit what decoding gives, several times slower) or dense (batched, CSA layers attending to every compressed row: not the model's pruning)."},
})

// options are the parsed plugin-owned flags of a block.
type options struct {
	engine      nativebackend.EngineOptions
	expertTopK  int // 0 = the model's count
	prefill     string
	fusedDecode bool
}

// parseOptions checks every plugin-owned flag of a block on device and
// reports all bad ones at once, each by name.
func parseOptions(m map[string]string, device string) (options, error) {
	r := nativebackend.NewOptions(m)
	r.Known(Name, optionSpecs)
	// sparse by default: the batched prefill of the model's own attention, as llama.cpp and vLLM run prompts (exact
	// ran a prompt token by token: a V4-Flash-shaped 64-token prompt at 8.8 tok/s on 2 CPU threads against sparse's
	// 39.9 and llama.cpp's 34.8)
	o := options{engine: r.Engine(), prefill: "sparse"}
	r.ZeroOnly("prefill-cache-slots")
	r.Int("ds4-expert-top-k", &o.expertTopK, 0, 1<<16)
	if v := r.Get("ds4-prefill"); v != "" {
		if !slices.Contains(prefillModes, v) {
			r.Bad("ds4-prefill", "%q is not one of %v", v, prefillModes)
		} else {
			o.prefill = v
		}
	}
	switch v := r.Get("ds4-fused-decode"); v {
	case "", "false":
	case "true":
		o.fusedDecode = true
		if device == "" {
			device = "cpu"
		}
		if kind, _, err := native.ParseDevice(device); err != nil || kind != "cuda" {
			r.Bad("ds4-fused-decode", "captured decode graphs need a cuda device; this block's device is %s (drop the flag)", device)
		}
	default:
		r.Bad("ds4-fused-decode", "%q is not true or false", v)
	}
	return o, r.Err()
}

// configure applies the options to the model's metadata before the weights
// load. warning is what the operator is told about an approximation.
func (o options) configure(ms *native.ModelSpec) (warning string, err error) {
	if o.expertTopK > 0 {
		trained, ok := metaInt(ms.Meta[keyExpertsUsed])
		if !ok {
			return "", fmt.Errorf("--ds4-expert-top-k: the model has no integer %s", keyExpertsUsed)
		}
		switch {
		case int64(o.expertTopK) > trained:
			return "", fmt.Errorf("--ds4-expert-top-k %d: the model routes %d experts per token; more than it was trained with is not offered", o.expertTopK, trained)
		case int64(o.expertTopK) < trained:
			warning = fmt.Sprintf("--ds4-expert-top-k %d: routing %d of the model's %d experts per token (renormalised) approximates the model; output differs from the full model's", o.expertTopK, o.expertTopK, trained)
		}
		ms.Meta[keyExpertsUsed] = int64(o.expertTopK)
	}
	ms.Meta[keyPrefill] = o.prefill
	if o.fusedDecode {
		ms.Meta[keyFusedDecode] = true
	}
	return warning, nil
}

// metaInt is an integer metadata value (of any width) as int64.
func metaInt(v any) (int64, bool) {
	r := reflect.ValueOf(v)
	switch {
	case r.CanInt():
		return r.Int(), true
	case r.CanUint() && r.Uint() <= math.MaxInt64:
		return int64(r.Uint()), true
	}
	return 0, false
}
