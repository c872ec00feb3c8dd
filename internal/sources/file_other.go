//go:build !linux

package sources

import "os"

// kernelFS names the kernel file system f is on, or "": known on Linux
// only; elsewhere the path check of readSourceFile applies.
func kernelFS(*os.File) string { return "" }
