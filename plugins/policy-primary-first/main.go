// Command dflash-policy-primary-first is the default routing policy: the
// operator's primary model first, then the other loaded models in block
// order. The request's model field never pins a model.
package main

import (
	"github.com/dflash/dflash_server/plugins/policy-primary-first/primaryfirst"
	"github.com/dflash/dflash_server/sdk/transport"
)

func main() { transport.ServePolicy(primaryfirst.Policy{}) }
