//go:build !linux

package sources

import "os"

// fsView names this process's view of the file system: elsewhere than on
// Linux, the machine's (processes of one machine see the same folders at
// a path). "" when it cannot be told.
func fsView() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return ""
	}
	return "host " + h
}
