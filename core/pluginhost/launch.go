package pluginhost

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/transport"
)

func errorsAs(err error, target any) bool { return errors.As(err, target) }

// process is one running plugin binary.
type process struct {
	file   File
	client *plugin.Client
	impl   any
}

// startTimeout bounds the go-plugin handshake; loading happens later, in
// the Load RPC.
const startTimeout = 20 * time.Second

// launch starts f, negotiates the protocol and dispenses its kind. Every
// failure is one line naming the file.
func launch(f File, logger hclog.Logger, env []string) (*process, error) {
	cmd := exec.Command(f.Path)
	cmd.Env = append(cmd.Environ(), env...)
	dieWithParent(cmd)
	cfg := &plugin.ClientConfig{
		HandshakeConfig:  transport.Handshake,
		VersionedPlugins: transport.HostPluginSets(),
		Cmd:              cmd,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           logger.Named(f.Kind.String() + "." + f.Name),
		StartTimeout:     startTimeout,
		Managed:          true,
		AutoMTLS:         true,
	}
	if f.Checksum != nil {
		// A fresh SecureConfig per launch: its hash is not reset by Check.
		cfg.SecureConfig = &plugin.SecureConfig{Checksum: f.Checksum, Hash: sha256.New()}
	}
	client := plugin.NewClient(cfg)
	rpc, err := client.Client()
	if err != nil {
		client.Kill()
		return nil, &LaunchError{Path: f.Path, Reason: oneLine(describeLaunchErr(err)), Err: err}
	}
	name := transport.BackendPluginName
	if f.Kind == KindPolicy {
		name = transport.PolicyPluginName
	}
	impl, err := rpc.Dispense(name)
	if err != nil {
		client.Kill()
		return nil, &LaunchError{Path: f.Path, Reason: "dispense " + name + ": " + oneLine(err.Error()), Err: err}
	}
	return &process{file: f, client: client, impl: impl}, nil
}

// LaunchError is a plugin binary that could not be started as a plugin:
// Path names the file and Reason says why in words an operator can act on.
type LaunchError struct {
	Path   string
	Reason string
	Err    error // go-plugin's own error
}

func (e *LaunchError) Error() string { return "plugin " + e.Path + ": " + e.Reason }
func (e *LaunchError) Unwrap() error { return e.Err }

func (k Kind) String() string { return string(k) }

// describeLaunchErr turns go-plugin's launch errors into words an operator
// can act on.
func describeLaunchErr(err error) string {
	switch {
	case errors.Is(err, plugin.ErrChecksumsDoNotMatch):
		return "checksum mismatch: the binary does not match its pinned sha256"
	case strings.Contains(strings.ToLower(err.Error()), "incompatible api version"):
		return "wrong handshake: " + err.Error()
	case strings.Contains(err.Error(), "Unrecognized remote plugin message"):
		return "not a dflash plugin (no go-plugin handshake on stdout)"
	case strings.Contains(err.Error(), "plugin exited before we could connect"):
		return "not a dflash plugin or wrong handshake: it exited before the handshake"
	case strings.Contains(err.Error(), "timeout while waiting for plugin to start"):
		return fmt.Sprintf("not a dflash plugin: no handshake within %s", startTimeout)
	}
	return err.Error()
}

func oneLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSpace(s)
}

// checkAPIVersion refuses a plugin built against another SDK API version,
// before anything is loaded into it.
func checkAPIVersion(f File, v int) error {
	if v != sdk.APIVersion {
		return fmt.Errorf("plugin %s: speaks API version %d, this server speaks %d", f.Path, v, sdk.APIVersion)
	}
	return nil
}

// kill ends the process; Shutdown RPCs are the caller's business. A
// process without a go-plugin client (a test double) has nothing to kill.
func (p *process) kill() {
	if p.client != nil {
		p.client.Kill()
	}
}

// pid is the process id, 0 when unknown.
func (p *process) pid() int {
	if p.client == nil {
		return 0
	}
	if rc := p.client.ReattachConfig(); rc != nil {
		return rc.Pid
	}
	return 0
}
