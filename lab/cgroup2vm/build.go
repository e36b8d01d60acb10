package cgroup2vm

import (
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// DefaultPackages are the packages whose tests run in the guest.
var DefaultPackages = []string{"cgroup", "sidecar"}

// guestEnv is every test binary's environment in the guest. The REQUIRE
// variable turns the real-cgroup tests' skips into failures: in the guest
// they must run.
var guestEnv = []string{
	"PATH=/amf/bin",
	"HOME=/root",
	"TMPDIR=/tmp",
	"AMF_REQUIRE_REAL_CGROUPS=1",
}

// goEnv builds static linux/amd64 binaries.
var goEnv = []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64"}

// buildBinaries compiles the guest init and one test binary per package into
// dir, and checks that each is statically linked.
func buildBinaries(ctx context.Context, repo, dir string, pkgs []string) (initBin string, tests map[string]string, err error) {
	initBin = filepath.Join(dir, "init")
	if err := goCommand(ctx, repo, "build", "-trimpath", "-o", initBin, "./lab/cgroup2vm/guestinit"); err != nil {
		return "", nil, fmt.Errorf("build the guest init: %w", err)
	}
	tests = map[string]string{}
	testDir := filepath.Join(dir, "tests")
	args := []string{"test", "-c", "-o", testDir + string(filepath.Separator)}
	for _, p := range pkgs {
		args = append(args, "./"+p)
		tests[p] = filepath.Join(testDir, path.Base(p)+".test")
	}
	if err := goCommand(ctx, repo, args...); err != nil {
		return "", nil, fmt.Errorf("build the test binaries: %w", err)
	}
	for _, b := range append([]string{initBin}, mapValues(tests)...) {
		if err := checkStatic(b); err != nil {
			return "", nil, err
		}
	}
	return initBin, tests, nil
}

func mapValues(m map[string]string) []string {
	var vs []string
	for _, v := range m {
		vs = append(vs, v)
	}
	return vs
}

func goCommand(ctx context.Context, repo string, args ...string) error {
	goBin := "go"
	if g := os.Getenv("GO"); g != "" {
		goBin = g
	}
	cmd := commandIn(ctx, repo, goBin, args...)
	cmd.Env = append(os.Environ(), goEnv...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", goBin, strings.Join(args, " "), err, out)
	}
	return nil
}

// checkStatic fails unless the ELF file at p needs no dynamic loader: the
// initramfs has no libc.
func checkStatic(p string) error {
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("check %s is static: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked (it has an ELF interpreter): build it with CGO_ENABLED=0", p)
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		return fmt.Errorf("%s needs shared libraries %v: build it with CGO_ENABLED=0", p, libs)
	}
	if f.Machine != elf.EM_X86_64 {
		return fmt.Errorf("%s is for %v, the guest is x86-64", p, f.Machine)
	}
	return nil
}

// writeInitramfs writes the guest's initramfs to dst: the init, the plan,
// each test binary in its package directory under srcRoot with the
// package's testdata, and the few files a Go program expects in /etc.
func writeInitramfs(dst, repo, initBin string, tests map[string]string, p plan) error {
	f, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	defer f.Close()
	w := newCPIOWriter(f)
	for _, d := range []string{"dev", "proc", "sys", "tmp", "root", "amf/bin"} {
		w.dir(d)
	}
	// The kernel opens /dev/console for init's stdio before devtmpfs is up.
	w.charDev("dev/console", 5, 1)
	w.file("etc/hosts", 0o644, []byte("127.0.0.1 localhost\n::1 localhost\n"))
	w.file("etc/hostname", 0o644, []byte("amf-guest\n"))
	w.file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/init\n"))
	w.file("etc/group", 0o644, []byte("root:x:0:\n"))
	b, err := os.ReadFile(initBin)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	w.file("init", 0o755, b)
	for pkg, bin := range tests {
		b, err := os.ReadFile(bin)
		if err != nil {
			return fmt.Errorf("initramfs: %w", err)
		}
		w.file(path.Join(srcRoot, pkg, path.Base(bin)), 0o755, b)
		td := filepath.Join(repo, filepath.FromSlash(pkg), "testdata")
		if _, err := os.Stat(td); err == nil {
			if err := w.tree(path.Join(srcRoot, pkg, "testdata"), td); err != nil {
				return fmt.Errorf("initramfs: copy %s: %w", td, err)
			}
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("initramfs: %w", err)
		}
	}
	pb, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return fmt.Errorf("initramfs: plan: %w", err)
	}
	w.file(planPath, 0o644, pb)
	if err := w.close(); err != nil {
		return fmt.Errorf("initramfs %s: %w", dst, err)
	}
	return f.Close()
}

// makeDisk creates a sparse file of size bytes at p with an ext4
// filesystem, the guest's /tmp.
func makeDisk(ctx context.Context, p string, size int64) error {
	f, err := os.Create(p)
	if err != nil {
		return fmt.Errorf("scratch disk: %w", err)
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return fmt.Errorf("scratch disk: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("scratch disk: %w", err)
	}
	mkfs, err := lookSbin("mkfs.ext4")
	if err != nil {
		return fmt.Errorf("scratch disk: %w (it is in Debian's e2fsprogs: make deps)", err)
	}
	if _, err := command(ctx, "", mkfs, "-q", "-F", "-L", "amf-tmp", p); err != nil {
		return fmt.Errorf("scratch disk: %w", err)
	}
	return nil
}

// lookSbin finds a program in PATH or in the sbin folders, which a user's
// PATH often lacks.
func lookSbin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin"} {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in PATH, /usr/sbin or /sbin", name)
}
