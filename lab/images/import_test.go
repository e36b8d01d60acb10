package images

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestImportIntoContainerd imports every archive into a throwaway
// containerd (its root, state and sockets in a temp folder), twice, as a
// node that keeps its store across lab runs would see it.
func TestImportIntoContainerd(t *testing.T) {
	f := built(t)
	needRoot(t, "run containerd")
	containerd, err := exec.LookPath("containerd")
	if err != nil {
		skipOrFail(t, "needs containerd (make deps)")
	}
	ctrPath, err := exec.LookPath("ctr")
	if err != nil {
		skipOrFail(t, "needs ctr (make deps)")
	}
	addr := startContainerd(t, containerd)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, round := range []string{"first import", "import again"} {
		t0 := time.Now()
		if err := Import(ctx, ctrPath, addr, f.images); err != nil {
			t.Fatalf("%s: %v", round, err)
		}
		t.Logf("%s: %v", round, time.Since(t0).Round(time.Millisecond))
	}

	// Ask containerd independently of Import's own check.
	out, err := exec.CommandContext(ctx, ctrPath, "--address", addr, "--namespace", "k8s.io", "images", "ls").CombinedOutput()
	if err != nil {
		t.Fatalf("ctr images ls: %v\n%s", err, out)
	}
	listed := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if fl := strings.Fields(sc.Text()); len(fl) >= 3 && fl[0] != "REF" {
			listed[fl[0]] = fl[2]
		}
	}
	for _, img := range f.images {
		if listed[img.Ref] != img.Digest.String() {
			t.Errorf("ctr images ls: %s at %q, want %s", img.Ref, listed[img.Ref], img.Digest)
		}
	}
	if len(listed) != len(f.images) {
		t.Errorf("ctr images ls lists %d images, want %d:\n%s", len(listed), len(f.images), out)
	}
}

func TestImportFailsWithoutContainerd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sock := filepath.Join(t.TempDir(), "none.sock")
	err := Import(ctx, "ctr", sock, []Image{{Name: Pause, Ref: PauseRef, Archive: filepath.Join(t.TempDir(), "x.tar")}})
	if err == nil || !strings.Contains(err.Error(), sock) || !strings.Contains(err.Error(), "is containerd running") {
		t.Fatalf("Import with no containerd: %v, want an error naming %s", err, sock)
	}
}

// startContainerd runs containerd with everything it writes under a temp
// folder and returns its socket. Cleanup stops it, waits for it and
// unmounts whatever it left mounted there, before the folder is removed.
func startContainerd(t *testing.T, bin string) string {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "containerd.sock")
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
# Import needs no CRI; without it containerd touches nothing of the host's.
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, filepath.Join(dir, "opt"))
	cfgPath := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "containerd.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the child has its own descriptor
	log := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	c := exec.Command(bin, "--config", cfgPath)
	c.Stdout, c.Stderr = logFile, logFile
	// Its own process group, so a signal to the test's group does not race
	// the cleanup.
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- c.Wait() }()
	t.Cleanup(func() {
		c.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			t.Errorf("containerd ignored SIGTERM for 15 s; killing it")
			c.Process.Kill()
			<-exited
		}
		for _, m := range mountsUnder(t, dir) {
			t.Logf("containerd left %s mounted; unmounting", m)
			if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v", m, err)
			}
		}
		if t.Failed() {
			t.Logf("containerd's log:\n%s", log())
		}
	})
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("containerd exited: %v\n%s", err, log())
		default:
		}
		if conn, err := net.Dial("unix", sock); err == nil {
			conn.Close()
			return sock
		}
	}
	t.Fatalf("containerd not serving at %s after 20 s:\n%s", sock, log())
	return ""
}

// mountsUnder lists the mount points under dir, deepest first.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append([]string{f[4]}, out...)
		}
	}
	return out
}
