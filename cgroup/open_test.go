package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func mustOpen(t *testing.T, p string, opts ...Option) Reader {
	t.Helper()
	r, err := Open(p, opts...)
	if err != nil {
		t.Fatalf("Open(%q): %v", p, err)
	}
	return r
}

func mustRead(t *testing.T, r Reader) Stats {
	t.Helper()
	s, err := r.Read(t.Context())
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	return s
}

func TestOpenReadsRecordedContainers(t *testing.T) {
	brokerV2 := Stats{Time: testTime, CPUSeconds: 123.456789, MemoryBytes: brokerMemory, MemoryLimitBytes: brokerLimit,
		DiskBytes: brokerV2Disk, NetworkBytes: recordedNet, HasNetwork: true}
	brokerV1 := Stats{Time: testTime, CPUSeconds: 123.456789012, MemoryBytes: brokerMemory, MemoryLimitBytes: brokerLimit,
		DiskBytes: brokerV1Disk, NetworkBytes: recordedNet, HasNetwork: true}
	v1Pod := "/kubepods/burstable/pod" + burstableUID
	tests := []struct {
		name string
		root string
		path string
		pid  int
		want Stats
	}{
		{name: "v2 by hierarchy path", root: v2Root, path: brokerV2Path, pid: recordedNetPID, want: brokerV2},
		{name: "v2 by relative directory", root: v2Root, path: filepath.Join(v2Root, brokerV2Path), pid: recordedNetPID, want: brokerV2},
		{name: "v2 hierarchy path without leading slash", root: v2Root, path: brokerV2Path[1:], pid: recordedNetPID, want: brokerV2},
		{name: "v2 without PID has no network", root: v2Root, path: brokerV2Path,
			want: Stats{Time: testTime, CPUSeconds: 123.456789, MemoryBytes: brokerMemory, MemoryLimitBytes: brokerLimit, DiskBytes: brokerV2Disk}},
		{name: "v2 memory.max max is no limit and empty io.stat is zero", root: v2Root, path: "/kubepods/burstable/pod" + burstableUID + "/" + pauseID,
			want: Stats{Time: testTime, CPUSeconds: 0.012, MemoryBytes: 348160}},
		{name: "v2 systemd scope", root: systemdRoot, path: "/kubepods.slice/kubepods-pod" + strings.ReplaceAll(guaranteedUID, "-", "_") + ".slice/cri-containerd-" + guaranteedID + ".scope",
			want: Stats{Time: testTime, CPUSeconds: 5, MemoryBytes: 20971520, MemoryLimitBytes: brokerLimit, DiskBytes: brokerV2Disk}},
		{name: "v1 by hierarchy path through combined cpu,cpuacct", root: v1Root, path: v1Pod + "/" + brokerID, pid: recordedNetPID, want: brokerV1},
		{name: "v1 by directory under the memory mount", root: v1Root, path: filepath.Join(v1Root, "memory", v1Pod, brokerID), pid: recordedNetPID, want: brokerV1},
		{name: "v1 by directory under the combined mount", root: v1Root, path: filepath.Join(v1Root, "cpu,cpuacct", v1Pod, brokerID), pid: recordedNetPID, want: brokerV1},
		{name: "v1 blkio falls back to io_service_bytes_recursive", root: v1Root, path: v1Pod + "/" + sidecarID,
			want: Stats{Time: testTime, CPUSeconds: 2.345678, MemoryBytes: 9437184, MemoryLimitBytes: 32 << 20, DiskBytes: 4096 + 40960}},
		{name: "v1 blkio falls back to non-recursive files and no-limit is 0", root: v1Root, path: v1Pod + "/" + pauseID,
			want: Stats{Time: testTime, CPUSeconds: 0.012, MemoryBytes: 348160, DiskBytes: 512}},
		{name: "v1 blkio without entries is zero", root: v1Root, path: "/",
			want: Stats{Time: testTime, CPUSeconds: 99.999999999, MemoryBytes: 2000000000}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := []Option{WithCgroupRoot(tc.root), WithProcRoot(procRoot), WithClock(testClock)}
			if tc.pid != 0 {
				opts = append(opts, WithPID(tc.pid))
			}
			got := mustRead(t, mustOpen(t, tc.path, opts...))
			if got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestOpenFindsMountsInMountinfo(t *testing.T) {
	abs, err := filepath.Abs(v1Root)
	if err != nil {
		t.Fatal(err)
	}
	v2abs, err := filepath.Abs(v2Root)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		mountinfo string
		want      float64 // CPU seconds of the broker
	}{
		{name: "v1 with combined cpu,cpuacct", want: 123.456789012, mountinfo: fmt.Sprintf(
			"34 25 0:29 / %[1]s/cpu,cpuacct rw,nosuid shared:15 - cgroup cgroup rw,cpu,cpuacct\n"+
				"35 25 0:30 / %[1]s/memory rw,nosuid shared:16 - cgroup cgroup rw,memory\n"+
				"36 25 0:31 / %[1]s/blkio rw,nosuid shared:17 - cgroup cgroup rw,blkio\n"+
				"37 25 0:32 / %[1]s/unified rw,nosuid shared:18 - cgroup2 cgroup2 rw\n", abs)},
		{name: "v1 bind-mounted from inside the hierarchy", want: 123.456789012, mountinfo: fmt.Sprintf(
			"34 25 0:29 /kubepods %[1]s/cpu,cpuacct/kubepods rw - cgroup cgroup rw,cpu,cpuacct\n"+
				"35 25 0:30 /kubepods %[1]s/memory/kubepods rw - cgroup cgroup rw,memory\n"+
				"36 25 0:31 /kubepods %[1]s/blkio/kubepods rw - cgroup cgroup rw,blkio\n", abs)},
		{name: "v2", want: 123.456789, mountinfo: fmt.Sprintf("40 30 0:37 / %s rw,relatime - cgroup2 cgroup2 rw,nsdelegate\n", v2abs)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			proc := writeTree(t, map[string]string{"self/mountinfo": tc.mountinfo})
			s := mustRead(t, mustOpen(t, brokerV2Path, WithProcRoot(proc)))
			if s.CPUSeconds != tc.want || s.MemoryBytes != brokerMemory {
				t.Errorf("got %+v, want CPU %v and memory %v", s, tc.want, brokerMemory)
			}
		})
	}
}

func TestLayoutFromMounts(t *testing.T) {
	parse := func(s string) []mountInfo {
		ms, err := parseMountInfo([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return ms
	}
	t.Run("hybrid host reads v1", func(t *testing.T) {
		l := layoutFromMounts(parse(
			"31 30 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"+
				"32 30 0:29 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct\n"+
				"34 30 0:31 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"+
				"37 30 0:34 / /sys/fs/cgroup/blkio rw - cgroup cgroup rw,blkio\n"+
				"39 30 0:36 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n"+
				"40 30 0:37 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"), DefaultCgroupRoot)
		if !l.useV1() || l.v1[ctrlCPUAcct].mountPoint != "/sys/fs/cgroup/cpuacct" || l.v1[ctrlBlkio].mountPoint != "/sys/fs/cgroup/blkio" {
			t.Fatalf("layout %+v", l)
		}
	})
	t.Run("container prefers its own cgroup2 mount over the host's", func(t *testing.T) {
		l := layoutFromMounts(parse(
			"1501 1400 0:26 /../../.. /host/sys/fs/cgroup ro master:9 - cgroup2 cgroup2 rw\n"+
				"1500 1400 0:26 / /sys/fs/cgroup ro - cgroup2 cgroup rw,nsdelegate\n"), DefaultCgroupRoot)
		if l.useV1() || l.v2 == nil || l.v2.mountPoint != "/sys/fs/cgroup" {
			t.Fatalf("layout %+v", l)
		}
	})
	t.Run("no cgroup mounts", func(t *testing.T) {
		l := layoutFromMounts(parse("26 1 254:0 / / rw - ext4 /dev/vda rw\n"), DefaultCgroupRoot)
		if l.useV1() || l.v2 != nil {
			t.Fatalf("layout %+v", l)
		}
	})
}

func TestHierarchyDir(t *testing.T) {
	h := hierarchy{mountPoint: "/sys/fs/cgroup/memory", root: "/kubepods/pod1/abc"}
	tests := []struct{ in, want, err string }{
		{in: "/kubepods/pod1/abc", want: "/sys/fs/cgroup/memory"},
		{in: "/kubepods/pod1/abc/sub", want: "/sys/fs/cgroup/memory/sub"},
		{in: "/kubepods/pod1/abcd", err: "outside"},
		{in: "/kubepods/pod1/abc/../../x", err: "outside"},
		{in: "kubepods/pod1/abc/sub", want: "/sys/fs/cgroup/memory/sub"},
		{in: "/../abc", err: "outside this process's cgroup namespace"},
		{in: "/..", err: "outside this process's cgroup namespace"},
		{in: "/x/../../abc", err: "outside this process's cgroup namespace"},
	}
	for _, tc := range tests {
		got, err := h.dir(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("dir(%q) = %q, %v; want error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("dir(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestOpenErrorsSayWhatIsMissing(t *testing.T) {
	v2NoMemory := writeTree(t, map[string]string{
		"cgroup.controllers":   "cpu io\n",
		"c/cgroup.controllers": "cpu io\n",
		"c/cpu.stat":           "usage_usec 1\n",
		"c/io.stat":            "",
	})
	badIO := writeTree(t, v2Files("c", "1", "1", "max", "8:0 rbytes=1 wbytes=1\n8:0 rbytes=x\n"))
	if err := os.WriteFile(filepath.Join(badIO, "cgroup.controllers"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		root     string
		path     string
		contains []string
		is       error
	}{
		{name: "missing directory", root: v2Root, path: "/kubepods/nope", contains: []string{"does not exist"}, is: fs.ErrNotExist},
		{name: "memory controller not enabled", root: v2NoMemory, path: "/c", contains: []string{"memory.current", "memory controller is not enabled"}, is: fs.ErrNotExist},
		{name: "malformed file names file and line", root: badIO, path: "/c", contains: []string{filepath.Join(badIO, "c", "io.stat") + ": line 2: "}},
		{name: "no cgroup filesystem", root: t.TempDir(), path: "/c", contains: []string{"no cgroup hierarchy", "mount the host /sys/fs/cgroup"}},
		{name: "missing root", root: filepath.Join(t.TempDir(), "nope"), path: "/c", contains: []string{"does not exist", "hostPath"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Open(tc.path, WithCgroupRoot(tc.root))
			if err == nil {
				t.Fatalf("Open = %v, want an error", r)
			}
			for _, c := range tc.contains {
				if !strings.Contains(err.Error(), c) {
					t.Errorf("error %q does not contain %q", err, c)
				}
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v is not %v", err, tc.is)
			}
			if errors.Is(err, ErrGone) {
				t.Errorf("error %v should not be ErrGone at open time", err)
			}
		})
	}
}

func TestReadAfterRemovalIsErrGone(t *testing.T) {
	tests := []struct {
		name   string
		remove func(root, proc string) string // returns the path removed
	}{
		{name: "cgroup directory removed", remove: func(root, _ string) string { return filepath.Join(root, "c") }},
		{name: "process exited", remove: func(_, proc string) string { return filepath.Join(proc, "77") }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := writeTree(t, v2Files("c", "5", "10", "max", ""))
			if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			netdev, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(recordedNetPID), "net", "dev"))
			if err != nil {
				t.Fatal(err)
			}
			proc := writeTree(t, map[string]string{"77/net/dev": string(netdev)})
			r := mustOpen(t, "/c", WithCgroupRoot(root), WithProcRoot(proc), WithPID(77))
			mustRead(t, r)
			gone := tc.remove(root, proc)
			if err := os.RemoveAll(gone); err != nil {
				t.Fatal(err)
			}
			_, err = r.Read(t.Context())
			if !errors.Is(err, ErrGone) {
				t.Fatalf("Read after removing %s: %v, want ErrGone", gone, err)
			}
			if !strings.Contains(err.Error(), gone) {
				t.Errorf("error %q does not name %s", err, gone)
			}
		})
	}
}

func TestReadMalformedFileIsNotErrGone(t *testing.T) {
	root := writeTree(t, v2Files("c", "5", "10", "max", ""))
	if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := mustOpen(t, "/c", WithCgroupRoot(root))
	cpuStat := filepath.Join(root, "c", "cpu.stat")
	if err := os.WriteFile(cpuStat, []byte("usage_usec 5\nuser_usec -1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := r.Read(t.Context())
	if err == nil || errors.Is(err, ErrGone) || !strings.Contains(err.Error(), cpuStat+": line 2:") {
		t.Fatalf("Read = %v, want a syntax error naming %s line 2", err, cpuStat)
	}
}

func TestReadHonoursCancelledContext(t *testing.T) {
	r := mustOpen(t, brokerV2Path, WithCgroupRoot(v2Root))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := r.Read(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Read = %v, want context.Canceled", err)
	}
}

// The first blkio file with entries is kept, so the counter does not jump
// when a file earlier in the fallback order gets entries later.
func TestBlkioSourceStaysOnceChosen(t *testing.T) {
	files := map[string]string{
		"cpuacct/c/cpuacct.usage":                           "1\n",
		"memory/c/memory.usage_in_bytes":                    "1\n",
		"memory/c/memory.limit_in_bytes":                    "9223372036854771712\n",
		"blkio/c/blkio.throttle.io_service_bytes_recursive": "Total 0\n",
		"blkio/c/blkio.io_service_bytes_recursive":          "Total 0\n",
	}
	root := writeTree(t, files)
	r := mustOpen(t, "/c", WithCgroupRoot(root))
	if s := mustRead(t, r); s.DiskBytes != 0 {
		t.Fatalf("disk = %v with no entries, want 0", s.DiskBytes)
	}
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(root, "blkio", "c", name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("blkio.io_service_bytes_recursive", "8:0 Read 10\n8:0 Write 5\nTotal 15\n")
	if s := mustRead(t, r); s.DiskBytes != 15 {
		t.Fatalf("disk = %v, want 15 from the fallback file", s.DiskBytes)
	}
	write("blkio.throttle.io_service_bytes_recursive", "8:0 Read 1000\n8:0 Write 0\nTotal 1000\n")
	write("blkio.io_service_bytes_recursive", "8:0 Read 20\n8:0 Write 5\nTotal 25\n")
	if s := mustRead(t, r); s.DiskBytes != 25 {
		t.Fatalf("disk = %v, want 25: the source must not switch", s.DiskBytes)
	}
}

func TestForPIDRecorded(t *testing.T) {
	tests := []struct {
		name string
		pid  int
		root string
		want Stats
	}{
		{name: "v2 line", pid: recordedNetPID, root: v2Root, want: Stats{Time: testTime, CPUSeconds: 123.456789, MemoryBytes: brokerMemory,
			MemoryLimitBytes: brokerLimit, DiskBytes: brokerV2Disk, NetworkBytes: recordedNet, HasNetwork: true}},
		{name: "v1 lines with combined controllers and name=systemd", pid: 4343, root: v1Root, want: Stats{Time: testTime, CPUSeconds: 123.456789012,
			MemoryBytes: brokerMemory, MemoryLimitBytes: brokerLimit, DiskBytes: brokerV1Disk, NetworkBytes: recordedNet, HasNetwork: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ForPID(tc.pid, WithCgroupRoot(tc.root), WithProcRoot(procRoot), WithClock(testClock))
			if err != nil {
				t.Fatal(err)
			}
			if got := mustRead(t, r); got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// A process outside the caller's cgroup namespace: /proc/<pid>/cgroup
// shows its cgroup relative to the namespace's root, as the sidecar sees
// the broker's in a pod (found on a real cgroup v2 kernel, make
// test-cgroup2). "/../<id>" used to become /<id> under the namespace's
// mount (a wrong directory, reported as a restarted container) and "/.."
// the namespace's own cgroup, read as if it were the target's.
func TestForPIDOutsideTheCgroupNamespace(t *testing.T) {
	// The sidecar's view: its own cgroup, the namespace's root, is all it sees.
	root := writeTree(t, v2Files("", "5", "10", "max", ""))
	tests := []struct{ name, cgroup string }{
		{name: "a sibling container", cgroup: "0::/../" + brokerID + "\n"},
		{name: "the pod cgroup above", cgroup: "0::/..\n"},
		{name: "a systemd scope two levels up", cgroup: "0::/../../kubepods-burstable-pod1.slice/cri-containerd-" + brokerID + ".scope\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			proc := writeTree(t, map[string]string{"5/cgroup": tc.cgroup})
			r, err := ForPID(5, WithProcRoot(proc), WithCgroupRoot(root))
			if err == nil {
				t.Fatalf("ForPID read %v, want an error", r)
			}
			for _, want := range []string{"outside this process's cgroup namespace", "WithCgroupRoot", "PodQuery"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

func TestForPIDErrors(t *testing.T) {
	if _, err := ForPID(0); err == nil {
		t.Error("ForPID(0) succeeded")
	}
	_, err := ForPID(99999999, WithProcRoot(procRoot), WithCgroupRoot(v2Root))
	if !errors.Is(err, ErrGone) {
		t.Errorf("ForPID of a missing process = %v, want ErrGone", err)
	}
	proc := writeTree(t, map[string]string{"5/cgroup": "0::/kubepods\n9:memory\n"})
	_, err = ForPID(5, WithProcRoot(proc), WithCgroupRoot(v2Root))
	if err == nil || !strings.Contains(err.Error(), filepath.Join(proc, "5", "cgroup")+": line 2:") {
		t.Errorf("ForPID with a malformed cgroup file = %v, want the file and line", err)
	}
}

// A process in the real v2 root cgroup (no memory.current there) is read
// through gopsutil. The proc root is a copy whose <pid>/cgroup says "0::/"
// and whose other files are the test process's own.
func TestForPIDRootCgroupUsesProcess(t *testing.T) {
	pid := os.Getpid()
	self := filepath.Join("/proc", strconv.Itoa(pid))
	if _, err := os.Stat(filepath.Join(self, "io")); err != nil {
		t.Skipf("needs /proc/<pid>/io: %v", err)
	}
	proc := writeTree(t, map[string]string{strconv.Itoa(pid) + "/cgroup": "0::/\n", "meminfo": "MemTotal: 1024 kB\n"})
	for _, name := range []string{"stat", "statm", "status", "io", "net"} {
		if err := os.Symlink(filepath.Join(self, name), filepath.Join(proc, strconv.Itoa(pid), name)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := ForPID(pid, WithProcRoot(proc), WithCgroupRoot(v2Root))
	if err != nil {
		t.Fatal(err)
	}
	if d := fmt.Sprint(r); !strings.Contains(d, "from the process") {
		t.Errorf("description %q does not say the figures come from the process", d)
	}
	// A test binary that has just started may not have used a clock tick of
	// CPU yet: burn some until the kernel counts it.
	s := readUntil(t, r, func(s Stats) bool {
		for deadline := time.Now().Add(20 * time.Millisecond); time.Now().Before(deadline); {
		}
		return s.CPUSeconds > 0
	})
	if s.MemoryBytes <= 0 || s.MemoryLimitBytes != 0 || s.DiskBytes < 0 || !s.HasNetwork {
		t.Errorf("stats %+v: want CPU and RSS > 0, no limit, network", s)
	}
	if ref, err := r.MemoryReference(); err != nil || ref.Source != RefMachineMemory || ref.Bytes != 1<<20 {
		t.Errorf("memory reference %+v, %v: want the machine's 1 MiB", ref, err)
	}
}
