package main

import (
	"fmt"
	"io"
	"os"

	"github.com/alecthomas/kong"
)

type cli struct {
	Inspect inspectCmd `cmd:"" help:"Print a GGUF file's architecture, hyperparameters, tokenizer, chat template and tensors."`
	Convert convertCmd `cmd:"" help:"Convert a Hugging Face safetensors checkpoint (qwen3, qwen3_5, deepseek_v4, DFlash draft) to GGUF."`
	Mk      mkCmd      `cmd:"" help:"Write a random-weight model of a served architecture, with a real tokenizer."`
}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "dflash-model:", err)
		os.Exit(1)
	}
}

// run parses args and runs the chosen command, printing to out.
func run(args []string, out io.Writer) error {
	var c cli
	parser, err := kong.New(&c,
		kong.Name("dflash-model"),
		kong.Description("Inspect, convert and generate GGUF model files."),
		kong.UsageOnError(),
		kong.Writers(out, os.Stderr),
		kong.BindTo(out, (*io.Writer)(nil)),
		kong.Vars{"presets": presetNames(), "types": outputTypeNames()},
	)
	if err != nil {
		return err
	}
	ctx, err := parser.Parse(args)
	if err != nil {
		return err
	}
	return ctx.Run()
}
