//go:build race

package main

// raceEnabled: the race detector slows guest code and the Go runtime
// several times over, so timing bounds are loosened under it.
const raceEnabled = true
