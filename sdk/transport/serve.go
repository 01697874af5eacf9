package transport

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/dflash/dflash_server/sdk"
)

// Describe is what a plugin binary prints for `<binary> describe`, without
// a handshake, so tools can list plugins cheaply.
type Describe struct {
	Kind            string   `json:"kind"`
	Name            string   `json:"name"`
	ProtocolVersion int      `json:"protocol_version"`
	APIVersion      int      `json:"api_version"`
	Architectures   []string `json:"architectures,omitempty"`
}

// ServeBackend runs a backend plugin binary: it answers `describe`, else
// serves impl over go-plugin's gRPC protocol until the host kills it.
// Native libraries must be initialised in Load, never before this call: the
// first line on stdout is the handshake.
func ServeBackend(impl sdk.Backend) {
	if describeRequested() {
		info, err := impl.Info(context.Background())
		exitOnErr(err)
		printDescribe(Describe{Kind: "backend", Name: info.Name, ProtocolVersion: ProtocolVersion, APIVersion: sdk.APIVersion, Architectures: info.Architectures})
		return
	}
	go exitWithParent(func(ctx context.Context) { _ = impl.Shutdown(ctx) })
	serve(BackendPluginName, &BackendPlugin{Impl: impl})
}

// exitWithParent ends the plugin when the process that started it is gone
// (re-parented), after giving the backend a moment to free device memory.
// Where the kernel supports it the host also asks for a parent-death signal;
// this covers the rest.
func exitWithParent(shutdown func(ctx context.Context)) {
	parent := os.Getppid()
	for range time.Tick(time.Second) {
		if os.Getppid() != parent {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			shutdown(ctx)
			cancel()
			os.Exit(1)
		}
	}
}

// ServePolicy runs a policy plugin binary (see ServeBackend).
func ServePolicy(impl sdk.Policy) {
	if describeRequested() {
		info, err := impl.Info(context.Background())
		exitOnErr(err)
		printDescribe(Describe{Kind: "policy", Name: info.Name, ProtocolVersion: ProtocolVersion, APIVersion: sdk.APIVersion})
		return
	}
	go exitWithParent(func(context.Context) {})
	serve(PolicyPluginName, &PolicyPlugin{Impl: impl})
}

// EnvLogLevel names the environment variable through which the host passes
// its --log-level to a plugin process.
const EnvLogLevel = "DFLASH_LOG_LEVEL"

// PluginLogger is the logger a plugin should use: JSON on stderr, which the
// host relays into its own log tagged with the plugin's name.
func PluginLogger(name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name: name, Level: hclog.LevelFromString(envOr(EnvLogLevel, "info")),
		Output: os.Stderr, JSONFormat: true,
	})
}

func serve(name string, p plugin.Plugin) {
	log := PluginLogger(name)
	ignoreStopSignals(log)
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: map[int]plugin.PluginSet{ProtocolVersion: {name: p}},
		GRPCServer:       grpcServer,
		Logger:           log,
	})
}

func describeRequested() bool { return len(os.Args) == 2 && os.Args[1] == "describe" }

func printDescribe(d Describe) {
	b, _ := json.Marshal(d)
	fmt.Println(string(b))
}

func exitOnErr(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
