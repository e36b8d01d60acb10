package cgroup

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// The tests in this file run child processes (this test binary,
// re-executed in a role) in real cgroups (see realcgroup_test.go).

const (
	childEnv     = "AMF_CGROUP_TEST_CHILD"     // the child's role, one of the role* constants
	childDirEnv  = "AMF_CGROUP_TEST_CHILD_DIR" // where a worker writes its file
	childNSEnv   = "AMF_CGROUP_TEST_NS"        // a sidecar's nsRequest, as JSON
	childAlloc   = 24 << 20                    // bytes a worker allocates and touches
	childWrite   = 4 << 20                     // bytes a worker writes and fsyncs
	childTimeout = 30 * time.Second            // bound on waiting for a child or a counter
)

// The roles of a child. Each waits for "go" on stdin (sent once it is in its
// cgroup, so that what it does is charged there) and then says one line on
// stdout.
const (
	// roleWork allocates and touches childAlloc bytes, writes childWrite
	// bytes to a file with fsync, says "ready direct|buffered", then burns
	// CPU until killed: a broker.
	roleWork = "work"
	// rolePause names itself "pause", says "ready" and sleeps until killed:
	// a pod's sandbox container.
	rolePause = "pause"
	// roleHog says "ready" and allocates until the kernel OOM-kills it.
	roleHog = "hog"
	// roleSidecar starts a roleDiscover child in new cgroup and mount
	// namespaces, as a container runtime starts a container: the
	// namespace's root is the sidecar's cgroup. It passes on its line.
	roleSidecar = "sidecar"
	// roleDiscover finds and reads the pod's target container from inside
	// the namespaces (nsRequest), and says "result <nsReport JSON>".
	roleDiscover = "discover"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(childEnv); role != "" {
		os.Exit(runChild(role))
	}
	os.Exit(m.Run())
}

func runChild(role string) int {
	if role != roleDiscover { // started by a sidecar, already in place
		line, err := bufio.NewReader(os.Stdin).ReadString('\n')
		if err != nil || line != "go\n" {
			fmt.Fprintln(os.Stderr, "child: no go:", line, err)
			return 2
		}
	}
	var err error
	switch role {
	case roleWork:
		err = work()
	case rolePause:
		if err = os.WriteFile("/proc/self/comm", []byte("pause"), 0o644); err == nil {
			fmt.Println("ready")
			_, _ = io.Copy(io.Discard, os.Stdin) // until killed
		}
	case roleHog:
		fmt.Println("ready")
		hog()
	case roleSidecar:
		err = startDiscover()
	case roleDiscover:
		err = discover()
	case childIdle:
		return runIdleChild()
	case childFind:
		return runFindChild()
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "child %s: %v\n", role, err)
		return 2
	}
	return 0
}

func work() error {
	mem := make([]byte, childAlloc)
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 1
	}
	how, err := writeFile(filepath.Join(os.Getenv(childDirEnv), "io"))
	if err != nil {
		return err
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

// hog allocates and touches memory 1 MiB at a time, keeping all of it.
func hog() {
	var held [][]byte
	for {
		b := make([]byte, 1<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		held = append(held, b)
		runtime.KeepAlive(held)
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

// child is a re-executed test binary running in a cgroup.
type child struct {
	pid  int
	said string        // its first line, after the first word
	done chan struct{} // closed once it has exited and been reaped
	// state is how it ended; valid once done is closed.
	state *os.ProcessState
	stop  func() // kills it and waits until it is reaped; safe to call more than once
	// direct: a worker wrote its file with O_DIRECT, which v1 blkio charges
	// to it.
	direct bool
}

// selfCommand returns a command that runs this test binary as a child in
// role, with env added.
func selfCommand(role string, env ...string) *exec.Cmd {
	return exeCommand(os.Args[0], append([]string{childEnv + "=" + role}, env...)...)
}

// exeCommand runs exe (this test binary, or a copy of it) as a child with env
// added. AMF_TEST_EXEC_WRAPPER runs it under an emulator: make test-arm64
// sets it to qemu-aarch64-static, since executing an arm64 binary from an
// emulated one needs binfmt_misc, which this machine may not have.
func exeCommand(exe string, env ...string) *exec.Cmd {
	name, args := exe, []string{"-test.run=^$"}
	if w := os.Getenv("AMF_TEST_EXEC_WRAPPER"); w != "" {
		name, args = w, append([]string{exe}, args...)
	}
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

// startChild starts a child in role, moves it into c and waits for its
// first line. It is killed at cleanup.
func startChild(t *testing.T, c *realCgroup, role string, env ...string) *child {
	t.Helper()
	ch, line := spawnInCgroups(t, os.Args[0], c.uniqueDirs(), append([]string{childEnv + "=" + role, childDirEnv + "=" + t.TempDir()}, env...)...)
	word, rest, _ := strings.Cut(line, " ")
	if word != "ready" && word != "result" {
		t.Fatalf("child %s said %q", role, line)
	}
	ch.said, ch.direct = rest, rest == "direct"
	return ch
}

// spawnInCgroups starts exe (this test binary or a copy) as a child with env
// added (childEnv names its role), moves it into the cgroup directories dirs,
// tells it to go and returns its first line of output, trimmed. It is killed
// at cleanup.
func spawnInCgroups(t *testing.T, exe string, dirs []string, env ...string) (*child, string) {
	t.Helper()
	cmd := exeCommand(exe, env...)
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
	ch := &child{pid: cmd.Process.Pid, done: make(chan struct{})}
	first := make(chan string, 1)
	go func() {
		br := bufio.NewReader(stdout)
		line, _ := br.ReadString('\n')
		first <- line
		_, _ = io.Copy(io.Discard, br)
		_ = cmd.Wait() // after reading to EOF: Wait closes the pipe
		ch.state = cmd.ProcessState
		close(ch.done)
	}()
	var once sync.Once
	ch.stop = func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			<-ch.done
		})
	}
	t.Cleanup(ch.stop)
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(ch.pid)), 0o644); err != nil {
			t.Fatalf("move child into %s: %v", d, err)
		}
	}
	if _, err := stdin.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case line := <-first:
		return ch, strings.TrimSpace(line)
	case <-time.After(childTimeout):
		t.Fatalf("child (%v) said nothing in %v", env, childTimeout)
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

// checkChildStats checks a reading of a worker's cgroup, limited by limit.
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
	case !c.ioAccounts:
		t.Logf("block I/O is not accounted here (v1 blkio does not list the temp folder's disk even in the root, or the folder is on tmpfs); disk = %v", s.DiskBytes)
	case !ch.direct && !c.v2:
		// v1 charges only direct I/O to the writer; v2 charges writeback too.
		t.Logf("the child could not use O_DIRECT in its temp dir; disk = %v", s.DiskBytes)
	case s.DiskBytes < childWrite:
		t.Errorf("disk %v < the %d bytes the child wrote and synced", s.DiskBytes, childWrite)
	}
}

// checkCPURate reads for at least half a second after s1 and checks the
// CPU counter's rate: above 0, and within the cgroup's CPU limit when it
// has one (a counter in the wrong unit would be off by 1000). CFS lets a
// cgroup run a period's quota early, hence the margin.
func checkCPURate(t *testing.T, c *realCgroup, r Reader, s1 Stats) {
	t.Helper()
	const window = 500 * time.Millisecond
	s2 := readUntil(t, r, func(s Stats) bool { return s.Time.Sub(s1.Time) >= window && s.CPUSeconds > s1.CPUSeconds })
	rate := (s2.CPUSeconds - s1.CPUSeconds) / s2.Time.Sub(s1.Time).Seconds()
	max := float64(runtime.NumCPU())
	if c.cpuLimited {
		max = cpuLimit * 1.5
	}
	if rate <= 0 || rate > max {
		t.Errorf("CPU rate %.3f cores over %v, want within (0, %.2f] (limited: %v)", rate, s2.Time.Sub(s1.Time), max, c.cpuLimited)
	}
	t.Logf("CPU rate %.3f cores over %v (limit %v)", rate, s2.Time.Sub(s1.Time).Round(time.Millisecond), c.cpuLimited)
}

func TestReaderOnRealCgroup(t *testing.T) {
	c := newRealCgroup(t)
	c.limit(t)
	ch := startChild(t, c, roleWork)

	byDir := mustOpen(t, c.dirs[ctrlMemory], WithPID(ch.pid))
	byPath := mustOpen(t, c.path, WithPID(ch.pid))
	t.Logf("reader: %v", byDir)
	for _, r := range []Reader{byDir, byPath} {
		s1 := mustRead(t, r)
		checkChildStats(t, c, ch, s1)
		checkCPURate(t, c, r, s1)
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
	c := newRealCgroup(t)
	c.limit(t)
	ch := startChild(t, c, roleWork)
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

// The test process itself, in whatever cgroup it was started: on v1 each
// controller at "/" is the root cgroup, whose counters describe the whole
// host, so those fields come from the process through gopsutil; on v2 the
// same holds for the root cgroup as a whole, and any other cgroup is read.
func TestForPIDOnTestProcess(t *testing.T) {
	if os.Getenv("AMF_TEST_EXEC_WRAPPER") != "" {
		// qemu-user answers /proc/self/stat itself, with CPU times of 0; the
		// native run covers this test, the child tests cover the emulated one.
		t.Skip("running under an emulator, which fakes this process's /proc/self/stat")
	}
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		skipOrFail(t, "%v", err)
	}
	lines, err := parseProcCgroup(b)
	if err != nil {
		t.Fatal(err)
	}
	l, err := loadLayout(newConfig(nil))
	if err != nil {
		skipOrFail(t, "no cgroup filesystem: %v", err)
	}
	r, err := ForPID(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	desc := fmt.Sprint(r)
	t.Logf("reader: %s", desc)
	if l.useV1() {
		for _, ctrl := range v1Controllers {
			p, _ := v1Path(lines, ctrl)
			if got, want := strings.Contains(desc, ctrl+" from the process"), p == "/"; got != want {
				t.Errorf("%s at %q: from the process = %v, want %v (%s)", ctrl, p, got, want, desc)
			}
		}
	} else {
		p, _ := v2Path(lines)
		want := "root cgroup: all from the process"
		if p != "/" {
			dir, err := l.v2.dir(p)
			if err != nil {
				t.Fatal(err)
			}
			want = "cgroup v2 " + dir
		}
		if !strings.Contains(desc, want) {
			t.Errorf("in cgroup %q: description %q, want %q", p, desc, want)
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

// nsRequest tells a sidecar child which pod to find, and how to see the
// node's hierarchy from its namespaces.
type nsRequest struct {
	UID      string `json:"uid"`
	HostRoot string `json:"host_root"` // the node's hierarchy (WithCgroupRoot)
	// Bind, on v2, is an empty folder: the sidecar bind-mounts HostRoot
	// there, as a hostPath volume, before mounting its own cgroup2 over
	// /sys/fs/cgroup, as the runtime does for a container with a private
	// cgroup namespace. Empty on v1.
	Bind string `json:"bind"`
	// PID, when set, selects the target by its PID (shareProcessNamespace)
	// instead of by exclusion.
	PID int `json:"pid"`
	// Target is the target's PID, for ForPID from inside the namespace; 0
	// for none.
	Target int `json:"target"`
	// OwnPIDs puts the sidecar in a PID namespace of its own, with its own
	// /proc, as a pod's containers are without shareProcessNamespace.
	OwnPIDs bool `json:"own_pids"`
	// Sandbox, when set, is a file in a folder named by the sandbox's ID
	// that the sidecar bind-mounts on /etc/hostname, as containerd does from
	// the sandbox's folder.
	Sandbox string `json:"sandbox"`
}

// nsReport is what a sidecar child found.
type nsReport struct {
	SelfCgroup string    `json:"self_cgroup"` // its /proc/self/cgroup
	PID        int       `json:"pid"`         // its PID, as it sees it
	Container  Container `json:"container"`   // FindContainer by exclusion
	Reader     string    `json:"reader"`      // OpenPod's reader
	Stats      Stats     `json:"stats"`       // its first reading
	// Self and SelfStats: ForPID of its own PID, through its own cgroup2
	// mount (v2 only).
	Self      string `json:"self"`
	SelfStats Stats  `json:"self_stats"`
	// TargetByPID: ForPID of the target, a process outside the namespace:
	// its description, or its error.
	TargetByPID string `json:"target_by_pid"`
	Err         string `json:"err"`
}

// startDiscover runs this binary as roleDiscover in new cgroup and mount
// namespaces; it is forked from this process, so its cgroup namespace's
// root is this process's cgroup. Its line goes straight to our stdout. It
// is killed if this process is, and this process waits for it, so that it
// is never orphaned.
func startDiscover() error {
	var req nsRequest
	if err := json.Unmarshal([]byte(os.Getenv(childNSEnv)), &req); err != nil {
		return fmt.Errorf("%s: %w", childNSEnv, err)
	}
	cmd := selfCommand(roleDiscover)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWCGROUP | syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	if req.OwnPIDs {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWPID
	}
	return cmd.Run()
}

// discover runs inside the namespaces: it finds the target as the sidecar
// does in a pod (by exclusion, the node's hierarchy mounted), reads it, and
// says what it found.
func discover() error {
	var req nsRequest
	if err := json.Unmarshal([]byte(os.Getenv(childNSEnv)), &req); err != nil {
		return fmt.Errorf("%s: %w", childNSEnv, err)
	}
	rep := nsReport{}
	if err := discoverInto(req, &rep); err != nil {
		rep.Err = err.Error()
	}
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	fmt.Printf("result %s\n", b)
	return nil
}

func discoverInto(req nsRequest, rep *nsReport) error {
	root := req.HostRoot
	if req.Bind != "" {
		if err := syscall.Mount(req.HostRoot, req.Bind, "", syscall.MS_BIND|syscall.MS_REC, ""); err != nil {
			return fmt.Errorf("bind-mount the node's hierarchy at %s: %w", req.Bind, err)
		}
		// The node's mount goes from this mount namespace (the kernel refuses
		// to stack a cgroup2 mount on its own root), as it is absent from a
		// container's.
		if err := syscall.Unmount(DefaultCgroupRoot, syscall.MNT_DETACH); err != nil {
			return fmt.Errorf("unmount the node's cgroup2 from this mount namespace: %w", err)
		}
		if err := syscall.Mount("cgroup2", DefaultCgroupRoot, "cgroup2", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("mount the namespace's cgroup2 on %s: %w", DefaultCgroupRoot, err)
		}
		root = req.Bind
	}
	if req.OwnPIDs {
		if err := syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("mount the PID namespace's /proc: %w", err)
		}
	}
	if req.Sandbox != "" {
		if err := syscall.Mount(req.Sandbox, "/etc/hostname", "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind-mount the sandbox's hostname file on /etc/hostname: %w", err)
		}
	}
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return err
	}
	rep.SelfCgroup, rep.PID = string(b), os.Getpid()
	q := PodQuery{UID: req.UID, PID: req.PID}
	if rep.Container, err = FindContainer(q, WithCgroupRoot(root)); err != nil {
		return err
	}
	r, err := OpenPod(q, WithCgroupRoot(root), WithPID(os.Getpid()))
	if err != nil {
		return err
	}
	rep.Reader = fmt.Sprint(r)
	if rep.Stats, err = r.Read(context.Background()); err != nil {
		return err
	}
	if req.Target > 0 {
		if t, err := ForPID(req.Target); err != nil {
			rep.TargetByPID = "error: " + err.Error()
		} else {
			rep.TargetByPID = fmt.Sprint(t)
		}
	}
	if req.Bind != "" {
		self, err := ForPID(os.Getpid())
		if err != nil {
			return err
		}
		rep.Self = fmt.Sprint(self)
		if rep.SelfStats, err = self.Read(context.Background()); err != nil {
			return err
		}
	}
	return nil
}
