package transport

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/hashicorp/go-hclog"
)

// ignoreStopSignals keeps a plugin alive when SIGINT or SIGTERM reaches the
// whole process group (systemd's KillMode=control-group, timeout(1),
// Ctrl-C) rather than the server alone: the server drains its requests
// first and then stops the plugin itself (Shutdown RPC, then Kill). A
// plugin whose server is gone still ends, through the parent-death signal
// and exitWithParent.
func ignoreStopSignals(log hclog.Logger) {
	ch := make(chan os.Signal, 4)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		for sig := range ch {
			log.Debug("ignoring signal: the server stops this plugin when it has drained", "signal", sig.String())
		}
	}()
}
