// Package sdk is what a dflash_server plugin author imports: the Backend and
// Policy interfaces, the API-neutral request and event types that travel
// between the core and a backend, the go-plugin handshake, and the
// ServeBackend / ServePolicy helpers that run a plugin binary.
//
// The core (cmd/dflash_server, core/...) talks to plugins only through the
// host adapters in this package; plugins never see HTTP.
package sdk
