package cgroup

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// The tests in this file create real cgroup v1 cgroups, as root, and run a
// child process (this test binary, re-executed) inside them.

const (
	childEnv     = "AMF_CGROUP_TEST_CHILD"     // "1": run as the child; childIdle, childFind: see kubelet_real_test.go
	childDirEnv  = "AMF_CGROUP_TEST_CHILD_DIR" // where the child writes its file
	childAlloc   = 24 << 20                    // bytes the child allocates and touches
	childWrite   = 4 << 20                     // bytes the child writes and fsyncs
	childTimeout = 30 * time.Second            // bound on waiting for the child or a counter
)

// cgroupLimit is the memory.limit_in_bytes set on the test cgroup: 64 MiB,
// or 1 GiB under the race detector.
var cgroupLimit = func() int {
	if raceEnabled {
		return 1 << 30
	}
	return 64 << 20
}()

func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "1":
		os.Exit(runChild())
	case childIdle:
		os.Exit(runIdleChild())
	case childFind:
		os.Exit(runFindChild())
	}
	os.Exit(m.Run())
}

// runChild waits for "go" on stdin (sent once it is in the cgroup, so what
// it allocates is charged there), allocates and touches childAlloc bytes,
// writes childWrite bytes to a file with fsync, says "ready" on stdout, then
// burns CPU until killed.
func runChild() int {
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil || line != "go\n" {
		fmt.Fprintln(os.Stderr, "child: no go:", line, err)
		return 2
	}
	mem := make([]byte, childAlloc)
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 1
	}
	how, err := writeFile(filepath.Join(os.Getenv(childDirEnv), "io"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	fmt.Println("ready", how)
	sum := 0
	for {
		for i := 0; i < len(mem); i += 4096 {
			sum += int(mem[i])
		}
		runtime.KeepAlive(sum)
	}
}

// writeFile writes childWrite bytes to p and syncs them. It uses O_DIRECT
// where the filesystem allows: cgroup v1 does not support writeback
// attribution, so buffered writes are flushed on behalf of the root cgroup
// and only direct I/O is charged to the writer's blkio cgroup. It returns
// "direct" or "buffered".
func writeFile(p string) (string, error) {
	buf := alignedBuffer(childWrite, 4096)
	for i := range buf {
		buf[i] = byte(i)
	}
	how := "direct"
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|syscall.O_DIRECT, 0o600)
	if err != nil { // tmpfs and some others refuse O_DIRECT
		how = "buffered"
		if f, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o600); err != nil {
			return "", err
		}
	}
	defer f.Close()
	if _, err := f.Write(buf); err != nil {
		return "", err
	}
	return how, f.Sync()
}

// alignedBuffer returns n bytes starting at a multiple of align, as
// O_DIRECT requires.
func alignedBuffer(n, align int) []byte {
	b := make([]byte, n+align)
	off := 0
	if r := int(uintptr(unsafe.Pointer(&b[0])) % uintptr(align)); r != 0 {
		off = align - r
	}
	return b[off : off+n]
}

// realCgroup is a cgroup created in the cpuacct, memory and blkio v1
// hierarchies of this machine.
type realCgroup struct {
	path string            // hierarchy path, "/amf-test-<random>"
	dirs map[string]string // controller → directory
	// blkioAccounts says whether this kernel accounts block I/O in v1 blkio
	// at all: some (VMs with blk-cgroup statistics off) show only "Total 0"
	// even in the root cgroup.
	blkioAccounts bool
}

func (c *realCgroup) uniqueDirs() []string {
	var ds []string
	for _, ctrl := range v1Controllers {
		if d := c.dirs[ctrl]; !slices.Contains(ds, d) {
			ds = append(ds, d)
		}
	}
	return ds
}

// remove removes the cgroup directories (rmdir: they hold only kernel files).
func (c *realCgroup) remove() error {
	var errs []error
	for _, d := range c.uniqueDirs() {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// newRealV1Cgroup creates a cgroup with a unique name at the top of each
// needed v1 hierarchy, removed at cleanup, or skips the test.
func newRealV1Cgroup(tb testing.TB) *realCgroup {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("skip: creating real cgroups needs root")
	}
	l, err := loadLayout(newConfig(nil))
	if err != nil || !l.useV1() {
		tb.Skipf("skip: no cgroup v1 controllers mounted (%v)", err)
	}
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		tb.Fatal(err)
	}
	c := &realCgroup{path: "/amf-test-" + hex.EncodeToString(rnd[:]), dirs: map[string]string{}}
	for _, ctrl := range v1Controllers {
		h, ok := l.v1[ctrl]
		if !ok {
			tb.Skipf("skip: cgroup v1 controller %s not mounted", ctrl)
		}
		d, err := h.dir(c.path)
		if err != nil {
			tb.Skipf("skip: %v", err)
		}
		c.dirs[ctrl] = d
	}
	if root, err := l.v1[ctrlBlkio].dir("/"); err == nil {
		if b, err := os.ReadFile(filepath.Join(root, blkioFiles[0])); err == nil {
			_, n, err := parseBlkio(b)
			c.blkioAccounts = err == nil && n > 0
		}
	}
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
	if err := os.WriteFile(filepath.Join(c.dirs[ctrlMemory], "memory.limit_in_bytes"), []byte(strconv.Itoa(cgroupLimit)), 0o644); err != nil {
		tb.Fatalf("set memory limit: %v", err)
	}
	return c
}

// child is the re-executed test binary running in a cgroup.
type child struct {
	pid    int
	stop   func() // kills and reaps it; safe to call more than once
	direct bool   // it wrote its file with O_DIRECT, which v1 blkio charges to it
}

// startChild starts the child, moves it into c and waits until it says it
// has allocated its memory and written its file.
func startChild(t *testing.T, c *realCgroup) *child {
	t.Helper()
	ch, line := spawnInCgroups(t, os.Args[0], c.uniqueDirs(), childEnv+"=1", childDirEnv+"="+t.TempDir())
	word, rest, _ := strings.Cut(line, " ")
	if word != "ready" {
		t.Fatalf("child said %q", line)
	}
	ch.direct = rest == "direct"
	return ch
}

// spawnInCgroups starts the test binary (through exe, a path to it) as a
// child with env added, moves it into the cgroup directories dirs, tells it
// to go and returns its first line of output, without the newline.
func spawnInCgroups(t *testing.T, exe string, dirs []string, env ...string) (*child, string) {
	t.Helper()
	// AMF_TEST_EXEC_WRAPPER runs the child under an emulator: make test-arm64 sets
	// it to qemu-aarch64-static, since executing an arm64 binary from an emulated
	// one needs binfmt_misc, which this machine may not have.
	name, args := exe, []string{"-test.run=^$"}
	if w := os.Getenv("AMF_TEST_EXEC_WRAPPER"); w != "" {
		name, args = w, append([]string{exe}, args...)
	}
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cmd.Process.Kill()
			cmd.Wait()
		})
	}
	t.Cleanup(stop)
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
			t.Fatalf("move child into %s: %v", d, err)
		}
	}
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	first := make(chan string, 1)
	go func() {
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil {
			line = fmt.Sprintf("(no line: %v)", err)
		}
		first <- strings.TrimSpace(line)
	}()
	select {
	case line := <-first:
		return &child{pid: cmd.Process.Pid, stop: stop}, line
	case <-time.After(childTimeout):
		t.Fatal("child said nothing in time")
	case <-t.Context().Done():
		t.Fatal(t.Context().Err())
	}
	return nil, ""
}

// readUntil reads until ok accepts a reading or childTimeout passes. The
// counters move with the child's CPU use, which the kernel accounts at
// scheduler ticks, so the test polls the event rather than sleeping a guess.
func readUntil(t *testing.T, r Reader, ok func(Stats) bool) Stats {
	t.Helper()
	deadline := time.Now().Add(childTimeout)
	for {
		s := mustRead(t, r)
		if ok(s) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("no such reading within %v; last %+v", childTimeout, s)
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		}
	}
}

func checkChildStats(t *testing.T, c *realCgroup, ch *child, s Stats) {
	t.Helper()
	if s.MemoryBytes < childAlloc {
		t.Errorf("memory %v < the %d bytes the child touched", s.MemoryBytes, childAlloc)
	}
	if s.MemoryLimitBytes != float64(cgroupLimit) {
		t.Errorf("limit %v, want %d", s.MemoryLimitBytes, cgroupLimit)
	}
	if !s.HasNetwork || s.NetworkBytes < 0 {
		t.Errorf("network %v (has %v), want a reading", s.NetworkBytes, s.HasNetwork)
	}
	if s.CPUSeconds <= 0 {
		t.Errorf("CPU %v, want > 0", s.CPUSeconds)
	}
	switch {
	case !c.blkioAccounts:
		t.Logf("this kernel accounts no block I/O in v1 blkio (the root shows none); disk = %v", s.DiskBytes)
	case !ch.direct:
		// A temp dir on tmpfs does no block I/O at all.
		t.Logf("the child could not use O_DIRECT in its temp dir; disk = %v", s.DiskBytes)
	case s.DiskBytes < childWrite:
		t.Errorf("disk %v < the %d bytes the child wrote with O_DIRECT", s.DiskBytes, childWrite)
	}
}

func TestV1ReaderOnRealCgroup(t *testing.T) {
	c := newRealV1Cgroup(t)
	ch := startChild(t, c)

	byDir := mustOpen(t, c.dirs[ctrlMemory], WithPID(ch.pid))
	byPath := mustOpen(t, c.path, WithPID(ch.pid))
	t.Logf("reader: %v", byDir)
	for _, r := range []Reader{byDir, byPath} {
		s1 := mustRead(t, r)
		checkChildStats(t, c, ch, s1)
		s2 := readUntil(t, r, func(s Stats) bool { return s.CPUSeconds > s1.CPUSeconds })
		if !s2.Time.After(s1.Time) && !s2.Time.Equal(s1.Time) {
			t.Errorf("time went back: %v then %v", s1.Time, s2.Time)
		}
	}

	ch.stop()
	_, err := byDir.Read(t.Context())
	if !errors.Is(err, ErrGone) || !strings.Contains(err.Error(), "/"+strconv.Itoa(ch.pid)+"/") {
		t.Errorf("Read after the process exited = %v, want ErrGone naming /proc/%d", err, ch.pid)
	}
	if err := c.remove(); err != nil {
		t.Fatal(err)
	}
	for _, r := range []Reader{byDir, byPath} {
		_, err := r.Read(t.Context())
		if !errors.Is(err, ErrGone) || !strings.Contains(err.Error(), c.path) {
			t.Errorf("Read after rmdir = %v, want ErrGone naming %s", err, c.path)
		}
	}
}

func TestForPIDOnRealChild(t *testing.T) {
	c := newRealV1Cgroup(t)
	ch := startChild(t, c)
	r, err := ForPID(ch.pid)
	if err != nil {
		t.Fatal(err)
	}
	if d := fmt.Sprint(r); strings.Contains(d, "from the process") || !strings.Contains(d, c.dirs[ctrlMemory]) {
		t.Errorf("description %q: want every field from the cgroup %s", d, c.path)
	}
	s1 := mustRead(t, r)
	checkChildStats(t, c, ch, s1)
	readUntil(t, r, func(s Stats) bool { return s.CPUSeconds > s1.CPUSeconds })
	ch.stop()
	if _, err := r.Read(t.Context()); !errors.Is(err, ErrGone) {
		t.Errorf("Read after the process exited = %v, want ErrGone", err)
	}
}

// The test process itself: each v1 controller at "/" is the root cgroup,
// whose counters describe the whole host, so those fields come from the
// process through gopsutil.
func TestForPIDOnTestProcess(t *testing.T) {
	if os.Getenv("AMF_TEST_EXEC_WRAPPER") != "" {
		// qemu-user answers /proc/self/stat itself, with CPU times of 0; the
		// native run covers this test, the child tests cover the emulated one.
		t.Skip("running under an emulator, which fakes this process's /proc/self/stat")
	}
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Skipf("skip: %v", err)
	}
	lines, err := parseProcCgroup(b)
	if err != nil {
		t.Fatal(err)
	}
	l, err := loadLayout(newConfig(nil))
	if err != nil || !l.useV1() {
		t.Skipf("skip: no cgroup v1 controllers mounted (%v)", err)
	}
	r, err := ForPID(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	desc := fmt.Sprint(r)
	t.Logf("reader: %s", desc)
	for _, ctrl := range v1Controllers {
		p, _ := v1Path(lines, ctrl)
		if got, want := strings.Contains(desc, ctrl+" from the process"), p == "/"; got != want {
			t.Errorf("%s at %q: from the process = %v, want %v (%s)", ctrl, p, got, want, desc)
		}
	}
	s1 := mustRead(t, r)
	if s1.CPUSeconds <= 0 || s1.MemoryBytes <= 0 || !s1.HasNetwork {
		t.Errorf("stats %+v: want CPU, memory and network", s1)
	}
	// Burn a little CPU ourselves so the counter must move.
	readUntil(t, r, func(s Stats) bool {
		for deadline := time.Now().Add(20 * time.Millisecond); time.Now().Before(deadline); {
		}
		return s.CPUSeconds > s1.CPUSeconds
	})
}

// Forcing every v1 controller to "/" (a copy of /proc where this process's
// cgroup file says so) makes all three fields come from gopsutil.
func TestForPIDRootCgroupV1UsesProcess(t *testing.T) {
	l, err := loadLayout(newConfig(nil))
	if err != nil || !l.useV1() {
		t.Skipf("skip: no cgroup v1 controllers mounted (%v)", err)
	}
	pid := strconv.Itoa(os.Getpid())
	proc := writeTree(t, map[string]string{pid + "/cgroup": "4:memory:/\n3:blkio:/\n2:cpu,cpuacct:/\n0::/\n"})
	for _, name := range []string{"stat", "statm", "status", "io", "net"} {
		if err := os.Symlink(filepath.Join("/proc", pid, name), filepath.Join(proc, pid, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/proc/self", filepath.Join(proc, "self")); err != nil {
		t.Fatal(err)
	}
	r, err := ForPID(os.Getpid(), WithProcRoot(proc))
	if err != nil {
		t.Fatal(err)
	}
	for _, ctrl := range v1Controllers {
		if d := fmt.Sprint(r); !strings.Contains(d, ctrl+" from the process") {
			t.Errorf("description %q: want %s from the process", d, ctrl)
		}
	}
	s := mustRead(t, r)
	if s.CPUSeconds <= 0 || s.MemoryBytes <= 0 || s.MemoryLimitBytes != 0 || !s.HasNetwork {
		t.Errorf("stats %+v: want CPU and RSS > 0, no limit, network", s)
	}
}
