//go:build race

package statestore

// raceEnabled: the race detector drops a share of what is put in a
// sync.Pool, so what a pool spares is allocated again, now and then.
const raceEnabled = true
