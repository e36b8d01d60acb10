package pause

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

func TestInLeafMatchesTheLastElementOfAnyHierarchy(t *testing.T) {
	for _, tc := range []struct {
		name, cgroup, leaf string
		want               bool
	}{
		{"v1, host namespace", "12:memory:/kubepods/burstable/pod1/abc\n11:cpu,cpuacct:/kubepods/burstable/pod1/abc\n", "abc", true},
		{"v2, container namespace", "0::/../abc\n", "abc", true},
		{"v2, systemd scope", "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope\n", "cri-containerd-abc.scope", true},
		{"a sibling container", "0::/../abd\n", "abc", false},
		{"the pod, not the container", "12:memory:/kubepods/burstable/abc/def\n", "abc", false},
		{"empty", "", "abc", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := inLeaf([]byte(tc.cgroup), tc.leaf); got != tc.want {
				t.Errorf("inLeaf(%q, %q) = %v, want %v", tc.cgroup, tc.leaf, got, tc.want)
			}
		})
	}
}

func TestTermInReadsThreadAndProcessPendingMasks(t *testing.T) {
	for _, tc := range []struct {
		name, status string
		want         bool
	}{
		{"none pending", "State:\tT (stopped)\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n", false},
		{"TERM for the process", "SigPnd:\t0000000000000000\nShdPnd:\t0000000000004000\n", true},
		{"TERM for the thread", "SigPnd:\t0000000000004000\nShdPnd:\t0000000000000000\n", true},
		{"only HUP", "ShdPnd:\t0000000000000001\n", false},
		{"TERM blocked is not pending", "SigBlk:\t0000000000004000\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := termIn([]byte(tc.status)); got != tc.want {
				t.Errorf("termIn = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPIDsListsTheContainersProcessesOnly(t *testing.T) {
	proc := t.TempDir()
	write := func(pid, cgroup string) {
		if err := os.MkdirAll(filepath.Join(proc, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(proc, pid, "cgroup"), []byte(cgroup), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("7", "0::/../broker\n")
	write("9", "0::/../broker\n")
	write("8", "0::/\n")                                // the sidecar's own container
	write("1", "0::/../pause\n")                        // the pod's sandbox
	write(strconv.Itoa(os.Getpid()), "0::/../broker\n") // never this process
	if err := os.Mkdir(filepath.Join(proc, "self"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := Container{Proc: proc, Leaf: "broker"}.PIDs()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if !slices.Equal(got, []int{7, 9}) {
		t.Errorf("PIDs = %v, want [7 9]", got)
	}
	if _, err := (Container{Proc: proc, Leaf: "a/b"}).PIDs(); err == nil {
		t.Error("a leaf with a slash was accepted")
	}
}
