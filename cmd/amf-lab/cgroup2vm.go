package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/amf-edge/amf/internal/exitcode"
	"github.com/amf-edge/amf/lab/cgroup2vm"
)

const cgroup2vmUsage = `amf-lab cgroup2vm [--accel tcg|kvm] [--cpus 2] [--memory 1024] [--timeout 4m] [--run REGEXP] [--packages cgroup,sidecar]

Boots a cgroup v2-only Linux guest (Debian's linux-image-cloud-amd64 under
qemu-system-x86_64, fetched with apt-get download into ~/.cache/amf/cgroup2vm)
and runs the packages' test binaries in it as root, with real v2 cgroups;
prints the guest's console and a summary. Exits 1 unless every test binary
passed and nothing was left behind. Run it from the repository root
(make test-cgroup2); it needs qemu-system-x86 and e2fsprogs (make deps).

Flags:
`

func runCgroup2VM(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("amf-lab cgroup2vm", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, cgroup2vmUsage); fs.PrintDefaults() }
	cfg := cgroup2vm.Config{Console: stdout, Log: stderr}
	fs.StringVar(&cfg.Accel, "accel", "tcg", "qemu accelerator: tcg (software; the default, as KVM does not boot a guest in every VM) or kvm")
	fs.IntVar(&cfg.CPUs, "cpus", 2, "guest CPUs")
	fs.IntVar(&cfg.MemoryMiB, "memory", 1024, "guest memory in MiB")
	fs.DurationVar(&cfg.Timeout, "timeout", 0, "bound on the guest's run, boot to power-off (default 4m)")
	fs.DurationVar(&cfg.TestTimeout, "test-timeout", 0, "each test binary's -test.timeout (default 3m)")
	fs.StringVar(&cfg.TestRun, "run", "", "only the tests matching this -test.run pattern")
	fs.StringVar(&cfg.Repo, "repo", ".", "the repository root")
	pkgs := fs.String("packages", strings.Join(cgroup2vm.DefaultPackages, ","), "package directories whose tests run in the guest")
	if err := fs.Parse(args); err != nil {
		return exitcode.ForParse(err)
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	cfg.Packages = strings.Split(*pkgs, ",")
	if _, err := cgroup2vm.Run(ctx, cfg); err != nil {
		fmt.Fprintf(stderr, "amf-lab cgroup2vm: %v\n", err)
		return 1
	}
	return 0
}
