package api

import "github.com/dflash/dflash_server/core/router"

// rejection is the router's refusal; errorFor maps it to each API's status
// and error shape.
type rejection = router.Rejection
