// Package pluginhost finds plugin binaries in the plugin directory, launches
// them through go-plugin (gRPC only, checksum-verified when the operator pins
// hashes), checks their Info, relays their logs, and supervises them.
//
// One supervisor type serves both kinds: it holds the current process and a
// typed state (core/health) that moves only along allowed transitions, and
// replaces a process that died by spawning a fresh one (new plugin.Client,
// new SecureConfig) under a RestartPolicy: a budget of attempts per window,
// exponential back-off on a timer that Shutdown/Close interrupt, and a
// deadline per attempt. While a plugin restarts its calls fail with
// sdk.ErrUnavailable; a backend's restart reloads its model, a policy's
// passes its options again.
package pluginhost
