package nativebackend

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/engine"
)

// TestDeclaredDefaultsAreTheParsedOnes: what --help shows as a default is
// what a block that leaves the option out gets.
func TestDeclaredDefaultsAreTheParsedOnes(t *testing.T) {
	is := is.New(t)
	r := NewOptions(nil)
	got := r.Engine()
	is.NoErr(r.Err())
	parsed := map[string]int{
		"kv-block-size": got.KVBlockSize, "threads": got.Threads, "step-tokens": got.StepTokens,
		"decode-headroom": got.DecodeHeadroom, "prefix-cache-slots": got.PrefixSlots,
	}
	for _, s := range append(EngineOptionSpecs(), PrefixCacheSpec()) {
		if s.Name == "warmup" {
			is.Equal(s.Default, got.Warmup)
			continue
		}
		if s.Kind != sdk.OptionInt {
			is.Equal(s.Default, DefaultCacheType) // cache types
			continue
		}
		is.Equal(s.Default, strconv.Itoa(parsed[s.Name])) // declared default of --s.Name is the parsed one
	}
}

func TestOptionProblems(t *testing.T) {
	tests := []struct {
		name string
		opts map[string]string
		want []string // every problem, each naming its flag
	}{
		{"fine", map[string]string{"threads": "4", "cache-type-k": "Q8_0"}, nil},
		{"not an integer", map[string]string{"step-tokens": "many"}, []string{`--step-tokens: "many" is not an integer`}},
		{"out of range", map[string]string{"kv-block-size": "0"}, []string{"--kv-block-size: 0 is outside [1, 4096]"}},
		{"bad cache type", map[string]string{"cache-type-v": "q4"}, []string{`--cache-type-v: "q4" is not a KV cache type`}},
		{"unknown and bad together", map[string]string{"nope": "1", "threads": "-1"}, []string{"--nope: unknown option of the test backend", "--threads: -1 is outside"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			r := NewOptions(tt.opts)
			r.Known("test", append(EngineOptionSpecs(), PrefixCacheSpec()))
			r.Engine()
			err := r.Err()
			if tt.want == nil {
				is.NoErr(err)
				return
			}
			var inv *sdk.InvalidError
			is.True(errors.As(err, &inv)) // the user's mistake, shown as it is
			for _, w := range tt.want {
				is.True(strings.Contains(err.Error(), w)) // names the flag and the problem
			}
		})
	}
}

func TestRequestSettings(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	tests := []struct {
		name string
		s    sdk.Sampling
		want string // error substring; "" for none
	}{
		{"preset kept", sdk.Sampling{}, ""},
		{"negative temperature", sdk.Sampling{Temperature: f(-1)}, "temperature -1 must not be negative"},
		{"top_p zero", sdk.Sampling{TopP: f(0)}, "top_p 0 must be in (0, 1]"},
		{"min_p above one", sdk.Sampling{MinP: f(2)}, "min_p 2 must be in [0, 1]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			_, err := Sampling(tt.s, engine.Sampling{Temperature: 0.7, TopP: 0.8})
			if tt.want == "" {
				is.NoErr(err)
				return
			}
			is.True(err != nil && strings.Contains(err.Error(), tt.want))
		})
	}
	t.Run("response formats", func(t *testing.T) {
		is := is.New(t)
		f, s, err := ResponseFormat("b", &sdk.ChatRequest{ResponseFormat: "json_schema", JSONSchema: []byte(`{"type":"object","properties":{"a":{"type":"string"}}}`)})
		is.NoErr(err)
		is.Equal(f, engine.FormatJSONSchema)
		is.True(s != nil)
		_, _, err = ResponseFormat("b", &sdk.ChatRequest{ResponseFormat: "json_schema", JSONSchema: []byte(`{"type":"object","properties":{"a":{"pattern":"x"}}}`)})
		is.True(err != nil && strings.Contains(err.Error(), `keyword "pattern" is not supported`)) // names the keyword
		f, _, err = ResponseFormat("b", &sdk.ChatRequest{ResponseFormat: "json_object"})
		is.NoErr(err)
		is.Equal(f, engine.FormatJSONObject)
		_, _, err = ResponseFormat("b", &sdk.ChatRequest{ResponseFormat: "yaml"})
		is.True(err != nil && strings.Contains(err.Error(), "not supported by the b backend"))
	})
	t.Run("max tokens", func(t *testing.T) {
		is := is.New(t)
		desc := sdk.ModelDescription{DefaultMaxTokens: 100, MaxTokens: 500}
		is.Equal(MaxTokens(&sdk.ChatRequest{}, desc), 100)                // the model's default
		is.Equal(MaxTokens(&sdk.ChatRequest{MaxTokens: 9000}, desc), 500) // capped
	})
}

// TestChangedMeta: the disk prefix cache's identity names what a backend's
// Configure overrode, and nothing else.
func TestChangedMeta(t *testing.T) {
	is := is.New(t)
	before := map[string]any{"a.x": uint32(6), "a.y": []int64{1, 2}, "a.z": "same"}
	after := map[string]any{"a.x": int64(4), "a.y": []int64{1, 2}, "a.z": "same", "a.engine.mode": "exact"}
	is.Equal(changedMeta(before, after), map[string]any{"a.x": int64(4), "a.engine.mode": "exact"})
	is.Equal(changedMeta(before, before), map[string]any{})
}

// TestWarmupOn: auto runs the warm-up on a GPU library only; on and off decide alone.
func TestWarmupOn(t *testing.T) {
	for _, tc := range []struct {
		mode, lib string
		want      bool
	}{
		{"auto", "cpu", false}, {"auto", "cuda", true}, {"on", "cpu", true}, {"off", "cuda", false},
	} {
		t.Run(tc.mode+" "+tc.lib, func(t *testing.T) {
			is.New(t).Equal(warmupOn(tc.mode, tc.lib), tc.want)
		})
	}
}

// TestWarmupShapes: the long prompt with its decoded tokens first, then the shorter prompts that fit half the context,
// one token each; none where the first does not fit.
func TestWarmupShapes(t *testing.T) {
	for _, tc := range []struct {
		maxCtx, stepTokens int
		want               []warmupShape
	}{
		{4096, 512, []warmupShape{{512, 1}, {64, 1}, {56, 1}, {48, 1}, {40, 1}, {32, 1}, {24, 1}, {16, 1}, {8, 1}, {4, 1}, {2, 1}, {80, 8}}},
		{600, 512, []warmupShape{{300, 1}, {64, 1}, {56, 1}, {48, 1}, {40, 1}, {32, 1}, {24, 1}, {16, 1}, {8, 1}, {4, 1}, {2, 1}, {80, 8}}},
		{4096, 0, []warmupShape{{64, 1}, {56, 1}, {48, 1}, {40, 1}, {32, 1}, {24, 1}, {16, 1}, {8, 1}, {4, 1}, {2, 1}, {80, 8}}},
		{4096, 64, []warmupShape{{64, 1}, {56, 1}, {48, 1}, {40, 1}, {32, 1}, {24, 1}, {16, 1}, {8, 1}, {4, 1}, {2, 1}, {80, 8}}},
		{40, 512, []warmupShape{{16, 1}, {8, 1}, {4, 1}, {2, 1}, {20, 8}}},
		{8, 512, []warmupShape{{2, 1}, {4, 2}}},
		{3, 512, nil},
	} {
		t.Run(fmt.Sprintf("ctx %d, step %d", tc.maxCtx, tc.stepTokens), func(t *testing.T) {
			is.New(t).Equal(warmupShapes(tc.maxCtx, tc.stepTokens), tc.want)
		})
	}
}
