package pluginhost

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel kill the plugin if the server dies without
// a chance to stop it (SIGKILL, OOM kill): a plugin left behind would keep
// its device memory.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
