package cgroup2vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// Guest is the guest's init (PID 1): it sets the machine up, runs the plan's
// test binaries, reports on out (the console) and powers off. It returns
// only if powering off failed.
func Guest(out io.Writer) error {
	ok := false
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(out, "%s init panicked: %v\n", markerError, r)
			ok = false
		}
		result := "FAIL"
		if ok {
			result = "PASS"
		}
		fmt.Fprintf(out, "%s %s\n", markerResult, result)
		syscall.Sync()
		_ = syscall.Unmount("/tmp", 0)
		_ = syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
	}()
	p, err := setUp(out)
	if err != nil {
		fmt.Fprintf(out, "%s set-up: %v\n", markerError, err)
		return fmt.Errorf("power-off failed after a failed set-up (%w)", err)
	}
	ok = true
	for _, r := range p.Runs {
		if !runTests(out, p, r) {
			ok = false
		}
		if left := leftBehind(); len(left) > 0 {
			ok = false
			for _, l := range left {
				fmt.Fprintf(out, "%s after %s: %s\n", markerLeft, r.Package, l)
			}
			cleanUp()
		}
	}
	return errors.New("power-off failed")
}

// setUp mounts the kernel filesystems, cgroup2 with every controller enabled
// for the root's children, the scratch disk at /tmp, brings up lo and reads
// the plan.
func setUp(out io.Writer) (plan, error) {
	var p plan
	mounts := []struct {
		src, dst, fstype string
		flags            uintptr
		data             string
	}{
		{"proc", "/proc", "proc", syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC, ""},
		{"sysfs", "/sys", "sysfs", syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC, ""},
		{"devtmpfs", "/dev", "devtmpfs", syscall.MS_NOSUID, "mode=0755"},
		// As systemd mounts it on a cgroup v2 host.
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC, "nsdelegate,memory_recursiveprot"},
	}
	for _, m := range mounts {
		if err := syscall.Mount(m.src, m.dst, m.fstype, m.flags, m.data); err != nil {
			return p, fmt.Errorf("mount %s on %s: %w", m.fstype, m.dst, err)
		}
	}
	ctrls, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
	if err != nil {
		return p, fmt.Errorf("cgroup v2 controllers: %w", err)
	}
	var enable []string
	for _, c := range strings.Fields(string(ctrls)) {
		enable = append(enable, "+"+c)
	}
	if err := os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte(strings.Join(enable, " ")), 0o644); err != nil {
		return p, fmt.Errorf("enable the cgroup v2 controllers %s for the root's children: %w", enable, err)
	}
	if err := loopbackUp(); err != nil {
		return p, err
	}
	b, err := os.ReadFile(planPath)
	if err != nil {
		return p, fmt.Errorf("read the plan: %w", err)
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("read the plan %s: %w", planPath, err)
	}
	if err := waitForDevice(p.Disk, 30*time.Second); err != nil {
		return p, err
	}
	if err := syscall.Mount(p.Disk, "/tmp", "ext4", 0, ""); err != nil {
		return p, fmt.Errorf("mount the scratch disk %s on /tmp: %w", p.Disk, err)
	}
	if err := os.Chmod("/tmp", 0o1777); err != nil {
		return p, err
	}
	if v, err := os.ReadFile("/proc/version"); err == nil {
		fmt.Fprintf(out, "AMF-GUEST-INFO: %s", v)
	}
	sub, _ := os.ReadFile("/sys/fs/cgroup/cgroup.subtree_control")
	fmt.Fprintf(out, "AMF-GUEST-INFO: cgroup2 at /sys/fs/cgroup, controllers enabled for children: %s", sub)
	if cmdline, err := os.ReadFile("/proc/cmdline"); err == nil {
		fmt.Fprintf(out, "AMF-GUEST-INFO: kernel command line: %s", cmdline)
	}
	return p, nil
}

// loopbackUp brings lo up (the kernel gives it 127.0.0.1 and ::1): tests
// listen on loopback.
func loopbackUp() error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	defer syscall.Close(fd)
	var ifr [40]byte // struct ifreq: name[16], then flags (short)
	copy(ifr[:], "lo")
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.SIOCGIFFLAGS, uintptr(unsafe.Pointer(&ifr[0]))); e != 0 {
		return fmt.Errorf("bring lo up: get flags: %w", e)
	}
	flags := *(*uint16)(unsafe.Pointer(&ifr[16]))
	*(*uint16)(unsafe.Pointer(&ifr[16])) = flags | syscall.IFF_UP
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.SIOCSIFFLAGS, uintptr(unsafe.Pointer(&ifr[0]))); e != 0 {
		return fmt.Errorf("bring lo up: set flags: %w", e)
	}
	return nil
}

// waitForDevice waits until devtmpfs has the node p: the NVMe driver finds
// its namespaces after init has started.
func waitForDevice(p string, timeout time.Duration) error {
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC | syscall.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("wait for %s: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), "inotify")
	defer f.Close()
	if _, err := syscall.InotifyAddWatch(fd, filepath.Dir(p), syscall.IN_CREATE); err != nil {
		return fmt.Errorf("wait for %s: %w", p, err)
	}
	deadline := time.Now().Add(timeout)
	if err := f.SetReadDeadline(deadline); err != nil {
		return fmt.Errorf("wait for %s: %w", p, err)
	}
	buf := make([]byte, 4096)
	for {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
		if _, err := f.Read(buf); err != nil {
			return fmt.Errorf("no %s within %v (is the NVMe disk attached?): %w", p, timeout, err)
		}
	}
}

// runTests runs one test binary, its output on the console, and reports it.
func runTests(out io.Writer, p plan, r run) bool {
	start := time.Now()
	// -test.timeout ends a hung binary with a stack dump; this is the
	// backstop should it not.
	ctx, cancel := context.WithTimeout(context.Background(), p.Timeout+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.Binary, r.Args...)
	cmd.Dir = filepath.Dir(r.Binary)
	cmd.Env = p.Env
	cmd.Stdout, cmd.Stderr = out, out
	err := cmd.Run()
	d := time.Since(start).Round(100 * time.Millisecond)
	if err != nil {
		fmt.Fprintf(out, "%s FAIL %s %v (%v)\n", markerRun, r.Package, d, err)
		return false
	}
	fmt.Fprintf(out, "%s ok %s %v\n", markerRun, r.Package, d)
	return true
}

// leftBehind lists what outlived a test binary: cgroups below the root,
// processes other than init and kernel threads, files in /tmp.
func leftBehind() []string {
	var left []string
	_ = filepath.WalkDir("/sys/fs/cgroup", func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && p != "/sys/fs/cgroup" {
			left = append(left, "cgroup "+p)
		}
		return nil
	})
	for _, pid := range userProcesses() {
		left = append(left, "process "+describeProcess(pid))
	}
	ents, _ := os.ReadDir("/tmp")
	for _, e := range ents {
		if e.Name() != "lost+found" {
			left = append(left, "file /tmp/"+e.Name())
		}
	}
	return left
}

// describeProcess says what a process is: PID, name, state, parent and
// command line.
func describeProcess(pid int) string {
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	status, _ := os.ReadFile(filepath.Join(dir, "status"))
	var state, ppid string
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "State:"); ok {
			state = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(l, "PPid:"); ok {
			ppid = strings.TrimSpace(v)
		}
	}
	comm, _ := os.ReadFile(filepath.Join(dir, "comm"))
	cmdline, _ := os.ReadFile(filepath.Join(dir, "cmdline"))
	cg, _ := os.ReadFile(filepath.Join(dir, "cgroup"))
	return fmt.Sprintf("%d (%s), %s, parent %s, cgroup %s, command %q", pid, strings.TrimSpace(string(comm)), state, ppid,
		strings.TrimSpace(string(cg)), strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " "))
}

// pfKthread is the kernel-thread bit of a task's flags (/proc/<pid>/stat).
const pfKthread = 0x00200000

// userProcesses lists the processes other than init and kernel threads,
// zombies included.
func userProcesses() []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == 1 {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// Fields after the parenthesised command name: state ppid pgrp session
		// tty_nr tpgid flags ...
		i := strings.LastIndexByte(string(b), ')')
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 7 {
			continue
		}
		flags, _ := strconv.ParseUint(f[6], 10, 64)
		if flags&pfKthread == 0 {
			pids = append(pids, pid)
		}
	}
	return pids
}

// cleanUp kills and reaps what a test binary left, and removes its cgroups
// and files, so that the next binary starts from a clean machine.
func cleanUp() {
	for _, pid := range userProcesses() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for {
		var ws syscall.WaitStatus
		if pid, err := syscall.Wait4(-1, &ws, 0, nil); pid <= 0 || err != nil {
			break
		}
	}
	var dirs []string
	_ = filepath.WalkDir("/sys/fs/cgroup", func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && p != "/sys/fs/cgroup" {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = syscall.Rmdir(dirs[i])
	}
	ents, _ := os.ReadDir("/tmp")
	for _, e := range ents {
		if e.Name() != "lost+found" {
			_ = os.RemoveAll(filepath.Join("/tmp", e.Name()))
		}
	}
}
