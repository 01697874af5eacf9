// Package launch turns dflash_server's command line into a launch
// configuration: global and listener options, then one model block per
// --model <path> (the first path may be positional). The core owns the
// global, listener and capacity options; every other option in a block is
// declared by the backend plugin that serves the block's GGUF architecture,
// which the package learns through a Catalog.
//
// Parse is pure: it never prints or exits. Every user mistake is returned as
// a one-line *UsageError (exit status 2), prefixed with the block it concerns,
// e.g. "--model #2 (/models/ds4.gguf): --max-ctx: missing value".
package launch
