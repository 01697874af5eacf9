// Package sdk is what a dflash_server plugin author implements against: the
// Backend and Policy interfaces and the API-neutral request and event types
// that travel between the core and a backend. The go-plugin/gRPC transport
// (handshake, ServeBackend / ServePolicy, adapters) is in sdk/transport.
//
// Plugins never see HTTP.
package sdk
