package sources

import (
	"os"
	"syscall"
)

// kernelFS names the kernel file system f is on, or "".
func kernelFS(f *os.File) string {
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(int(f.Fd()), &st); err != nil {
		return "an unknown file system"
	}
	switch uint64(st.Type) {
	case 0x9fa0:
		return "procfs"
	case 0x62656572:
		return "sysfs"
	case 0x64626720:
		return "debugfs"
	case 0x73636673:
		return "securityfs"
	case 0x27e0eb, 0x63677270:
		return "cgroupfs"
	case 0x74726163:
		return "tracefs"
	case 0x62656570:
		return "configfs"
	case 0xde5e81e4:
		return "efivarfs"
	case 0xcafe4a11:
		return "bpffs"
	}
	return ""
}
