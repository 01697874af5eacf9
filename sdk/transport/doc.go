// Package transport is the go-plugin/gRPC glue between the core and plugin
// binaries: the handshake and plugin sets, ServeBackend / ServePolicy that
// run a plugin binary, the plugin-side and host-side adapters, and the one
// translation between gRPC status codes and the sdk's domain errors.
//
// It lives apart from package sdk so that the types a plugin author
// implements (and packages such as sdk/engine or core/router that only use
// them) do not pull in go-plugin and gRPC.
package transport
