package cgroup

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestMemoryReference(t *testing.T) {
	tests := []struct {
		name   string
		root   string
		q      PodQuery
		bytes  float64
		source string
		why    []string
	}{
		{name: "the container's own limit", root: kindRoot, q: PodQuery{UID: kindUID, ContainerID: exporterID},
			bytes: 32 << 20, source: RefContainerLimit, why: []string{"the container's memory limit (" + kindPodPath + "/cri-containerd-" + exporterID + ".scope)"}},
		{name: "no limit: the node's allocatable memory on kind's kubepods slice", root: kindRoot, q: PodQuery{UID: kindUID, ContainerID: brokerID},
			bytes: 3758096384, source: RefParentLimit, why: []string{"no memory limit on the container: the limit of /kubelet.slice/kubelet-kubepods.slice (the kubelet's kubepods cgroup: the node's allocatable memory)", "shared"}},
		{name: "no limit: a second kubelet's kubepods", root: nodeARoot, q: PodQuery{UID: nodeAUID, ContainerID: brokerID},
			bytes: 2 << 30, source: RefParentLimit, why: []string{"/node-a/kubepods (the kubelet's kubepods"}},
		{name: "no limit anywhere above: the machine's memory", root: v2Root, q: PodQuery{UID: besteffortUID, ContainerID: besteffortID},
			bytes: 8039260 << 10, source: RefMachineMemory, why: []string{"MemTotal in " + filepath.Join(procRoot, "meminfo")}},
		{name: "cgroup v1, limited", root: v1Root, q: PodQuery{UID: burstableUID, ContainerID: brokerID},
			bytes: 100 << 20, source: RefContainerLimit},
		{name: "cgroup v1, the pause container has none, nor has the pod", root: v1Root, q: PodQuery{UID: burstableUID, ContainerID: pauseID},
			bytes: 8039260 << 10, source: RefMachineMemory},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := OpenPod(tc.q, WithCgroupRoot(tc.root), WithProcRoot(procRoot))
			if err != nil {
				t.Fatal(err)
			}
			ref, err := r.MemoryReference()
			if err != nil {
				t.Fatal(err)
			}
			if ref.Bytes != tc.bytes || ref.Source != tc.source {
				t.Errorf("got %+v, want %v bytes from %s", ref, tc.bytes, tc.source)
			}
			for _, w := range tc.why {
				if !strings.Contains(ref.Why, w) {
					t.Errorf("why %q does not say %q", ref.Why, w)
				}
			}
		})
	}
}

func TestMemoryReferenceOfAProcessInALimitedContainer(t *testing.T) {
	r, err := ForPID(recordedNetPID, WithCgroupRoot(v2Root), WithProcRoot(procRoot))
	if err != nil {
		t.Skipf("recorded process: %v", err)
	}
	ref, err := r.MemoryReference()
	if err != nil || ref.Source != RefContainerLimit {
		t.Fatalf("got %+v, %v; the recorded broker process is in a limited container", ref, err)
	}
}

func TestMemoryReferenceErrorsNameTheFile(t *testing.T) {
	files := v2Files("kubepods/besteffort/pod"+besteffortUID+"/"+besteffortID, "1", "1", "max", "")
	files["cgroup.controllers"] = "memory\n"
	root := writeTree(t, files)
	proc := writeTree(t, map[string]string{"meminfo": "MemFree: 1 kB\n"})
	r, err := OpenPod(PodQuery{UID: besteffortUID, ContainerID: besteffortID}, WithCgroupRoot(root), WithProcRoot(proc))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.MemoryReference(); err == nil || !strings.Contains(err.Error(), filepath.Join(proc, "meminfo")+": no MemTotal line") {
		t.Errorf("error %v, want one naming the meminfo file", err)
	}
}
