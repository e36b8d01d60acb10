package cgroup

import (
	"os"
	"testing"
)

// One Read of a real v1 cgroup: five files (cpuacct.usage,
// memory.usage_in_bytes, memory.limit_in_bytes, one blkio file,
// /proc/<pid>/net/dev). On a cgroup v2 machine it reads a real v2 cgroup.
func BenchmarkReadV1RealCgroup(b *testing.B) {
	c := newRealCgroup(b)
	r, err := Open(c.dirs[ctrlMemory], WithPID(os.Getpid()))
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Read(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// One Read of the recorded v2 container: cpu.stat, memory.current,
// memory.max, io.stat with three devices, net/dev.
func BenchmarkReadV2Recorded(b *testing.B) {
	r, err := Open(brokerV2Path, WithCgroupRoot(v2Root), WithProcRoot(procRoot), WithPID(recordedNetPID))
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Read(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
