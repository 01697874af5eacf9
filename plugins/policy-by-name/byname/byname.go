package byname

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/dflash/dflash_server/plugins/policy-primary-first/primaryfirst"
	"github.com/dflash/dflash_server/sdk"
)

// Name is the policy's name (binary dflash-policy-by-name).
const Name = "by-name"

// Option names and values.
const (
	OptUnknownModel = "unknown-model"
	UnknownReject   = "reject"
	UnknownPrimary  = "primary"
)

// Policy is the by-name policy. Configure may run concurrently with Order.
type Policy struct {
	unknownToPrimary atomic.Bool
}

var _ sdk.Policy = (*Policy)(nil)

// New returns the policy with unknown-model=reject.
func New() *Policy { return &Policy{} }

// Info names the policy and its option.
func (p *Policy) Info(context.Context) (sdk.PolicyInfo, error) {
	return sdk.PolicyInfo{
		Name:       Name,
		APIVersion: sdk.APIVersion,
		Options: []sdk.OptionSpec{{
			Name: OptUnknownModel, Kind: sdk.OptionEnum, Default: UnknownReject,
			Enum: []string{UnknownReject, UnknownPrimary},
			Help: "what to do with a request naming a model that is not loaded: reject it with 404, or serve it with the primary",
		}},
	}, nil
}

// Configure applies options; unknown keys and values are errors naming them.
func (p *Policy) Configure(_ context.Context, opts map[string]string) error {
	for k, v := range opts {
		if k != OptUnknownModel {
			return fmt.Errorf("policy %s: unknown option %q (known: %s)", Name, k, OptUnknownModel)
		}
		switch v {
		case UnknownReject:
			p.unknownToPrimary.Store(false)
		case UnknownPrimary:
			p.unknownToPrimary.Store(true)
		default:
			return fmt.Errorf("policy %s: option %s=%q: want %s or %s", Name, k, v, UnknownReject, UnknownPrimary)
		}
	}
	return nil
}

// Order orders the candidates for one request.
func (p *Policy) Order(_ context.Context, snap sdk.Snapshot) (sdk.Decision, error) {
	return Order(snap, p.unknownToPrimary.Load()), nil
}

// Order is the policy as a function: unknownToPrimary serves unknown names
// with the primary instead of refusing them.
func Order(snap sdk.Snapshot, unknownToPrimary bool) sdk.Decision {
	want := strings.TrimSpace(snap.RequestedModel)
	if want == "" || strings.EqualFold(want, "auto") {
		return primaryfirst.Order(snap)
	}
	for _, m := range snap.Models {
		if m.Name == want {
			return sdk.Decision{Order: []string{m.Name}, Pin: true}
		}
	}
	for _, m := range snap.Models {
		if strings.EqualFold(m.Name, want) {
			return sdk.Decision{Order: []string{m.Name}, Pin: true}
		}
	}
	if unknownToPrimary {
		for _, m := range snap.Models {
			if m.Primary {
				return sdk.Decision{Order: []string{m.Name}, Pin: true}
			}
		}
		if len(snap.Models) > 0 {
			return sdk.Decision{Order: []string{snap.Models[0].Name}, Pin: true}
		}
	}
	names := make([]string, len(snap.Models))
	for i, m := range snap.Models {
		names[i] = m.Name
	}
	return sdk.Decision{NotFound: true, Message: fmt.Sprintf("model %q is not loaded; loaded models: %s", want, strings.Join(names, ", "))}
}
