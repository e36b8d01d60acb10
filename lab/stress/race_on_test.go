//go:build race

package stress

// The race detector shadows the memory the child writes, so what the cgroup
// charges is no longer what the profile holds: the memory tests skip.
const raceEnabled = true
