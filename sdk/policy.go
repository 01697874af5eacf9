package sdk

import "context"

// Policy is what a routing policy plugin implements: one call per request
// that turns a snapshot of the loaded models into an order of candidates.
// Admission stays in the core; a policy only orders.
type Policy interface {
	// Info names the policy and its options.
	Info(ctx context.Context) (PolicyInfo, error)
	// Configure passes the launch's policy options (e.g. unknown-model).
	Configure(ctx context.Context, opts map[string]string) error
	// Order returns the candidate models for one request, most preferred
	// first. It must be fast and must not block.
	Order(ctx context.Context, snap Snapshot) (Decision, error)
}

// PolicyInfo describes a policy plugin.
type PolicyInfo struct {
	// Name is the plugin's name without the dflash-policy- prefix.
	Name       string
	Options    []OptionSpec
	APIVersion int
}

// Snapshot is the state a policy sees for one request.
type Snapshot struct {
	// RequestedModel is the request's model field ("" when omitted).
	RequestedModel string
	// Models are the loaded models in the operator's priority order
	// (primary first, then block order).
	Models []ModelState
	// Waiting is the number of requests waiting in the queue.
	Waiting int
}

// ModelState is one model in a Snapshot.
type ModelState struct {
	Name string
	// Primary is true for the operator's selected primary.
	Primary bool
	// Available is false while the model's backend is restarting or failed.
	Available    bool
	Slots        int
	InFlight     int
	KVPoolTokens int
	KVTokensUsed int
	MaxCtx       int
	// Fits is false when the core already knows this request can never fit
	// this model.
	Fits bool
}

// Decision is a policy's answer.
type Decision struct {
	// Order lists model names, most preferred first. Models not listed are
	// not tried.
	Order []string
	// Pin means the request waits for the first model in Order instead of
	// spilling to the others (by-name routing).
	Pin bool
	// NotFound rejects the request with 404: the requested model is not
	// loaded. Message says so, naming the loaded models.
	NotFound bool
	Message  string
}
