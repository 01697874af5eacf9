// Command dflash_server serves several LLMs through one HTTP address. Each
// --model PATH starts a model block; see `dflash_server --help`.
package main

import (
	"os"

	"github.com/dflash/dflash_server/core/server"
)

func main() { os.Exit(server.Run(os.Args[1:], os.Stdout, os.Stderr)) }
