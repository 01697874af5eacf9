// Command dflash-policy-by-name routes a request that names a loaded model
// to that model only (it waits for its capacity and never spills); requests
// without a name, or naming "auto", are balanced primary-first. Option
// unknown-model=reject|primary says what happens to unknown names.
package main

import (
	"github.com/dflash/dflash_server/plugins/policy-by-name/byname"
	"github.com/dflash/dflash_server/sdk/transport"
)

func main() { transport.ServePolicy(byname.New()) }
