//go:build !linux

package sandbox

import "testing"

// TrackWritesAnyway: only Linux tracks writes.
func TrackWritesAnyway(testing.TB) bool { return false }
