// Command dflash-backend-ds4 is the backend plugin for DeepSeek V4 targets:
// GGUF architecture deepseek4 run by the native engine
// (libdflash_<device>.so, loaded at run time), with continuous batching,
// the model's own tokenizer, chat template and DSML output parser.
package main

import (
	"github.com/dflash/dflash_server/plugins/backend-ds4/ds4"
	"github.com/dflash/dflash_server/sdk/transport"
)

func main() { transport.ServeBackend(ds4.New()) }
