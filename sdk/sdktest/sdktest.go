// Package sdktest runs plugin implementations in-process through the real
// gRPC adapters (no binaries, works with -race), so backend and policy
// conformance tests exercise exactly what crosses the plugin boundary.
package sdktest

import (
	"testing"

	"github.com/hashicorp/go-plugin"

	"github.com/dflash/dflash_server/sdk"
)

// Backend serves impl over an in-memory gRPC connection and returns the
// host-side client. The connection closes when the test ends.
func Backend(t testing.TB, impl sdk.Backend) *sdk.BackendClient {
	t.Helper()
	client, _ := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{
		sdk.BackendPluginName: &sdk.BackendPlugin{Impl: impl},
	})
	t.Cleanup(func() { client.Close() })
	raw, err := client.Dispense(sdk.BackendPluginName)
	if err != nil {
		t.Fatalf("dispense backend: %v", err)
	}
	return raw.(*sdk.BackendClient)
}

// Policy serves impl over an in-memory gRPC connection and returns the
// host-side client.
func Policy(t testing.TB, impl sdk.Policy) *sdk.PolicyClient {
	t.Helper()
	client, _ := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{
		sdk.PolicyPluginName: &sdk.PolicyPlugin{Impl: impl},
	})
	t.Cleanup(func() { client.Close() })
	raw, err := client.Dispense(sdk.PolicyPluginName)
	if err != nil {
		t.Fatalf("dispense policy: %v", err)
	}
	return raw.(*sdk.PolicyClient)
}
