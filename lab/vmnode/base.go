package vmnode

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

//go:embed guest
var guestFiles embed.FS

// Debian is the release the base image is built from, and its mirror (the
// only package source this machine reaches).
const (
	debianSuite  = "bookworm"
	debianMirror = "http://deb.debian.org/debian"
)

// basePackages are installed on top of Debian's minbase: systemd as init, the
// cloud kernel (its modules: overlay, bridge, br_netfilter, veth), and what
// the kubelet, containerd and the CNI plugins run: runc, iptables, mount.
var basePackages = []string{
	"systemd-sysv", "dbus", "udev", "kmod", "iproute2", "iptables", "conntrack", "procps",
	"runc", "containernetworking-plugins", "linux-image-cloud-amd64",
}

// baseImage is a built base: the root filesystem image and its kernel.
type baseImage struct {
	Root, Kernel string
	Key          string
}

// baseKey names a base by what it is built from.
func baseKey() (string, error) {
	h := sha256.New()
	fmt.Fprintln(h, debianSuite, debianMirror, strings.Join(basePackages, ","))
	err := fs.WalkDir(guestFiles, "guest", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !inBase(p) {
			return err
		}
		b, err := guestFiles.ReadFile(p)
		fmt.Fprintf(h, "%s %d\n", p, len(b))
		h.Write(b)
		return err
	})
	return hex.EncodeToString(h.Sum(nil))[:16], err
}

// inBase tells the files baked into the base image from those written to
// each run's disk.
func inBase(p string) bool {
	return strings.HasSuffix(p, ".service") || filepath.Base(p) == "customize.sh"
}

// CacheDir is where bases are kept: $AMF_VMNODE_CACHE, else
// ~/.cache/amf/vmnode.
func CacheDir() (string, error) {
	if d := os.Getenv("AMF_VMNODE_CACHE"); d != "" {
		return d, nil
	}
	c, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache folder for the node's base image: %w (set AMF_VMNODE_CACHE)", err)
	}
	return filepath.Join(c, "amf", "vmnode"), nil
}

// buildBase returns the cached base, building it first if needed (≈ 1 min:
// mmdebstrap, then mkfs.ext4 -d). One build at a time per machine.
func buildBase(ctx context.Context, logf func(string, ...any)) (baseImage, error) {
	cache, err := CacheDir()
	if err != nil {
		return baseImage{}, err
	}
	key, err := baseKey()
	if err != nil {
		return baseImage{}, err
	}
	dir := filepath.Join(cache, "base-"+key)
	b := baseImage{Root: filepath.Join(dir, "root.img"), Kernel: filepath.Join(dir, "vmlinuz"), Key: key}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return b, err
	}
	lock, err := os.OpenFile(filepath.Join(cache, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return b, err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return b, err
	}
	// Under the lock no build runs: a build folder is one a killed run left.
	stale, _ := filepath.Glob(filepath.Join(cache, "build-*"))
	for _, d := range stale {
		_ = os.RemoveAll(d)
	}
	if _, err := os.Stat(filepath.Join(dir, "done")); err == nil {
		return b, nil
	}
	logf("vmnode: building the base image %s (Debian %s by mmdebstrap; once per machine, ≈ 1 min)", key, debianSuite)
	tmp, err := os.MkdirTemp(cache, "build-")
	if err != nil {
		return b, err
	}
	defer os.RemoveAll(tmp)
	units := filepath.Join(tmp, "units")
	if err := os.MkdirAll(units, 0o755); err != nil {
		return b, err
	}
	entries, err := guestFiles.ReadDir("guest")
	if err != nil {
		return b, err
	}
	for _, e := range entries {
		if !inBase(e.Name()) {
			continue
		}
		data, err := guestFiles.ReadFile("guest/" + e.Name())
		if err != nil {
			return b, err
		}
		dst := filepath.Join(units, e.Name())
		if e.Name() == "customize.sh" {
			dst = filepath.Join(tmp, e.Name())
		}
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			return b, err
		}
	}
	root := filepath.Join(tmp, "root")
	hook := fmt.Sprintf(`sh %s "$1" %s`, filepath.Join(tmp, "customize.sh"), units)
	if err := runLogged(ctx, "mmdebstrap", "--variant=minbase", "--include="+strings.Join(basePackages, ","),
		"--customize-hook="+hook, debianSuite, root, debianMirror); err != nil {
		return b, fmt.Errorf("build the node's root filesystem (needs mmdebstrap and Debian's mirror: make deps): %w", err)
	}
	kernels, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if len(kernels) != 1 {
		return b, fmt.Errorf("the root filesystem has %d kernels in /boot, want 1", len(kernels))
	}
	if err := copyFile(kernels[0], filepath.Join(tmp, "vmlinuz")); err != nil {
		return b, err
	}
	if err := runLogged(ctx, "mkfs.ext4", "-q", "-F", "-L", "amf-root", "-d", root, filepath.Join(tmp, "root.img"), "3G"); err != nil {
		return b, fmt.Errorf("make the node's root disk: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return b, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return b, err
	}
	for _, f := range []string{"root.img", "vmlinuz"} {
		if err := os.Rename(filepath.Join(tmp, f), filepath.Join(dir, f)); err != nil {
			return b, err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "done"), []byte(key+"\n"), 0o644); err != nil {
		return b, err
	}
	// Bases built from other recipes are dead weight (3 GiB apiece, sparse).
	old, _ := filepath.Glob(filepath.Join(cache, "base-*"))
	for _, o := range old {
		if o != dir {
			_ = os.RemoveAll(o)
		}
	}
	return b, nil
}

// runLogged runs a command and returns its output in the error when it fails.
func runLogged(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // dies with this process
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w\n%s", name, err, tail(out, 4<<10))
	}
	return nil
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.TrimSpace(string(b))
}

func copyFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}
