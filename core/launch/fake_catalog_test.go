package launch

import (
	"fmt"

	"github.com/dflash/dflash_server/sdk"
)

// fakeCatalog maps model paths to architectures and architectures to
// backends, standing in for the server's GGUF reader and plugin directory.
type fakeCatalog struct {
	archs    map[string]string // path → general.architecture
	backends []BackendHelp
	// probes counts calls that start plugin processes in the real catalog.
	probes int
}

func (c *fakeCatalog) DetectArch(path string) (string, error) {
	arch, ok := c.archs[path]
	if !ok {
		return "", fmt.Errorf("failed to detect architecture from %s: open %s: no such file or directory", path, path)
	}
	return arch, nil
}

func (c *fakeCatalog) Backend(arch string) (string, []sdk.OptionSpec, error) {
	c.probes++
	for _, b := range c.backends {
		for _, a := range b.Architectures {
			if a == arch {
				return b.Name, b.Options, nil
			}
		}
	}
	return "", nil, fmt.Errorf("no backend plugin serves architecture %q", arch)
}

func (c *fakeCatalog) Backends() []BackendHelp {
	c.probes++
	return c.backends
}

var (
	qwenOptions = []sdk.OptionSpec{
		{Name: "draft", Kind: sdk.OptionString, Help: "DFlash draft model (GGUF)."},
		{Name: "draft-device", Kind: sdk.OptionString, Help: "Device of the draft model (default: the target's)."},
		{Name: "draft-block-size", Kind: sdk.OptionInt, Default: "16", Help: "Tokens proposed per draft block."},
		{Name: "cache-type-k", Kind: sdk.OptionEnum, Default: "f16", Enum: []string{"f16", "bf16", "q8_0"}, Help: "KV cache type for K."},
		{Name: "cache-type-v", Kind: sdk.OptionEnum, Default: "f16", Enum: []string{"f16", "bf16", "q8_0"}, Help: "KV cache type for V."},
		{Name: "fa-window", Kind: sdk.OptionInt, Default: "0", Help: "Sliding flash-attention window (0 = full)."},
		{Name: "kv-paging", Kind: sdk.OptionEnum, Default: "off", Enum: []string{"off", "kvflash", "spark"}, Help: "Page KV to host memory.", SharedProcessPolicy: true},
		{Name: "target-split", Kind: sdk.OptionString, Help: "Split the target across devices.", SharedProcessPolicy: true},
		{Name: "temperature-scale", Kind: sdk.OptionFloat, Default: "1", Help: "Scale sampling temperature."},
	}
	ds4Options = []sdk.OptionSpec{
		{Name: "prefix-cache-slots", Kind: sdk.OptionInt, Default: "4", Help: "Prompt prefix snapshots kept."},
		{Name: "prefill-cache-slots", Kind: sdk.OptionInt, Default: "2", Help: "Prefill snapshots kept."},
		{Name: "disk-prefix-cache", Kind: sdk.OptionString, Default: "off", Help: "Directory for prefix snapshots, or off."},
		{Name: "ds4-fused-decode", Kind: sdk.OptionBool, Help: "Fused MoE decode kernel."},
		{Name: "ds4-expert-top-k", Kind: sdk.OptionInt, Default: "6", Help: "Experts per token."},
		{Name: "ds4-prefill", Kind: sdk.OptionEnum, Default: "exact", Enum: []string{"exact", "chunked"}, Help: "Prefill mode."},
		{Name: "ds4-compression", Kind: sdk.OptionBool, Help: "Compress the KV cache.", SharedProcessPolicy: true},
	}
)

func newFakeCatalog() *fakeCatalog {
	return &fakeCatalog{
		archs: map[string]string{
			"/models/qwen38-27b.gguf":        "qwen35",
			"/models/deepseek-v4-flash.gguf": "deepseek4",
			"/models/ds4.gguf":               "deepseek4",
			"/m/a.gguf":                      "qwen35",
			"/m/b.gguf":                      "qwen35",
			"/m/c.gguf":                      "qwen3",
			"/m/qwen.GGUF":                   "qwen3",
			"/m/llama.gguf":                  "llama",
		},
		backends: []BackendHelp{
			{Name: "qwen-dflash", Architectures: []string{"qwen35", "qwen3"}, Options: qwenOptions},
			{Name: "ds4", Architectures: []string{"deepseek4"}, Options: ds4Options},
		},
	}
}
