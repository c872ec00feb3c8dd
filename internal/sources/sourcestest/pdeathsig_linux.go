package sourcestest

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill cmd if the test process dies first (a
// panic, a timeout), which skips the test's cleanup.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
