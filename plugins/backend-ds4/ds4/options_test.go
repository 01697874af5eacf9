package ds4

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/matryer/is"

	native "github.com/dflash/dflash_server/native/engine"
	"github.com/dflash/dflash_server/sdk"
)

func TestInfo(t *testing.T) {
	is := is.New(t)
	info, err := New().Info(context.Background())
	is.NoErr(err)
	is.Equal(info.Name, "ds4")
	is.Equal(info.Architectures, []string{"deepseek4"})
	is.Equal(info.Devices, []string{"cpu", "cuda"})
	names := map[string]bool{}
	for _, o := range info.Options {
		names[o.Name] = true
	}
	for _, n := range []string{"cache-type-k", "cache-type-v", "threads", "prefix-cache-slots", "prefill-cache-slots",
		"disk-prefix-cache", "disk-prefix-cache-dir", "disk-prefix-cache-max-gb", "ds4-fused-decode", "ds4-expert-top-k", "ds4-prefill"} {
		is.True(names[n]) // declared option
	}
	for _, n := range []string{"draft", "draft-device", "spec-tree-budget", "fa-window"} {
		is.True(!names[n]) // qwen-dflash's, not ds4's
	}
}

// seedOptions are the ds4 block's plugin-owned options in the seed's
// example command line.
func seedOptions() map[string]string {
	return map[string]string{"prefix-cache-slots": "0", "prefill-cache-slots": "0", "disk-prefix-cache": "off",
		"ds4-fused-decode": "true", "ds4-expert-top-k": "6", "ds4-prefill": "exact"}
}

func TestValidateOptions(t *testing.T) {
	without := func(m map[string]string, k string) map[string]string { delete(m, k); return m }
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	tests := []struct {
		name   string
		device string
		opts   map[string]string
		want   []string // every problem, each naming its flag; nil: valid
	}{
		{"seed block on cuda", "cuda:1", seedOptions(), nil},
		{"seed block on cpu without the cuda-only flag", "cpu:1", without(seedOptions(), "ds4-fused-decode"), nil},
		{"nothing", "cpu", nil, nil},
		{"disk cache on with a directory", "cpu", with("disk-prefix-cache", "on", "disk-prefix-cache-dir", "/tmp/x", "disk-prefix-cache-max-gb", "2"), nil},
		{"every prefill mode", "cpu", with("ds4-prefill", "sparse"), nil},
		{"fused decode explicitly off on cpu", "cpu:0", with("ds4-fused-decode", "false"), nil},
		{"fused decode on cpu", "cpu:1", seedOptions(), []string{"--ds4-fused-decode: captured decode graphs need a cuda device; this block's device is cpu:1"}},
		{"fused decode on the default device", "", with("ds4-fused-decode", "true"), []string{"--ds4-fused-decode: ", "device is cpu"}},
		{"fused decode on hip", "hip:0", with("ds4-fused-decode", "true"), []string{"--ds4-fused-decode: ", "device is hip:0"}},
		{"expert top-k negative", "cpu", with("ds4-expert-top-k", "-1"), []string{"--ds4-expert-top-k: -1 is outside"}},
		{"expert top-k not a number", "cpu", with("ds4-expert-top-k", "six"), []string{`--ds4-expert-top-k: "six" is not an integer`}},
		{"unknown prefill mode", "cpu", with("ds4-prefill", "fast"), []string{`--ds4-prefill: "fast" is not one of [exact dense sparse]`}},
		{"prefill cache slots", "cpu", with("prefill-cache-slots", "2"), []string{"--prefill-cache-slots: 2 is not supported by this build yet"}},
		{"disk cache off with a directory", "cpu", with("disk-prefix-cache-dir", "/tmp/x"), []string{"--disk-prefix-cache-dir: needs --disk-prefix-cache on"}},
		{"disk cache neither on nor off", "cpu", with("disk-prefix-cache", "maybe"), []string{`--disk-prefix-cache: "maybe" is not on or off`}},
		{"draft is qwen-dflash's", "cpu", with("draft", "d.gguf"), []string{"--draft: unknown option of the ds4 backend"}},
		{"every problem at once", "cpu:0", with("ds4-fused-decode", "true", "ds4-prefill", "fast", "draft-device", "cpu"),
			[]string{"--ds4-fused-decode: ", `--ds4-prefill: "fast"`, "--draft-device: unknown option of the ds4 backend"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			err := New().ValidateOptions(context.Background(), sdk.ModelConfig{Device: tt.device, Options: tt.opts})
			if tt.want == nil {
				is.NoErr(err) // valid options
				return
			}
			var inv *sdk.InvalidError
			is.True(errors.As(err, &inv)) // the operator's mistake, shown as it is
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestConfigure: the --ds4-* options reach the native model as metadata
// overrides, checked against the model's own expert count.
func TestConfigure(t *testing.T) {
	tests := []struct {
		name     string
		opts     map[string]string
		device   string
		trained  any // deepseek4.expert_used_count in the file; nil: absent
		want     map[string]any
		warning  string // part of the warning, "" for none
		errorHas string
	}{
		{"defaults", nil, "cpu", uint32(6), map[string]any{keyExpertsUsed: uint32(6), keyPrefill: "sparse"}, "", ""},
		{"the trained count", map[string]string{"ds4-expert-top-k": "6"}, "cpu", uint32(6), map[string]any{keyExpertsUsed: int64(6), keyPrefill: "sparse"}, "", ""},
		{"fewer experts", map[string]string{"ds4-expert-top-k": "4"}, "cpu", uint32(6), map[string]any{keyExpertsUsed: int64(4), keyPrefill: "sparse"},
			"--ds4-expert-top-k 4: routing 4 of the model's 6 experts per token", ""},
		{"more experts", map[string]string{"ds4-expert-top-k": "8"}, "cpu", uint32(6), nil, "",
			"--ds4-expert-top-k 8: the model routes 6 experts per token"},
		{"no expert count in the file", map[string]string{"ds4-expert-top-k": "2"}, "cpu", nil, nil, "",
			"--ds4-expert-top-k: the model has no integer deepseek4.expert_used_count"},
		{"dense prefill", map[string]string{"ds4-prefill": "dense"}, "cpu", uint32(6), map[string]any{keyExpertsUsed: uint32(6), keyPrefill: "dense"}, "", ""},
		{"exact prefill", map[string]string{"ds4-prefill": "exact"}, "cpu", uint32(6), map[string]any{keyExpertsUsed: uint32(6), keyPrefill: "exact"}, "", ""},
		{"fused decode on cuda", map[string]string{"ds4-fused-decode": "true"}, "cuda:0", uint32(6),
			map[string]any{keyExpertsUsed: uint32(6), keyPrefill: "sparse", keyFusedDecode: true}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			o, err := parseOptions(tt.opts, tt.device)
			is.NoErr(err)
			ms := native.ModelSpec{Arch: Arch, Meta: map[string]any{}}
			if tt.trained != nil {
				ms.Meta[keyExpertsUsed] = tt.trained
			}
			warning, err := o.configure(&ms)
			if tt.errorHas != "" {
				is.True(err != nil) // refused
				is.True(strings.Contains(err.Error(), tt.errorHas))
				return
			}
			is.NoErr(err)
			is.Equal(ms.Meta, tt.want) // overrides
			if tt.warning == "" {
				is.Equal(warning, "")
			} else {
				is.True(strings.Contains(warning, tt.warning)) // says it approximates
			}
		})
	}
}
