package sources

import (
	"fmt"
	"os"
	"strings"
	"syscall"
)

// fsView names this process's view of the file system: the machine's
// boot, the mount namespace and the root folder. Processes with the same
// view find the same folder at a path; two containers, a service with a
// private /tmp or a chroot have views of their own. "" when it cannot be
// told.
func fsView() string {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	ns, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return ""
	}
	var st syscall.Stat_t
	if err := syscall.Stat("/", &st); err != nil {
		return ""
	}
	return fmt.Sprintf("linux boot %s %s root %d:%d", strings.TrimSpace(string(boot)), ns, st.Dev, st.Ino)
}
