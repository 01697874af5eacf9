// Package health defines the states of a supervised plugin (a model's
// backend or the routing policy), shared by the plugin host that sets them
// and the router, API and metrics that read them.
package health

// State is where a supervised plugin is in its life.
type State string

// The states, in the order a plugin usually passes through them.
const (
	// Starting: the process is being launched and its Info checked.
	Starting State = "starting"
	// Loading: a backend is loading its model.
	Loading State = "loading"
	// Ready: the plugin serves calls.
	Ready State = "ready"
	// Restarting: the process died and a fresh one is being started.
	Restarting State = "restarting"
	// Failed: loading failed or the restart budget is spent; the plugin
	// stays unavailable.
	Failed State = "failed"
	// Stopped: the server stopped the plugin; nothing follows.
	Stopped State = "stopped"
)
