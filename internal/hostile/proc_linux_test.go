package hostile

import (
	"os/exec"
	"syscall"
)

// dieWithTest kills the server if the test process dies first.
func dieWithTest(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
