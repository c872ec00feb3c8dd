//go:build race

package host_test

// raceEnabled: the race detector keeps shadow memory, so RSS measurements mean nothing.
const raceEnabled = true
