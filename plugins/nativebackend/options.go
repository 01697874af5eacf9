package nativebackend

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

// CacheTypes are the KV cache element types the engine stores.
var CacheTypes = []string{"f32", "f16", "bf16", "q8_0"}

// EngineOptionSpecs are the block options of the engine itself, which every
// native backend declares (first, in this order).
func EngineOptionSpecs() []sdk.OptionSpec {
	return []sdk.OptionSpec{
		{Name: "cache-type-k", Kind: sdk.OptionEnum, Enum: CacheTypes, Default: DefaultCacheType, Help: "KV cache element type of keys."},
		{Name: "cache-type-v", Kind: sdk.OptionEnum, Enum: CacheTypes, Default: DefaultCacheType, Help: "KV cache element type of values."},
		{Name: "kv-block-size", Kind: sdk.OptionInt, Default: itoa(DefaultKVBlockSize), Help: "Tokens per KV cache block."},
		{Name: "threads", Kind: sdk.OptionInt, Default: itoa(DefaultThreads), Help: "CPU worker threads (0 = every core)."},
		{Name: "step-tokens", Kind: sdk.OptionInt, Default: itoa(DefaultStepTokens), Help: "Most tokens one forward processes: decode tokens first, prefill chunks fill the rest."},
		{Name: "decode-headroom", Kind: sdk.OptionInt, Default: itoa(DefaultDecodeHeadroom), Help: "KV tokens each sequence reserves ahead, and keeps free for every running sequence at admission."},
		{Name: "warmup", Kind: sdk.OptionEnum, Enum: WarmupModes, Default: "auto", Help: "Run a few short requests at load, so that the first client request does not pay the device's first-use costs (kernel loading, step graphs); auto: on a GPU."},
	}
}

// PrefixCacheSpec is the prefix-cache option; a backend lists it where its
// help reads best.
func PrefixCacheSpec() sdk.OptionSpec {
	return sdk.OptionSpec{Name: "prefix-cache-slots", Kind: sdk.OptionInt, Default: itoa(DefaultPrefixSlots), Help: "Finished sequences kept with their KV for later prompts that share their prefix (0 = off); their KV is evicted as soon as running requests need it."}
}

// DiskCacheSpecs are the disk prefix cache options; a backend lists them where its help reads best.
func DiskCacheSpecs() []sdk.OptionSpec {
	return []sdk.OptionSpec{
		{Name: "disk-prefix-cache", Kind: sdk.OptionEnum, Enum: []string{"off", "on"}, Default: "off", Help: "Keep the KV and recurrent state of prompts (up to the generation prompt) in files, so later prompts sharing a prefix, also after a restart, skip its prefill."},
		{Name: "disk-prefix-cache-dir", Kind: sdk.OptionString, Help: "Directory of the disk prefix cache (default: the user cache directory's dflash_server/prefix)."},
		{Name: "disk-prefix-cache-max-gb", Kind: sdk.OptionFloat, Default: "8", Help: "Size bound of the model's disk prefix cache entries, in GiB; the least recently used go first."},
	}
}

// PrefillCacheSpec is the prefill snapshot cache option, which this build
// does not implement yet (only 0; see Options.ZeroOnly).
func PrefillCacheSpec() sdk.OptionSpec {
	return sdk.OptionSpec{Name: "prefill-cache-slots", Kind: sdk.OptionInt, Default: "0", Help: "Prefill snapshot cache slots (not supported yet: 0)."}
}

// EngineOptions are the parsed engine options of a block.
type EngineOptions struct {
	CacheK, CacheV native.CacheType
	KVBlockSize    int
	Threads        int
	StepTokens     int
	DecodeHeadroom int
	PrefixSlots    int
	// Draft is the block's speculative-decoding draft (Path "" = none); the backend that offers drafts fills it.
	Draft DraftOptions
	// Disk is the disk prefix cache (DiskCacheSpecs).
	Disk DiskCacheOptions
	// Warmup is the warmup option's mode (WarmupModes).
	Warmup string
}

// Options reads a block's plugin-owned options and gathers every problem,
// each naming its flag, so the operator sees them all at once.
type Options struct {
	m    map[string]string
	errs *multierror.Error
}

// NewOptions starts reading m.
func NewOptions(m map[string]string) *Options { return &Options{m: m} }

// Get is the raw value of an option ("" when not given).
func (o *Options) Get(name string) string { return o.m[name] }

// Bad records a problem with option name.
func (o *Options) Bad(name, format string, args ...any) {
	o.errs = multierror.Append(o.errs, fmt.Errorf("--%s: %s", name, fmt.Sprintf(format, args...)))
}

// Known refuses options that specs do not declare.
func (o *Options) Known(backend string, specs []sdk.OptionSpec) {
	known := map[string]bool{}
	for _, s := range specs {
		known[s.Name] = true
	}
	for _, k := range slices.Sorted(maps.Keys(o.m)) {
		if !known[k] {
			o.Bad(k, "unknown option of the %s backend", backend)
		}
	}
}

// Int stores option name in dst when it is given, an integer and within
// [lo, hi].
func (o *Options) Int(name string, dst *int, lo, hi int) {
	v, ok := o.m[name]
	if !ok || v == "" {
		return
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		o.Bad(name, "%q is not an integer", v)
		return
	}
	if n < lo || n > hi {
		o.Bad(name, "%d is outside [%d, %d]", n, lo, hi)
		return
	}
	*dst = n
}

// ZeroOnly refuses any value but 0 of an integer option that this build
// declares (command lines written for other builds give it) but does not
// implement yet.
func (o *Options) ZeroOnly(name string) {
	n := 0
	o.Int(name, &n, 0, 1<<30)
	if n != 0 {
		o.Bad(name, "%d is not supported by this build yet (only 0)", n)
	}
}

// CacheType stores option name (default DefaultCacheType) in dst.
func (o *Options) CacheType(name string, dst *native.CacheType) {
	v := o.m[name]
	if v == "" {
		v = DefaultCacheType
	}
	c, err := native.ParseCacheType(strings.ToLower(v))
	if err != nil {
		o.Bad(name, "%q is not a KV cache type (want %s)", v, strings.Join(CacheTypes, ", "))
		return
	}
	*dst = c
}

// Engine reads the engine options (EngineOptionSpecs and PrefixCacheSpec).
func (o *Options) Engine() EngineOptions {
	e := EngineOptions{KVBlockSize: DefaultKVBlockSize, Threads: DefaultThreads, StepTokens: DefaultStepTokens,
		DecodeHeadroom: DefaultDecodeHeadroom, PrefixSlots: DefaultPrefixSlots}
	o.CacheType("cache-type-k", &e.CacheK)
	o.CacheType("cache-type-v", &e.CacheV)
	o.Int("kv-block-size", &e.KVBlockSize, 1, 4096)
	o.Int("threads", &e.Threads, 0, 4096)
	o.Int("step-tokens", &e.StepTokens, 1, 1<<20)
	o.Int("decode-headroom", &e.DecodeHeadroom, 1, 1<<20)
	o.Int("prefix-cache-slots", &e.PrefixSlots, 0, 1024)
	e.Warmup = o.Enum("warmup", WarmupModes, "auto")
	e.Disk = o.diskCache()
	return e
}

// OnOff is option name's on/off value (def when not given), recording anything else as a problem.
func (o *Options) OnOff(name string, def bool) bool {
	switch v := o.m[name]; v {
	case "":
		return def
	case "on":
		return true
	case "off":
		return false
	default:
		o.Bad(name, "%q is not on or off", v)
		return def
	}
}

// Enum is option name's value when it is one of values, def when it is not given.
func (o *Options) Enum(name string, values []string, def string) string {
	v, ok := o.m[name]
	switch {
	case !ok || v == "":
		return def
	case slices.Contains(values, v):
		return v
	}
	o.Bad(name, "%q is not one of %s", v, strings.Join(values, ", "))
	return def
}

// diskCache reads DiskCacheSpecs (absent options leave the cache off).
func (o *Options) diskCache() DiskCacheOptions {
	d := DiskCacheOptions{MaxGB: 8, On: o.OnOff("disk-prefix-cache", false)}
	d.Dir = o.m["disk-prefix-cache-dir"]
	if v := o.m["disk-prefix-cache-max-gb"]; v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 {
			o.Bad("disk-prefix-cache-max-gb", "%q is not a positive number", v)
		} else {
			d.MaxGB = f
		}
	}
	if !d.On && (d.Dir != "" || o.m["disk-prefix-cache-max-gb"] != "") {
		for _, name := range []string{"disk-prefix-cache-dir", "disk-prefix-cache-max-gb"} {
			if o.m[name] != "" {
				o.Bad(name, "needs --disk-prefix-cache on")
			}
		}
	}
	return d
}

// Err is every recorded problem as one *sdk.InvalidError, or nil.
func (o *Options) Err() error {
	if o.errs.ErrorOrNil() == nil {
		return nil
	}
	s := make([]string, len(o.errs.Errors))
	for i, e := range o.errs.Errors {
		s[i] = e.Error()
	}
	return sdk.Invalidf("%s", strings.Join(s, "; "))
}
