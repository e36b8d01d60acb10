//go:build race

package node

// The race detector's shadow memory multiplies what the re-executed test
// binary touches, so a container running it needs a larger memory limit not
// to be OOM-killed (and then killed whole, as memory.oom.group does).
const raceEnabled = true
