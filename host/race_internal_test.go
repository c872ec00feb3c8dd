//go:build race

package host

// raceEnabled: the race detector keeps shadow memory, so RSS measurements
// mean nothing; it changes stack frames; and it drops a share of what is
// put in a sync.Pool, so what a pool spares is allocated again, now and
// then. Package host_test reads it as RaceEnabled (export_test.go).
const raceEnabled = true
