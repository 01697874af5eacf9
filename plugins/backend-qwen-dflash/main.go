// Command dflash-backend-qwen-dflash is the backend plugin for Qwen targets:
// GGUF architectures qwen3 and qwen35 run by the native engine
// (libdflash_<device>.so, loaded at run time), with continuous batching,
// the model's own tokenizer, chat template and output parser.
package main

import (
	"github.com/dflash/dflash_server/plugins/backend-qwen-dflash/qwendflash"
	"github.com/dflash/dflash_server/sdk/transport"
)

func main() { transport.ServeBackend(qwendflash.New()) }
