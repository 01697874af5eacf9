// Package e2e tests dflash_server end to end: the real server binary and
// real plugin processes over real HTTP. TestMain takes the binaries from
// DFLASH_BIN_DIR (what `make test-go` sets) or builds them into a temporary
// directory, and always builds the scripted test backend, which is not
// shipped. Each test starts its servers on free ports with a plugin
// directory of its own, so that the plugin processes a server started can
// be found in /proc and checked to be gone when it stops.
//
// Synchronisation is on observable state (/status/json, response headers,
// stream events), never on sleeps; the scripted backend's token delay only
// keeps capacity held while a test looks at it.
package e2e
