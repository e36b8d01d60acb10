package cgroup

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// IDs and UIDs of the recorded trees in testdata/ (see testdata/README.md).
const (
	burstableUID  = "5f1c2a3b-8d4e-4f60-9a7b-1c2d3e4f5a6b"
	guaranteedUID = "0c9d8e7f-6a5b-4c3d-8e2f-1a0b9c8d7e6f"
	besteffortUID = "7e6d5c4b-3a29-4817-9605-f4e3d2c1b0a9"

	brokerID  = "3b0c6f1e2d4a5b6c7d8e9f00112233445566778899aabbccddeeff0011223344"
	sidecarID = "a1d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2"
	pauseID   = "9f2e4d6c8b0a1f3e5d7c9b1a0f2e4d6c8b0a1f3e5d7c9b1a0f2e4d6c8b0a1f3e"

	guaranteedID      = "c0ffee00112233445566778899aabbccddeeff00112233445566778899aabbcc"
	guaranteedPauseID = "b1e55ed0112233445566778899aabbccddeeff00112233445566778899aabbcc"
	besteffortID      = "deadbeef00112233445566778899aabbccddeeff00112233445566778899aabb"
	besteffortPauseID = "feedface00112233445566778899aabbccddeeff00112233445566778899aabb"

	// Pods under a kubelet cgroup root of their own: kind's (systemd driver,
	// cgroupRoot /kubelet; pause, sidecar, broker and an exporter) and a
	// second kubelet's on the same host (cgroupfs, cgroupRoot /node-a).
	kindUID    = "3c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f"
	nodeAUID   = "8a7b6c5d-4e3f-4a2b-9c1d-0e1f2a3b4c5d"
	exporterID = "e2e2e2e2112233445566778899aabbccddeeff00112233445566778899aabbcc"

	// The broker's figures in the recorded trees.
	brokerMemory   = 52428800
	brokerLimit    = 100 << 20
	brokerV2Disk   = 1048576 + 2097152 + 4096 + 8192 + 100
	brokerV1Disk   = 1048576 + 2097152 + 4096 + 8192
	recordedNetPID = 4242
	recordedNet    = 98765432 + 1234567 // eth0 rx + tx; lo is skipped
)

var (
	v2Root      = filepath.Join("testdata", "v2-cgroupfs")
	systemdRoot = filepath.Join("testdata", "v2-systemd")
	v1Root      = filepath.Join("testdata", "v1-cgroupfs")
	procRoot    = filepath.Join("testdata", "proc")
	kindRoot    = filepath.Join("testdata", "v2-kind")
	nodeARoot   = filepath.Join("testdata", "v2-cgroupfs-root")

	kindPodPath  = "/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod" + "3c4d5e6f_7a8b_4c9d_8e0f_1a2b3c4d5e6f" + ".slice"
	nodeAPodPath = "/node-a/kubepods/besteffort/pod" + nodeAUID

	brokerV2Path = "/kubepods/burstable/pod" + burstableUID + "/" + brokerID
)

var testTime = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func testClock() time.Time { return testTime }

// writeTree creates files (path → content) under a new temporary directory.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// v2Files returns the files of a cgroup v2 container directory at dir.
func v2Files(dir string, usageUsec, memory, max, io string) map[string]string {
	return map[string]string{
		dir + "/cgroup.controllers": "cpu io memory pids\n",
		dir + "/cpu.stat":           "usage_usec " + usageUsec + "\nuser_usec 0\nsystem_usec 0\n",
		dir + "/memory.current":     memory + "\n",
		dir + "/memory.max":         max + "\n",
		dir + "/io.stat":            io,
	}
}
