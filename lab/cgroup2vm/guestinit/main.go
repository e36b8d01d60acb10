// Command guestinit is the init (PID 1) of the cgroup v2 test guest that
// `amf-lab cgroup2vm` (make test-cgroup2) boots: see package cgroup2vm.
package main

import (
	"fmt"
	"os"

	"github.com/amf-edge/amf/lab/cgroup2vm"
)

func main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "guestinit is the init of the cgroup v2 test guest (make test-cgroup2); it mounts, runs tests and powers the machine off, so it runs only as PID 1")
		os.Exit(2)
	}
	err := cgroup2vm.Guest(os.Stdout)
	// Only if powering off failed: PID 1 exiting panics the kernel, which
	// (panic=-1, qemu -no-reboot) ends the guest as well.
	fmt.Fprintln(os.Stderr, "guestinit:", err)
	os.Exit(1)
}
