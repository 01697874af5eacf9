package byname_test

import (
	"context"
	"strings"
	"testing"

	"github.com/matryer/is"

	"github.com/dflash/dflash_server/plugins/policy-by-name/byname"
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/sdktest"
)

var models = []sdk.ModelState{{Name: "qwen", Primary: true, Fits: true}, {Name: "ds4", Fits: true}}

func TestOrder(t *testing.T) {
	tests := []struct {
		name      string
		requested string
		toPrimary bool
		want      sdk.Decision
	}{
		{"omitted is balanced", "", false, sdk.Decision{Order: []string{"qwen", "ds4"}}},
		{"auto is balanced", "AUTO", false, sdk.Decision{Order: []string{"qwen", "ds4"}}},
		{"named model is pinned", "ds4", false, sdk.Decision{Order: []string{"ds4"}, Pin: true}},
		{"case-insensitive match", "DS4", false, sdk.Decision{Order: []string{"ds4"}, Pin: true}},
		{"unknown served by the primary", "gpt-4", true, sdk.Decision{Order: []string{"qwen"}, Pin: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			is := is.New(t)
			d := byname.Order(sdk.Snapshot{RequestedModel: tt.requested, Models: models}, tt.toPrimary)
			is.Equal(d, tt.want)
		})
	}
	t.Run("unknown is not found", func(t *testing.T) {
		is := is.New(t)
		d := byname.Order(sdk.Snapshot{RequestedModel: "gpt-4", Models: models}, false)
		is.True(d.NotFound)
		is.True(strings.Contains(d.Message, `"gpt-4"`))   // names the request
		is.True(strings.Contains(d.Message, "qwen, ds4")) // lists the loaded models
	})
}

func TestConfigureOverGRPC(t *testing.T) {
	is := is.New(t)
	ctx := context.Background()
	p := sdktest.Policy(t, byname.New())
	info, err := p.Info(ctx)
	is.NoErr(err)
	is.Equal(info.Name, byname.Name)
	is.True(p.Configure(ctx, map[string]string{"unknown-model": "maybe"}) != nil) // bad value
	is.True(p.Configure(ctx, map[string]string{"colour": "red"}) != nil)          // bad key
	is.NoErr(p.Configure(ctx, map[string]string{"unknown-model": "primary"}))
	d, err := p.Order(ctx, sdk.Snapshot{RequestedModel: "nope", Models: models})
	is.NoErr(err)
	is.Equal(d.Order, []string{"qwen"}) // configured over the wire
	is.True(d.Pin)
}
