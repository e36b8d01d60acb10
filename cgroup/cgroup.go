// Package cgroup reads one target container's raw resource counters and
// gauges (CPU time, memory use and limit, block I/O bytes, network bytes) at
// one point in time, for a once-a-second sample loop: the sidecar's, node
// mode's in the agent, and the lab's. It imports no other package of the
// module, so every one of them can.
//
// It knows three ways to find the target, tried in this order by the sidecar
// (see DESIGN.md, "Finding the broker's cgroup from a sidecar"):
//
//   - [Open]: an explicit cgroup, given as a directory or as a path inside the
//     hierarchy. cgroup v2 and v1 (separate or combined "cpu,cpuacct" mounts)
//     are both read.
//   - [OpenPod]: a container of a Kubernetes pod, found by pod UID under the
//     host's cgroup filesystem mounted read-only into the sidecar (cgroupfs
//     and systemd drivers, all QoS classes, containerd, CRI-O and Docker,
//     the default kubelet cgroup root or one of its own).
//   - [ForPID]: the cgroup of a process, from /proc/<pid>/cgroup, with
//     gopsutil filling in what a root cgroup cannot tell about the process.
//
// Where the numbers come from (counters are cumulative since the cgroup was
// created, gauges are the current value):
//
//	field             cgroup v2                 cgroup v1                                    process in a root cgroup (ForPID)
//	CPUSeconds        cpu.stat usage_usec       cpuacct.usage                                gopsutil Times: user + system
//	MemoryBytes       memory.current            memory.usage_in_bytes                        gopsutil MemoryInfo: RSS
//	MemoryLimitBytes  memory.max                memory.limit_in_bytes                        0 (no limit)
//	DiskBytes         io.stat rbytes+wbytes     blkio.*io_service_bytes* Read+Write          gopsutil IOCounters: read + write bytes
//	NetworkBytes      /proc/<pid>/net/dev receive + transmit bytes of every interface but lo (all modes)
//
// Reads open, read and close each file every time into one reused buffer
// (about 90-110 µs and 5-6 small allocations, the open paths, per Read on
// the development VM). Keeping descriptors open and using pread measured
// about 4x faster per file (2 µs against 9 µs), some 70 µs saved per
// one-second sample; it was not done because every Reader would then need a
// Close, and an open /proc/<pid>/net/dev keeps reading the network namespace
// after the process has exited, so a vanished process would go unnoticed.
//
// A Reader also says what bounds the target's memory when it has no limit of
// its own ([MemoryReference]: the nearest limited cgroup above it, else the
// machine's memory), the reference of memory_percent then.
//
// A target that disappears (container restarted or exited, cgroup removed,
// process gone) makes Read fail with an error wrapping [ErrGone].
package cgroup

import (
	"context"
	"errors"
	"time"
)

// Stats is one reading. Counters are cumulative since the cgroup was created.
type Stats struct {
	Time             time.Time // when read (from the clock given with WithClock, default time.Now)
	CPUSeconds       float64   // counter: v2 cpu.stat usage_usec/1e6, v1 cpuacct.usage/1e9
	MemoryBytes      float64   // gauge: v2 memory.current, v1 memory.usage_in_bytes
	MemoryLimitBytes float64   // v2 memory.max, v1 memory.limit_in_bytes; 0 when unlimited
	DiskBytes        float64   // counter: read + write bytes
	NetworkBytes     float64   // counter: receive + transmit bytes from /proc/<pid>/net/dev, without lo
	HasNetwork       bool      // false when no PID is known: NetworkBytes is then undefined, not 0
}

// Reader reads the target's current Stats. A Reader is not safe for
// concurrent use: it reuses one buffer across reads.
type Reader interface {
	Read(ctx context.Context) (Stats, error)
	// MemoryReference says what bounds the target's memory (see there).
	MemoryReference() (MemoryReference, error)
}

// ErrGone means the target's cgroup directory or process vanished (container
// restarted or exited). Errors wrap it together with the path that vanished;
// test with errors.Is.
var ErrGone = errors.New("cgroup: target is gone")

// DefaultCgroupRoot and DefaultProcRoot are where the cgroup and proc
// filesystems are normally mounted.
const (
	DefaultCgroupRoot = "/sys/fs/cgroup"
	DefaultProcRoot   = "/proc"
)

// Option configures Open, OpenPod, FindPod, FindContainer and ForPID.
type Option func(*config)

type config struct {
	pid        int
	cgroupRoot string // "" means: find the mounts in <procRoot>/self/mountinfo
	// kubeletRoot is the kubelet's cgroup root (WithKubeletCgroupRoot); ""
	// means FindPod finds it.
	kubeletRoot string
	procRoot    string
	now         func() time.Time
}

func newConfig(opts []Option) config {
	c := config{procRoot: DefaultProcRoot, now: time.Now}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// WithPID names a process in the target's network namespace, whose
// /proc/<pid>/net/dev gives NetworkBytes. Any process of the pod will do, as
// the containers of a pod share one network namespace; a sidecar can pass its
// own os.Getpid(). Without it Stats.HasNetwork is false.
func WithPID(pid int) Option { return func(c *config) { c.pid = pid } }

// WithCgroupRoot says the cgroup filesystem normally at /sys/fs/cgroup is at
// dir instead, for example the host's mounted read-only into a sidecar at
// /host/sys/fs/cgroup, or a recorded tree in tests. The layout under dir is
// probed from its contents (cgroup.controllers at the top for v2,
// per-controller directories such as "memory" and "cpu,cpuacct" for v1)
// instead of being read from mountinfo, whose entries for a host mount seen
// from inside a cgroup namespace are not usable.
func WithCgroupRoot(dir string) Option { return func(c *config) { c.cgroupRoot = dir } }

// WithProcRoot says the proc filesystem is at dir instead of /proc.
func WithProcRoot(dir string) Option { return func(c *config) { c.procRoot = dir } }

// WithClock sets the clock that timestamps Stats (default time.Now).
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }
