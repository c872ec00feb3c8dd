//go:build !race

package sessions_test

const raceEnabled = false
