//go:build race

package sandbox

// raceEnabled: the race detector changes what allocations cost and keeps
// shadow memory, so heap and RSS measurements mean nothing.
const raceEnabled = true
