//go:build !linux

package pluginhost

import "os/exec"

// dieWithParent has no kernel support here; plugins watch their parent
// themselves (transport.ServeBackend).
func dieWithParent(*exec.Cmd) {}
