package node

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseMountInfo(t *testing.T) {
	const mi = `30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
32 30 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
33 30 0:30 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset,clone_children
34 30 0:31 /docker/abc /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
35 30 0:32 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
36 30 0:33 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
37 22 0:32 / /other/memory rw,relatime - cgroup cgroup rw,memory
38 30 0:32 / /sys/fs/cgroup/memory2 rw,relatime - cgroup cgroup rw,memory
39 30 0:34 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
`
	hs, skipped, err := parseMountInfo([]byte(mi), "/sys/fs/cgroup/")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range hs {
		got = append(got, h.mount+"="+strings.Join(h.controllers, ","))
	}
	want := []string{"/sys/fs/cgroup/cpu,cpuacct=cpu,cpuacct", "/sys/fs/cgroup/cpuset=cpuset", "/sys/fs/cgroup/memory=memory", "/sys/fs/cgroup/pids=pids"}
	if !slices.Equal(got, want) {
		t.Errorf("hierarchies %q, want %q", got, want)
	}
	if len(skipped) != 3 {
		t.Errorf("skipped %q, want blkio (sub-tree), systemd (named), unified (cgroup2)", skipped)
	}
	if unescapeMount(`/a\040b`) != "/a b" {
		t.Error("mountinfo escapes")
	}
}

func TestParseOOMKills(t *testing.T) {
	n, err := parseOOMKills([]byte("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n"))
	if err != nil || n != 3 {
		t.Errorf("%d %v", n, err)
	}
	if _, err := parseOOMKills([]byte("oom_kill_disable 0\n")); err == nil {
		t.Error("no oom_kill line accepted")
	}
}

// realCgroups skips unless this machine has writable cgroup v1 hierarchies,
// and returns them with a fresh cgroup path that is removed at the end.
func realCgroups(t *testing.T) (*cgroupFS, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups")
	}
	cg, err := discoverCgroups("/sys/fs/cgroup", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Skipf("no cgroup v1 here: %v", err)
	}
	p := fmt.Sprintf("/amf-lab-node-test-%d-%s", os.Getpid(), newContainerID()[:8])
	t.Cleanup(func() {
		if err := cg.remove(p); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return cg, p
}

// TestSpawn checks that a process is in its cgroups from its first
// instruction (it reads its own /proc/self/cgroup at once), that the node's
// thread went back home, and that killAll and remove clean up.
func TestSpawn(t *testing.T) {
	cg, p := realCgroups(t)
	if err := cg.create(p, limits{memory: 64 << 20, cpuShares: 256, cpuQuota: 50000}); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{
		"memory/" + p + "/memory.limit_in_bytes": "67108864",
		"cpu/" + p + "/cpu.shares":               "256",
		"cpu/" + p + "/cpu.cfs_quota_us":         "50000",
		"cpu/" + p + "/cpu.cfs_period_us":        "100000",
	} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", strings.SplitN(file, "/", 2)[0])); err != nil {
			continue // not on this machine
		}
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", file))
		if err != nil || strings.TrimSpace(string(b)) != want {
			t.Errorf("%s = %q (%v), want %s", file, b, err, want)
		}
	}
	before, _ := os.ReadFile("/proc/self/cgroup")

	var out bytes.Buffer
	cmd := exec.Command("/bin/cat", "/proc/self/cgroup")
	cmd.Stdout = &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: &syscall.Credential{Uid: 65532, Gid: 65532, Groups: []uint32{}}}
	if err := cg.spawn(cmd, p); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	for _, h := range cg.hs {
		line := strings.Join(h.controllers, ",") + ":" + p + "\n"
		if !strings.Contains(out.String(), line) {
			t.Errorf("the child's cgroups lack %q:\n%s", line, out.String())
		}
	}
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		b, _ := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "cgroup"))
		if strings.Contains(string(b), p) {
			t.Errorf("thread %s of the node stayed in %s:\n%s", task.Name(), p, b)
		}
	}
	if after, _ := os.ReadFile("/proc/self/cgroup"); !bytes.Equal(before, after) {
		t.Errorf("the node's cgroups changed:\n%s\n->\n%s", before, after)
	}

	// A process group that ignores SIGTERM, with a child: killAll ends both.
	cmd = exec.Command("/bin/sh", "-c", "trap '' TERM; sleep 1000 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cg.spawn(cmd, p); err != nil {
		t.Fatal(err)
	}
	waitProcs(t, cg, p, 2)
	if err := cg.killAll(p, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil {
		t.Error("the shell was not killed")
	}
	if err := cg.remove(p); err != nil {
		t.Fatal(err)
	}
	if cg.exists(p) {
		t.Error("cgroup still there")
	}
	if err := cg.spawn(exec.Command("/bin/true"), p); err == nil {
		t.Error("spawn into a removed cgroup worked")
	}
}

// waitProcs waits until cgroup p has n processes (a fork takes a moment).
func waitProcs(t *testing.T, cg *cgroupFS, p string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		pids, _ := cg.procs(p)
		if len(pids) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cgroup %s has processes %v, want %d", p, pids, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestOOMWatch: the kernel's OOM notification arrives and the oom_kill
// counter confirms it, for a shell whose pipeline outgrows the limit.
func TestOOMWatch(t *testing.T) {
	cg, p := realCgroups(t)
	if err := cg.create(p, limits{memory: 16 << 20, cpuShares: 2}); err != nil {
		t.Fatal(err)
	}
	w, err := cg.watchOOM(p)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	if k, err := w.kills(); err != nil || k != 0 {
		t.Fatalf("kills before: %d %v", k, err)
	}
	cmd := exec.Command("/bin/sh", "-c", "head -c 200000000 /dev/zero | tail; sleep 1000")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cg.spawn(cmd, p); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cg.killAll(p, 5*time.Second); _ = cmd.Wait() }()
	t0 := time.Now()
	got := make(chan error, 1)
	go func() { got <- w.wait() }()
	defer func() { t.Logf("oom after %v", time.Since(t0)) }()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no OOM notification in 30 s")
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		k, err := w.kills()
		if err != nil {
			t.Fatal(err)
		}
		if k > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("oom_kill stayed 0")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Without oom.group the shell lives on (sleep): the node's group kill is needed.
	pids, _ := cg.procs(p)
	if len(pids) == 0 {
		t.Error("nothing left after the kernel's kill: the test does not exercise the group kill")
	}
}
