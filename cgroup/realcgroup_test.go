package cgroup

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// The real-cgroup tests create cgroups as root in whichever hierarchy this
// machine has mounted: the cpuacct, memory and blkio (and cpu) v1
// hierarchies, or the cgroup v2 one (make test-cgroup2 runs them on a cgroup
// v2-only kernel). Without root or cgroups they skip; with
// AMF_REQUIRE_REAL_CGROUPS=1 (set in that guest) they fail instead, so that
// a skip cannot pass for a pass.
const requireEnv = "AMF_REQUIRE_REAL_CGROUPS"

// skipOrFail skips the test, or fails it when real cgroups are required.
func skipOrFail(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if os.Getenv(requireEnv) == "1" {
		tb.Fatalf("%s=1, but: "+format, append([]any{requireEnv}, args...)...)
	}
	tb.Skipf("skip: "+format, args...)
}

// The limits the tests set on the cgroup their worker child runs in: memory
// 64 MiB (1 GiB under the race detector, whose shadow memory would
// otherwise get the child OOM-killed), CPU half a core.
var cgroupLimit = func() int {
	if raceEnabled {
		return 1 << 30
	}
	return 64 << 20
}()

const (
	cpuQuotaUsec  = 50000
	cpuPeriodUsec = 100000
	cpuLimit      = float64(cpuQuotaUsec) / cpuPeriodUsec // cores
)

// realCgroup is one cgroup created by a test, in every hierarchy it needs.
type realCgroup struct {
	path string // hierarchy path, "/amf-test-<random>[/...]"
	v2   bool
	// dirs is the cgroup's directory per controller: on v1 for cpuacct,
	// memory and blkio, and cpu when that is mounted; on v2 the one
	// directory under each of those keys.
	dirs map[string]string
	// ioAccounts says whether block I/O done in the cgroup shows in its
	// statistics here: v1 kernels with blk-cgroup statistics off (some VMs)
	// show only "Total 0", even in the root, and others list only devices
	// that a throttle limit was once set on; the temp folder's disk must be
	// listed. A temporary folder on tmpfs does no block I/O at all.
	ioAccounts bool
	cpuLimited bool // a CPU limit (cpuLimit) is set on it
}

// ctrlCPU is the v1 controller that holds cpu.cfs_quota_us.
const ctrlCPU = "cpu"

// testControllers are the v2 controllers the tests need in a cgroup.
var testControllers = []string{"cpu", "io", "memory", "pids"}

func (c *realCgroup) uniqueDirs() []string {
	var ds []string
	for _, ctrl := range []string{ctrlCPUAcct, ctrlMemory, ctrlBlkio, ctrlCPU} {
		if d, ok := c.dirs[ctrl]; ok && !slices.Contains(ds, d) {
			ds = append(ds, d)
		}
	}
	return ds
}

// remove removes the cgroup's directories (rmdir: they hold only kernel
// files); a directory already gone is not an error.
func (c *realCgroup) remove() error {
	var errs []error
	for _, d := range c.uniqueDirs() {
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// newRealCgroup creates a cgroup with a unique name at the top of this
// machine's hierarchy (each needed v1 hierarchy), removed at cleanup, or
// skips the test. It sets no limits: see limit.
func newRealCgroup(tb testing.TB) *realCgroup {
	tb.Helper()
	if os.Geteuid() != 0 {
		skipOrFail(tb, "creating real cgroups needs root")
	}
	l, err := loadLayout(newConfig(nil))
	if err != nil {
		skipOrFail(tb, "no cgroup filesystem: %v", err)
	}
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		tb.Fatal(err)
	}
	c := &realCgroup{path: "/amf-test-" + hex.EncodeToString(rnd[:]), dirs: map[string]string{}}
	if l.useV1() {
		for _, ctrl := range v1Controllers {
			h, ok := l.v1[ctrl]
			if !ok {
				skipOrFail(tb, "cgroup v1 controller %s not mounted", ctrl)
			}
			if c.dirs[ctrl], err = h.dir(c.path); err != nil {
				skipOrFail(tb, "%v", err)
			}
		}
		if h, ok := v1CPUHierarchy(); ok {
			if d, err := h.dir(c.path); err == nil {
				c.dirs[ctrlCPU] = d
			}
		}
		if root, err := l.v1[ctrlBlkio].dir("/"); err == nil {
			if b, err := os.ReadFile(filepath.Join(root, blkioFiles[0])); err == nil {
				_, _, err := parseBlkio(b)
				c.ioAccounts = err == nil && listsDevice(b, diskOf(os.TempDir()))
			}
		}
	} else {
		c.v2 = true
		top, err := l.v2.dir("/")
		if err != nil {
			skipOrFail(tb, "%v", err)
		}
		if missing := missingControllers(filepath.Join(top, "cgroup.subtree_control")); len(missing) > 0 {
			skipOrFail(tb, "cgroup v2 controllers %v are not enabled in %s/cgroup.subtree_control", missing, top)
		}
		d, err := l.v2.dir(c.path)
		if err != nil {
			skipOrFail(tb, "%v", err)
		}
		for _, ctrl := range []string{ctrlCPUAcct, ctrlMemory, ctrlBlkio, ctrlCPU} {
			c.dirs[ctrl] = d
		}
		c.ioAccounts = onBlockDevice(os.TempDir())
	}
	c.mkdir(tb)
	return c
}

// mkdir creates the cgroup's directories, removed at cleanup.
func (c *realCgroup) mkdir(tb testing.TB) {
	tb.Helper()
	for _, d := range c.uniqueDirs() {
		if err := os.Mkdir(d, 0o755); err != nil {
			c.remove()
			tb.Fatalf("create cgroup: %v", err)
		}
	}
	tb.Cleanup(func() {
		if err := c.remove(); err != nil {
			tb.Errorf("remove test cgroup: %v", err)
		}
	})
}

// sub creates the cgroup rel below c, and the cgroups between, as the
// kubelet and the runtime do: on v2 each parent first gets the controllers
// in its cgroup.subtree_control. All are removed at cleanup, children first.
func (c *realCgroup) sub(tb testing.TB, rel string) *realCgroup {
	tb.Helper()
	parent := c
	for _, name := range strings.Split(strings.Trim(rel, "/"), "/") {
		if parent.v2 {
			ctrl := filepath.Join(parent.dirs[ctrlMemory], "cgroup.subtree_control")
			if len(missingControllers(ctrl)) > 0 {
				enable := "+" + strings.Join(testControllers, " +")
				if err := os.WriteFile(ctrl, []byte(enable), 0o644); err != nil {
					tb.Fatalf("enable controllers in %s: %v", ctrl, err)
				}
			}
		}
		child := &realCgroup{path: path.Join(parent.path, name), v2: c.v2, dirs: map[string]string{}, ioAccounts: c.ioAccounts}
		for ctrl, d := range parent.dirs {
			child.dirs[ctrl] = filepath.Join(d, name)
		}
		if _, err := os.Stat(child.dirs[ctrlMemory]); err != nil {
			child.mkdir(tb)
		}
		parent = child
	}
	return parent
}

// missingControllers lists the testControllers that a cgroup.subtree_control
// file does not enable.
func missingControllers(subtreeControl string) []string {
	b, err := os.ReadFile(subtreeControl)
	if err != nil {
		return testControllers
	}
	have := strings.Fields(string(b))
	var missing []string
	for _, c := range testControllers {
		if !slices.Contains(have, c) {
			missing = append(missing, c)
		}
	}
	return missing
}

// limit sets the memory limit cgroupLimit and, where the cpu controller is
// there, the CPU limit cpuLimit, as the kubelet does for a container with
// limits.
func (c *realCgroup) limit(tb testing.TB) {
	tb.Helper()
	write := func(dir, file, value string) {
		tb.Helper()
		if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0o644); err != nil {
			tb.Fatalf("set %s of %s to %s: %v", file, dir, value, err)
		}
	}
	if c.v2 {
		write(c.dirs[ctrlMemory], "memory.max", strconv.Itoa(cgroupLimit))
		write(c.dirs[ctrlCPU], "cpu.max", fmt.Sprintf("%d %d", cpuQuotaUsec, cpuPeriodUsec))
		c.cpuLimited = true
		return
	}
	write(c.dirs[ctrlMemory], "memory.limit_in_bytes", strconv.Itoa(cgroupLimit))
	if d, ok := c.dirs[ctrlCPU]; ok {
		write(d, "cpu.cfs_period_us", strconv.Itoa(cpuPeriodUsec))
		write(d, "cpu.cfs_quota_us", strconv.Itoa(cpuQuotaUsec))
		c.cpuLimited = true
	}
}

// asRoot returns a directory that stands for the hierarchy with c at its
// top, for WithCgroupRoot: as a node whose kubelet runs inside a cgroup (a
// kind or k3d node) shows its hierarchy to a pod that mounts /sys/fs/cgroup.
// On v2 that is c's directory; on v1 a folder of symlinks named after the
// controllers, to c's directory in each hierarchy.
func (c *realCgroup) asRoot(tb testing.TB) string {
	tb.Helper()
	if c.v2 {
		return c.dirs[ctrlMemory]
	}
	root := tb.TempDir()
	for _, ctrl := range v1Controllers {
		if err := os.Symlink(c.dirs[ctrl], filepath.Join(root, ctrl)); err != nil {
			tb.Fatal(err)
		}
	}
	return root
}

// v1CPUHierarchy finds the v1 hierarchy of the cpu controller (which the
// package does not read, so its layout leaves it out).
func v1CPUHierarchy() (hierarchy, bool) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return hierarchy{}, false
	}
	ms, err := parseMountInfo(b)
	if err != nil {
		return hierarchy{}, false
	}
	for _, m := range ms {
		if m.FSType == "cgroup" && slices.Contains(m.SuperOptions, ctrlCPU) {
			return hierarchy{mountPoint: m.MountPoint, root: m.Root}, true
		}
	}
	return hierarchy{}, false
}

// diskOf is the MAJ:MIN of the disk that holds dir's filesystem (a
// partition's whole disk, as blkio lists it), or "" when dir is on none.
func diskOf(dir string) string {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return ""
	}
	major := (st.Dev>>8)&0xfff | (st.Dev>>32)&^uint64(0xfff)
	minor := st.Dev&0xff | (st.Dev>>12)&^uint64(0xff)
	dev := fmt.Sprintf("%d:%d", major, minor)
	if major == 0 {
		return ""
	}
	sys := filepath.Join("/sys/dev/block", dev)
	if _, err := os.Stat(filepath.Join(sys, "partition")); err == nil {
		if b, err := os.ReadFile(filepath.Join(sys, "..", "dev")); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	return dev
}

// listsDevice says whether blkio statistics b have lines for device dev:
// v1 blk-throttle lists only the devices it was set up for, and on some
// kernels that is none until a limit is set on one, so a root listing
// another device (a loop device someone once limited) says nothing of the
// temp folder's disk.
func listsDevice(b []byte, dev string) bool {
	if dev == "" {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, dev+" ") {
			return true
		}
	}
	return false
}

// onBlockDevice reports whether dir is on a filesystem backed by a block
// device (tmpfs and overlay have device major 0).
func onBlockDevice(dir string) bool {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return false
	}
	major := (st.Dev>>8)&0xfff | (st.Dev>>32)&^uint64(0xfff)
	return major != 0
}

// randomHex returns n random hex digits.
func randomHex(tb testing.TB, n int) string {
	tb.Helper()
	b := make([]byte, (n+1)/2)
	if _, err := rand.Read(b); err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(b)[:n]
}

// randomUID returns a random pod UID (a version 4 UUID).
func randomUID(tb testing.TB) string {
	h := randomHex(tb, 32)
	return h[:8] + "-" + h[8:12] + "-4" + h[13:16] + "-a" + h[17:20] + "-" + h[20:]
}
