// Package cgroup2vm runs the sidecar's cgroup tests on a real cgroup v2
// kernel: it boots a cgroup v2-only Linux guest under qemu-system-x86_64
// (Debian's linux-image-cloud-amd64, fetched with apt-get download into a
// cache folder) whose initramfs holds only static Go test binaries, their
// testdata and a Go init, and reports the tests' results on the host.
//
// The host side ([Run]) builds the test binaries (go test -c, CGO_ENABLED=0,
// checked to be static), builds the init (./lab/cgroup2vm/guestinit), writes
// the initramfs (an uncompressed newc cpio archive), makes an ext4 scratch
// disk (mkfs.ext4) that the guest mounts at /tmp so that the tests' block
// I/O reaches a real block device (NVMe, built into the cloud kernel, so no
// kernel modules are needed), and runs qemu with the serial console on its
// stdout. It exits with an error unless the guest says every test binary
// passed and nothing was left behind.
//
// The guest side ([Guest], PID 1) mounts proc, sysfs, devtmpfs and cgroup2,
// enables every controller in the root's cgroup.subtree_control, brings up
// lo, mounts the scratch disk, runs each test binary with -test.v as root,
// checks that no cgroup or process outlived them, prints one result line
// per binary and a final line, and powers off.
//
// Test infrastructure: product code never imports it.
package cgroup2vm
