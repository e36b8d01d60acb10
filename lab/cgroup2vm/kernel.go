package cgroup2vm

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// KernelMeta is the Debian package whose dependency is the current cloud
// kernel: a small kernel with NVMe, ext4, the 8250 serial console and every
// cgroup v2 controller built in.
const KernelMeta = "linux-image-cloud-amd64"

// Kernel is a kernel image extracted from its Debian package.
type Kernel struct {
	Package string // e.g. linux-image-6.1.0-57-cloud-amd64
	Version string // Debian version, e.g. 6.1.192-3
	Image   string // path of the bzImage (boot/vmlinuz-*)
}

// DefaultCacheDir is where kernels are kept: ~/.cache/amf/cgroup2vm, or
// $AMF_CGROUP2VM_CACHE.
func DefaultCacheDir() (string, error) {
	if d := os.Getenv("AMF_CGROUP2VM_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("kernel cache folder: %w (set AMF_CGROUP2VM_CACHE)", err)
	}
	return filepath.Join(d, "amf", "cgroup2vm"), nil
}

// FetchKernel returns the kernel of KernelMeta's current dependency, from
// cacheDir/<package>_<version>/ or else downloaded with apt-get download and
// extracted there (only boot/vmlinuz-*). Without apt's package lists it uses
// the newest cached kernel, if any. Progress goes to log.
func FetchKernel(ctx context.Context, cacheDir string, log io.Writer) (Kernel, error) {
	k, err := resolveKernel(ctx)
	if err != nil {
		if cached, ok := newestCached(cacheDir); ok {
			fmt.Fprintf(log, "cgroup2vm: %v; using the cached %s %s\n", err, cached.Package, cached.Version)
			return cached, nil
		}
		return Kernel{}, err
	}
	dir := filepath.Join(cacheDir, k.Package+"_"+k.Version)
	k.Image = filepath.Join(dir, "vmlinuz")
	if _, err := os.Stat(k.Image); err == nil {
		return k, nil
	}
	fmt.Fprintf(log, "cgroup2vm: downloading %s %s with apt-get into %s\n", k.Package, k.Version, dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Kernel{}, fmt.Errorf("kernel cache: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, "download-")
	if err != nil {
		return Kernel{}, fmt.Errorf("kernel cache: %w", err)
	}
	defer os.RemoveAll(tmp)
	args := []string{"download", k.Package + "=" + k.Version}
	if os.Geteuid() == 0 {
		// apt drops to the _apt user for downloads, who cannot write here.
		args = append([]string{"-o", "APT::Sandbox::User=root"}, args...)
	}
	if _, err := command(ctx, tmp, "apt-get", args...); err != nil {
		return Kernel{}, fmt.Errorf("download the guest kernel: %w", err)
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return Kernel{}, fmt.Errorf("download the guest kernel: apt-get download left %d .deb files in %s, want 1", len(debs), tmp)
	}
	if err := extractImage(ctx, debs[0], k.Image); err != nil {
		return Kernel{}, err
	}
	return k, nil
}

// resolveKernel asks apt which kernel package KernelMeta depends on, and its
// candidate version.
func resolveKernel(ctx context.Context) (Kernel, error) {
	hint := "run `make deps` (apt-get update) first"
	out, err := command(ctx, "", "apt-cache", "depends", "--no-recommends", "--no-suggests", "--no-conflicts",
		"--no-breaks", "--no-replaces", "--no-enhances", KernelMeta)
	if err != nil {
		return Kernel{}, fmt.Errorf("find the guest kernel package (%s): %w; %s", KernelMeta, err, hint)
	}
	var k Kernel
	for _, l := range strings.Split(out, "\n") {
		if p, ok := strings.CutPrefix(strings.TrimSpace(l), "Depends: "); ok && strings.HasPrefix(p, "linux-image-") {
			k.Package = p
			break
		}
	}
	if k.Package == "" {
		return Kernel{}, fmt.Errorf("find the guest kernel package: apt-cache depends %s names no linux-image package:\n%s; %s", KernelMeta, out, hint)
	}
	out, err = command(ctx, "", "apt-cache", "show", "--no-all-versions", k.Package)
	if err != nil {
		return Kernel{}, fmt.Errorf("find the guest kernel's version: %w; %s", err, hint)
	}
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, "Version: "); ok {
			k.Version = strings.TrimSpace(v)
			break
		}
	}
	if k.Version == "" {
		return Kernel{}, fmt.Errorf("find the guest kernel's version: apt-cache show %s has no Version; %s", k.Package, hint)
	}
	return k, nil
}

// newestCached returns the most recently extracted kernel in cacheDir.
func newestCached(cacheDir string) (Kernel, bool) {
	imgs, _ := filepath.Glob(filepath.Join(cacheDir, "linux-image-*_*", "vmlinuz"))
	type found struct {
		k   Kernel
		mod int64
	}
	var fs []found
	for _, img := range imgs {
		st, err := os.Stat(img)
		if err != nil {
			continue
		}
		pkg, ver, _ := strings.Cut(filepath.Base(filepath.Dir(img)), "_")
		fs = append(fs, found{Kernel{Package: pkg, Version: ver, Image: img}, st.ModTime().UnixNano()})
	}
	if len(fs) == 0 {
		return Kernel{}, false
	}
	sort.Slice(fs, func(i, j int) bool { return fs[i].mod > fs[j].mod })
	return fs[0].k, true
}

// extractImage copies ./boot/vmlinuz-* out of the package's data archive
// (dpkg-deb --fsys-tarfile) to dst, atomically.
func extractImage(ctx context.Context, deb, dst string) error {
	cmd := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", deb)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("extract the kernel from %s: %w", deb, err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("extract the kernel from %s: %w (is dpkg installed?)", deb, err)
	}
	found, copyErr := copyImage(bufio.NewReader(out), dst)
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("extract the kernel: dpkg-deb --fsys-tarfile %s: %w: %s", deb, err, strings.TrimSpace(stderr.String()))
	}
	if copyErr != nil {
		return fmt.Errorf("extract the kernel from %s: %w", deb, copyErr)
	}
	if !found {
		return fmt.Errorf("extract the kernel: no boot/vmlinuz-* in %s", deb)
	}
	return nil
}

func copyImage(r io.Reader, dst string) (bool, error) {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if h.Typeflag != tar.TypeReg || !strings.HasPrefix(strings.TrimPrefix(h.Name, "./"), "boot/vmlinuz-") {
			continue
		}
		tmp := dst + ".tmp"
		f, err := os.Create(tmp)
		if err != nil {
			return false, err
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp, dst)
		}
		if err != nil {
			os.Remove(tmp)
			return false, err
		}
		return true, nil
	}
}

// command runs name with args in dir and returns its stdout; the error
// carries its stderr.
func command(ctx context.Context, dir, name string, args ...string) (string, error) {
	cmd := commandIn(ctx, dir, name, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

func commandIn(ctx context.Context, dir, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	return cmd
}
