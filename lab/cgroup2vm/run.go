package cgroup2vm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Config says what to run and how.
type Config struct {
	Repo        string        // repository root (default ".")
	CacheDir    string        // where kernels are kept (default DefaultCacheDir)
	Packages    []string      // package directories whose tests run (default DefaultPackages)
	TestRun     string        // -test.run pattern for every binary ("" runs all)
	Accel       string        // qemu accelerator: "tcg" (default) or "kvm"
	CPUs        int           // guest CPUs (default 2)
	MemoryMiB   int           // guest memory (default 1024)
	Timeout     time.Duration // from qemu's start to the guest's power-off (default 4m)
	TestTimeout time.Duration // each test binary's -test.timeout (default 3m)
	Console     io.Writer     // the guest's console, line by line (default os.Stdout)
	Log         io.Writer     // progress (default os.Stderr)
}

func (c *Config) defaults() error {
	if c.Repo == "" {
		c.Repo = "."
	}
	abs, err := filepath.Abs(c.Repo)
	if err != nil {
		return fmt.Errorf("repository folder: %w", err)
	}
	c.Repo = abs
	if _, err := os.Stat(filepath.Join(c.Repo, "go.mod")); err != nil {
		return fmt.Errorf("%s is not the repository root (no go.mod): run from the repository or pass its folder: %w", c.Repo, err)
	}
	if c.CacheDir == "" {
		if c.CacheDir, err = DefaultCacheDir(); err != nil {
			return err
		}
	}
	if len(c.Packages) == 0 {
		c.Packages = DefaultPackages
	}
	switch c.Accel {
	case "":
		c.Accel = "tcg"
	case "tcg", "kvm":
	default:
		return fmt.Errorf("accelerator %q: want tcg or kvm", c.Accel)
	}
	if c.CPUs <= 0 {
		c.CPUs = 2
	}
	if c.MemoryMiB <= 0 {
		c.MemoryMiB = 1024
	}
	if c.Timeout <= 0 {
		c.Timeout = 4 * time.Minute
	}
	if c.TestTimeout <= 0 {
		c.TestTimeout = 3 * time.Minute
	}
	if c.Console == nil {
		c.Console = os.Stdout
	}
	if c.Log == nil {
		c.Log = os.Stderr
	}
	return nil
}

// guestDisk is the scratch disk as the guest sees it: the first namespace of
// the one NVMe controller.
const guestDisk = "/dev/nvme0n1"

// diskSize is the scratch disk's size; the file is sparse.
const diskSize = 256 << 20

// Run builds the guest, boots it and returns what its console said. The
// error is nil only when every test binary passed and nothing was left
// behind. qemu is killed when ctx ends, and the work folder is removed.
func Run(ctx context.Context, cfg Config) (*Summary, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return nil, fmt.Errorf("qemu-system-x86_64 not found (Debian's qemu-system-x86: make deps): %w", err)
	}
	start := time.Now()
	k, err := FetchKernel(ctx, cfg.CacheDir, cfg.Log)
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "amf-cgroup2vm-")
	if err != nil {
		return nil, fmt.Errorf("work folder: %w", err)
	}
	defer os.RemoveAll(work)

	fmt.Fprintf(cfg.Log, "cgroup2vm: building the guest init and the tests of %s\n", strings.Join(cfg.Packages, ", "))
	initBin, tests, err := buildBinaries(ctx, cfg.Repo, work, cfg.Packages)
	if err != nil {
		return nil, err
	}
	p := plan{Disk: guestDisk, Env: guestEnv, Timeout: cfg.TestTimeout}
	for _, pkg := range cfg.Packages {
		args := []string{"-test.v", "-test.count=1", "-test.timeout=" + cfg.TestTimeout.String()}
		if cfg.TestRun != "" {
			args = append(args, "-test.run="+cfg.TestRun)
		}
		p.Runs = append(p.Runs, run{Package: pkg, Binary: srcRoot + "/" + pkg + "/" + filepath.Base(tests[pkg]), Args: args})
	}
	initrd := filepath.Join(work, "initramfs.cpio")
	if err := writeInitramfs(initrd, cfg.Repo, initBin, tests, p); err != nil {
		return nil, err
	}
	disk := filepath.Join(work, "tmp.ext4")
	if err := makeDisk(ctx, disk, diskSize); err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Log, "cgroup2vm: built in %.1fs; booting %s %s (%s, %d CPUs, %d MiB; cgroup v2 only)\n",
		time.Since(start).Seconds(), k.Package, k.Version, cfg.Accel, cfg.CPUs, cfg.MemoryMiB)

	boot := time.Now()
	sum, err := boot1(ctx, cfg, qemu, qemuArgs(cfg, k.Image, initrd, disk))
	fmt.Fprintf(cfg.Log, "cgroup2vm: guest ran %.1fs (%.1fs in all)\n%s", time.Since(boot).Seconds(), time.Since(start).Seconds(), sum)
	if err != nil {
		return sum, err
	}
	if !sum.OK() {
		return sum, errors.New("the guest's tests did not all pass (see above)")
	}
	return sum, nil
}

// kernelArgs make the guest cgroup v2-only: no v1 hierarchy can be mounted.
const kernelArgs = "console=ttyS0 panic=-1 quiet cgroup_no_v1=all systemd.unified_cgroup_hierarchy=1"

func qemuArgs(cfg Config, kernel, initrd, disk string) []string {
	args := []string{
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-monitor", "none", "-serial", "stdio",
		"-accel", cfg.Accel,
		"-smp", strconv.Itoa(cfg.CPUs), "-m", strconv.Itoa(cfg.MemoryMiB),
		"-kernel", kernel, "-initrd", initrd, "-append", kernelArgs,
		"-drive", "file=" + disk + ",if=none,id=tmp,format=raw,cache=unsafe",
		"-device", "nvme,drive=tmp,serial=amf-tmp",
	}
	if cfg.Accel == "kvm" {
		args = append(args, "-cpu", "host")
	}
	return args
}

// escapes matches the terminal control sequences the firmware prints.
var escapes = regexp.MustCompile(`\x1b(\[[0-9;?]*[A-Za-z]|c)`)

// ConsoleLine is a line of a qemu guest's serial console without the
// firmware's terminal control sequences and the carriage return.
func ConsoleLine(l string) string {
	return strings.TrimRight(escapes.ReplaceAllString(l, ""), "\r")
}

// boot1 runs qemu until the guest powers off, the timeout passes or ctx
// ends, copying its console to cfg.Console and reading it into a Summary.
func boot1(ctx context.Context, cfg Config, qemu string, args []string) (*Summary, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu, args...)
	// Its own process group, so that the whole of it is killed; and killed
	// with this process if this process dies first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start qemu: %w", err)
	}
	sum := &Summary{}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := ConsoleLine(sc.Text())
		fmt.Fprintln(cfg.Console, l)
		sum.line(l)
	}
	err = cmd.Wait()
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return sum, fmt.Errorf("the guest did not power off within %v (killed; raise --timeout if the tests were still running)", cfg.Timeout)
	case ctx.Err() != nil:
		return sum, fmt.Errorf("guest stopped: %w", ctx.Err())
	case err != nil:
		return sum, fmt.Errorf("qemu: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return sum, nil
}
