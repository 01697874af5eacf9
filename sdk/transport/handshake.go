package transport

import (
	"github.com/hashicorp/go-plugin"
)

// ProtocolVersion is the go-plugin protocol version of this SDK. It changes
// only with a breaking change of the proto packages (dflash.backend.v1 →
// v2); additive changes keep it.
const ProtocolVersion = 1

// Plugin names inside a go-plugin set.
const (
	BackendPluginName = "backend"
	PolicyPluginName  = "policy"
)

// Plugin binary name prefixes in the plugin directory.
const (
	BackendPrefix = "dflash-backend-"
	PolicyPrefix  = "dflash-policy-"
)

// Handshake is shared by every dflash plugin kind. The cookie is a UX
// guard against running a plugin by hand, not a security measure; it must
// never change.
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  ProtocolVersion,
	MagicCookieKey:   "DFLASH_PLUGIN",
	MagicCookieValue: "b7f1c0de-dflash-server-plugin",
}

// HostPluginSets is what the core offers when it launches a plugin: every
// protocol version it speaks, each with both plugin kinds.
func HostPluginSets() map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		ProtocolVersion: {
			BackendPluginName: &BackendPlugin{},
			PolicyPluginName:  &PolicyPlugin{},
		},
	}
}
