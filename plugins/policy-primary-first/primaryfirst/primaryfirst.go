package primaryfirst

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/dflash/dflash_server/sdk"
)

// Name is the policy's name (binary dflash-policy-primary-first).
const Name = "primary-first"

// Order returns the models of snap that may fit the request, the primary
// first, then in the snapshot's (block) order. Models that are not
// available stay in the order: the core skips them while they are down and
// a waiting request can still get them when they come back.
func Order(snap sdk.Snapshot) sdk.Decision {
	order := make([]string, 0, len(snap.Models))
	for _, m := range snap.Models {
		if m.Primary && m.Fits {
			order = append(order, m.Name)
		}
	}
	for _, m := range snap.Models {
		if !m.Primary && m.Fits {
			order = append(order, m.Name)
		}
	}
	return sdk.Decision{Order: order}
}

// Policy is Order as an sdk.Policy. It takes no options.
type Policy struct{}

var _ sdk.Policy = Policy{}

// Info names the policy.
func (Policy) Info(context.Context) (sdk.PolicyInfo, error) {
	return sdk.PolicyInfo{Name: Name, APIVersion: sdk.APIVersion}, nil
}

// Configure refuses every option: the policy has none.
func (Policy) Configure(_ context.Context, opts map[string]string) error {
	if len(opts) == 0 {
		return nil
	}
	keys := make([]string, 0, len(opts))
	for k := range opts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return fmt.Errorf("policy %s takes no options, got %s", Name, strings.Join(keys, ", "))
}

// Order orders the candidates for one request.
func (Policy) Order(_ context.Context, snap sdk.Snapshot) (sdk.Decision, error) {
	return Order(snap), nil
}
