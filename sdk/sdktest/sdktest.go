// Package sdktest runs plugin implementations in-process through the real
// gRPC adapters (no binaries, works with -race), so backend and policy
// conformance tests exercise exactly what crosses the plugin boundary.
package sdktest

import (
	"testing"

	"github.com/hashicorp/go-plugin"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/transport"
)

// Backend serves impl over an in-memory gRPC connection and returns the
// host-side client. The connection closes when the test ends.
func Backend(t testing.TB, impl sdk.Backend) *transport.BackendClient {
	t.Helper()
	client, _ := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{
		transport.BackendPluginName: &transport.BackendPlugin{Impl: impl},
	})
	t.Cleanup(func() { client.Close() })
	raw, err := client.Dispense(transport.BackendPluginName)
	if err != nil {
		t.Fatalf("dispense backend: %v", err)
	}
	return raw.(*transport.BackendClient)
}

// Policy serves impl over an in-memory gRPC connection and returns the
// host-side client.
func Policy(t testing.TB, impl sdk.Policy) *transport.PolicyClient {
	t.Helper()
	client, _ := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{
		transport.PolicyPluginName: &transport.PolicyPlugin{Impl: impl},
	})
	t.Cleanup(func() { client.Close() })
	raw, err := client.Dispense(transport.PolicyPluginName)
	if err != nil {
		t.Fatalf("dispense policy: %v", err)
	}
	return raw.(*transport.PolicyClient)
}
