// Command dflash-backend-scripted is a test double: a backend plugin with
// scripted, deterministic output and controllable timing and capacity. It
// serves the GGUF architecture "scripted" only, so it can never be mistaken
// for a real model. Tests and benchmarks of the core use it where they need
// exact control over timing; everything else uses real models.
package main

import (
	"github.com/dflash/dflash_server/plugins/backend-scripted/scripted"
	"github.com/dflash/dflash_server/sdk/transport"
)

func main() { transport.ServeBackend(scripted.New()) }
