// Package pluginhost finds plugin binaries in the plugin directory, launches
// them through go-plugin (gRPC only, checksum-verified when the operator pins
// hashes), checks their Info, relays their logs, and supervises backend
// processes: a backend that dies is marked restarting, its in-flight calls
// fail with sdk.ErrUnavailable, and a fresh process (new plugin.Client, new
// SecureConfig) is started and reloaded with backoff and a restart budget.
package pluginhost
