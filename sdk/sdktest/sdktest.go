// Package sdktest runs plugin implementations in-process through the real
// gRPC adapters (no binaries, works with -race), so backend and policy
// conformance tests exercise exactly what crosses the plugin boundary.
package sdktest

import (
	"sync"
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

// Recorder is an sdk.Emitter that keeps what one Start stream sent, for
// tests that run a backend's Start. It is safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	adm    sdk.Admission
	events []sdk.Event
}

var _ sdk.Emitter = (*Recorder)(nil)

func (r *Recorder) Admit(a sdk.Admission) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.adm = a
	return nil
}

func (r *Recorder) Emit(e sdk.Event) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
	return nil
}

// Result is what a recorded stream sent: its admission, its text,
// reasoning and token ids in order, and its finish (nil before it).
type Result struct {
	Admission       sdk.Admission
	Text, Reasoning string
	Tokens          []int32
	Finish          *sdk.Finish
}

// Result is the stream so far.
func (r *Recorder) Result() Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	res := Result{Admission: r.adm}
	for _, e := range r.events {
		res.Text += e.Text
		res.Reasoning += e.Reasoning
		res.Tokens = append(res.Tokens, e.TokenIDs...)
		if e.Finish != nil {
			res.Finish = e.Finish
		}
	}
	return res
}
