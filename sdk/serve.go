package sdk

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
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
func ServeBackend(impl Backend) {
	if describeRequested() {
		info, err := impl.Info(context.Background())
		exitOnErr(err)
		printDescribe(Describe{Kind: "backend", Name: info.Name, ProtocolVersion: ProtocolVersion, APIVersion: APIVersion, Architectures: info.Architectures})
		return
	}
	serve(BackendPluginName, &BackendPlugin{Impl: impl})
}

// ServePolicy runs a policy plugin binary (see ServeBackend).
func ServePolicy(impl Policy) {
	if describeRequested() {
		info, err := impl.Info(context.Background())
		exitOnErr(err)
		printDescribe(Describe{Kind: "policy", Name: info.Name, ProtocolVersion: ProtocolVersion, APIVersion: APIVersion})
		return
	}
	serve(PolicyPluginName, &PolicyPlugin{Impl: impl})
}

// PluginLogger is the logger a plugin should use: JSON on stderr, which the
// host relays into its own log tagged with the plugin's name.
func PluginLogger(name string) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name: name, Level: hclog.LevelFromString(envOr("DFLASH_LOG_LEVEL", "info")),
		Output: os.Stderr, JSONFormat: true,
	})
}

func serve(name string, p plugin.Plugin) {
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: map[int]plugin.PluginSet{ProtocolVersion: {name: p}},
		GRPCServer:       plugin.DefaultGRPCServer,
		Logger:           PluginLogger(name),
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
