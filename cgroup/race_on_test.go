//go:build race

package cgroup

// The race detector's shadow memory multiplies what the child touches, so a
// race-enabled child needs a larger memory limit not to be OOM-killed.
const raceEnabled = true
