package primaryfirst_test

import (
	"context"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/plugins/policy-primary-first/primaryfirst"
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/sdktest"
)

func snap(requested string, models ...sdk.ModelState) sdk.Snapshot {
	return sdk.Snapshot{RequestedModel: requested, Models: models}
}

func TestOrder(t *testing.T) {
	tests := []struct {
		name string
		snap sdk.Snapshot
		want []string
	}{
		{"block order, name ignored", snap("b",
			sdk.ModelState{Name: "a", Primary: true, Fits: true},
			sdk.ModelState{Name: "b", Fits: true},
			sdk.ModelState{Name: "c", Fits: true}), []string{"a", "b", "c"}},
		{"primary first wherever it is listed", snap("",
			sdk.ModelState{Name: "a", Fits: true},
			sdk.ModelState{Name: "b", Primary: true, Fits: true}), []string{"b", "a"}},
		{"skips what cannot fit, keeps unavailable", snap("",
			sdk.ModelState{Name: "a", Primary: true, Fits: false},
			sdk.ModelState{Name: "b", Fits: true, Available: false}), []string{"b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			d := primaryfirst.Order(tt.snap)
			is.Equal(d.Order, tt.want)
			is.True(!d.Pin && !d.NotFound) // never pins
		})
	}
}

func TestOverGRPC(t *testing.T) {
	is := is.New(t)
	p := sdktest.Policy(t, primaryfirst.Policy{})
	info, err := p.Info(context.Background())
	is.NoErr(err)
	is.Equal(info.Name, primaryfirst.Name)
	is.True(p.Configure(context.Background(), map[string]string{"x": "1"}) != nil) // no options
	d, err := p.Order(context.Background(), snap("", sdk.ModelState{Name: "a", Primary: true, Fits: true}, sdk.ModelState{Name: "b", Fits: true}))
	is.NoErr(err)
	is.Equal(d.Order, []string{"a", "b"})
}
