package launch_test

import (
	"errors"
	"fmt"

	"github.com/dflash/dflash_server/core/launch"
	"github.com/dflash/dflash_server/sdk"
)

// exampleCatalog serves one file of architecture qwen3.
type exampleCatalog struct{}

func (exampleCatalog) DetectArch(path string) (string, error) {
	if path != "/models/qwen3-8b.gguf" {
		return "", fmt.Errorf("failed to detect architecture from %s: no such file", path)
	}
	return "qwen3", nil
}

func (exampleCatalog) Backend(arch string) (string, []sdk.OptionSpec, error) {
	return "qwen-dflash", []sdk.OptionSpec{{Name: "draft", Kind: sdk.OptionString}}, nil
}

func (exampleCatalog) Backends() []launch.BackendHelp { return nil }

// How cmd/dflash_server maps Parse's result onto exit codes.
func ExampleParse() {
	for _, argv := range [][]string{
		{"--port", "9000", "/models/qwen3-8b.gguf", "--draft", "/models/d.gguf", "--max-concurrency", "4"},
		{"/models/qwen3-8b.gguf", "--model", "/models/other.gguf"},
		{"--help"},
	} {
		cfg, err := launch.Parse(argv, exampleCatalog{})
		var ue *launch.UsageError
		switch {
		case errors.Is(err, launch.ErrHelp):
			fmt.Println("print launch.Help(cat), exit 0")
		case errors.As(err, &ue):
			fmt.Printf("dflash_server: error: %s (exit 2)\n", ue)
		case err != nil:
			fmt.Println("exit 1:", err)
		default:
			b := cfg.Blocks[cfg.Primary]
			fmt.Println(cfg.Port, b.Name, b.Backend, b.Device, b.MaxConcurrency, b.Options["draft"], cfg.Load)
		}
	}
	// Output:
	// 9000 qwen3-8b qwen-dflash cpu:0 4 /models/d.gguf [0]
	// dflash_server: error: --model #2 (/models/other.gguf): failed to detect architecture from /models/other.gguf: no such file (exit 2)
	// print launch.Help(cat), exit 0
}
