//go:build !linux

package sourcestest

import "os/exec"

// dieWithParent does nothing here: the test's cleanup stops the registry.
func dieWithParent(cmd *exec.Cmd) {}
