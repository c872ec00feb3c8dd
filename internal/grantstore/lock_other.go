//go:build !unix

package grantstore

import "sync"

// processLock stands in for a file lock where there is none: writers in
// one process do not lose each other's changes; another process's may.
var processLock sync.Mutex

func lockFile(string) (func(), error) {
	processLock.Lock()
	return processLock.Unlock, nil
}
