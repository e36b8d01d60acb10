package cgroup

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// kubeletLayouts are where the kubelet and containerd put a burstable pod's
// cgroup and its containers', for each cgroup driver, relative to the
// hierarchy's root.
var kubeletLayouts = []struct {
	driver    string
	pod       func(uid string) string
	container func(id string) string // relative to the pod's cgroup
	runtime   string                 // Container.Runtime
}{
	{
		driver:    "cgroupfs",
		pod:       func(uid string) string { return "kubepods/burstable/pod" + uid },
		container: func(id string) string { return id },
	},
	{
		driver: "systemd",
		pod: func(uid string) string {
			return "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice"
		},
		container: func(id string) string { return "cri-containerd-" + id + ".scope" },
		runtime:   "cri-containerd",
	},
}

// A pod built in real cgroups as the kubelet lays it out, with a real
// sandbox, broker and sidecar process in their container cgroups: found and
// read from the node by container ID and by PID, and from inside the
// sidecar's own cgroup namespace by exclusion, as the sidecar finds it; and
// once the broker's container is gone, reads fail with ErrGone.
func TestPodOnRealKubeletLayout(t *testing.T) {
	for _, layout := range kubeletLayouts {
		t.Run(layout.driver, func(t *testing.T) {
			node := newRealCgroup(t)
			uid := randomUID(t)
			pauseID, brokerID, sidecarID := randomHex(t, 64), randomHex(t, 64), randomHex(t, 64)
			podCg := node.sub(t, layout.pod(uid))
			pauseCg := podCg.sub(t, layout.container(pauseID))
			brokerCg := podCg.sub(t, layout.container(brokerID))
			sidecarCg := podCg.sub(t, layout.container(sidecarID))
			brokerCg.limit(t)
			root := node.asRoot(t)
			startChild(t, pauseCg, rolePause)
			broker := startChild(t, brokerCg, roleWork)

			podPath := "/" + layout.pod(uid)
			pod, err := FindPod(uid, WithCgroupRoot(root))
			if err != nil {
				t.Fatal(err)
			}
			wantIDs := []string{pauseID, brokerID, sidecarID}
			slices.Sort(wantIDs)
			var ids []string
			for _, c := range pod.Containers {
				ids = append(ids, c.ID)
				if c.Runtime != layout.runtime {
					t.Errorf("container %s runtime %q, want %q", c.ID, c.Runtime, layout.runtime)
				}
			}
			if pod.Driver != layout.driver || pod.QoS != "burstable" || pod.Path != podPath || !slices.Equal(ids, wantIDs) {
				t.Errorf("pod %+v\nwant driver %s, burstable, path %s, containers %v", pod, layout.driver, podPath, wantIDs)
			}

			// The sandbox has no limits: memory.max "max" (v1: the no-limit
			// value) reads as 0.
			pr, err := OpenPod(PodQuery{UID: uid, ContainerID: pauseID}, WithCgroupRoot(root))
			if err != nil {
				t.Fatal(err)
			}
			if s := mustRead(t, pr); s.MemoryLimitBytes != 0 || s.MemoryBytes <= 0 {
				t.Errorf("sandbox reading %+v: want memory > 0 and no limit (0)", s)
			}

			wantPath := path.Join(podPath, layout.container(brokerID))
			ways := []struct {
				name string
				find func(t *testing.T) (Container, Stats, string)
			}{
				{name: "by container ID from the node", find: func(t *testing.T) (Container, Stats, string) {
					return findAndRead(t, PodQuery{UID: uid, ContainerID: brokerID}, root)
				}},
				{name: "by PID from the node", find: func(t *testing.T) (Container, Stats, string) {
					return findAndRead(t, PodQuery{UID: uid, PID: broker.pid}, root)
				}},
				{name: "by exclusion from inside the sidecar's cgroup namespace", find: func(t *testing.T) (Container, Stats, string) {
					return findFromSidecar(t, node, sidecarCg, nsRequest{UID: uid, HostRoot: root, Target: broker.pid})
				}},
				{name: "by PID from inside the sidecar's cgroup namespace (shareProcessNamespace)", find: func(t *testing.T) (Container, Stats, string) {
					return findFromSidecar(t, node, sidecarCg, nsRequest{UID: uid, HostRoot: root, PID: broker.pid, Target: broker.pid})
				}},
				{name: "by exclusion from the sidecar's own PID namespace, the sandbox known by its /etc/hostname", find: func(t *testing.T) (Container, Stats, string) {
					if os.Getenv("AMF_TEST_EXEC_WRAPPER") != "" {
						// qemu-user emulates clone with the flags of fork and
						// threads only; the native run covers this case.
						t.Skip("running under an emulator, which cannot clone into a new PID namespace")
					}
					if _, err := os.Stat("/etc/hostname"); err != nil {
						skipOrFail(t, "no /etc/hostname to bind the sandbox's over: %v", err)
					}
					// Where containerd keeps a sandbox's files.
					hostname := filepath.Join(t.TempDir(), "sandboxes", pauseID, "hostname")
					if err := os.MkdirAll(filepath.Dir(hostname), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(hostname, []byte("broker-pod\n"), 0o644); err != nil {
						t.Fatal(err)
					}
					return findFromSidecar(t, node, sidecarCg, nsRequest{UID: uid, HostRoot: root, OwnPIDs: true, Sandbox: hostname})
				}},
			}
			for _, w := range ways {
				t.Run(w.name, func(t *testing.T) {
					c, s, desc := w.find(t)
					t.Logf("reader: %s", desc)
					if c.ID != brokerID || c.Path != wantPath {
						t.Errorf("found %+v, want the broker %s at %s", c, brokerID, wantPath)
					}
					checkChildStats(t, brokerCg, broker, s)
				})
			}

			r, err := OpenPod(PodQuery{UID: uid, ContainerID: brokerID}, WithCgroupRoot(root), WithPID(os.Getpid()))
			if err != nil {
				t.Fatal(err)
			}
			mustRead(t, r)
			broker.stop()
			if err := brokerCg.remove(); err != nil {
				t.Fatal(err)
			}
			_, err = r.Read(t.Context())
			if !errors.Is(err, ErrGone) || !strings.Contains(err.Error(), wantPath) {
				t.Errorf("Read after the broker's container was removed = %v, want ErrGone naming %s", err, wantPath)
			}
		})
	}
}

// findAndRead finds q's container from the node's view and reads it.
func findAndRead(t *testing.T, q PodQuery, root string) (Container, Stats, string) {
	t.Helper()
	c, err := FindContainer(q, WithCgroupRoot(root))
	if err != nil {
		t.Fatal(err)
	}
	r, err := OpenPod(q, WithCgroupRoot(root), WithPID(os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	return c, mustRead(t, r), fmt.Sprint(r)
}

// findFromSidecar runs a sidecar child in c, which finds and reads the
// target from inside its own cgroup (and, on v2, mount) namespace.
func findFromSidecar(t *testing.T, node, c *realCgroup, req nsRequest) (Container, Stats, string) {
	t.Helper()
	if node.v2 {
		req.Bind = t.TempDir()
	}
	b, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	sc := startChild(t, c, roleSidecar, childNSEnv+"="+string(b))
	// It ends by itself once it has said what it found, and its child
	// before it.
	select {
	case <-sc.done:
	case <-time.After(childTimeout):
		t.Fatalf("the sidecar still runs %v after its result", childTimeout)
	}
	if !sc.state.Success() {
		t.Errorf("the sidecar ended %v", sc.state)
	}
	var rep nsReport
	if err := json.Unmarshal([]byte(sc.said), &rep); err != nil {
		t.Fatalf("sidecar said %q: %v", sc.said, err)
	}
	if rep.Err != "" {
		t.Fatalf("sidecar, seeing %q as its cgroups: %s", rep.SelfCgroup, rep.Err)
	}
	if req.OwnPIDs && rep.PID != 1 {
		t.Errorf("sidecar's PID %d, want 1 in its own PID namespace", rep.PID)
	}
	// Its own cgroup is its namespace's root.
	for _, l := range strings.Split(strings.TrimSpace(rep.SelfCgroup), "\n") {
		if !strings.HasSuffix(l, ":/") {
			t.Errorf("sidecar's /proc/self/cgroup line %q: want the namespace's root \"/\"", l)
		}
	}
	if node.v2 {
		// Through its own cgroup2 mount, its cgroup is read, not the process.
		if !strings.Contains(rep.Self, "cgroup v2 "+DefaultCgroupRoot) || rep.SelfStats.MemoryBytes <= 0 {
			t.Errorf("sidecar's ForPID of itself: %q, %+v; want its namespace's cgroup %s read", rep.Self, rep.SelfStats, DefaultCgroupRoot)
		}
	}
	// The target is outside its cgroup namespace: process mode cannot read
	// it from there, and says so rather than reading another cgroup.
	if req.Target > 0 && !strings.Contains(rep.TargetByPID, "outside this process's cgroup namespace") {
		t.Errorf("sidecar's ForPID of the target: %s; want an error saying it is outside the cgroup namespace", rep.TargetByPID)
	}
	return rep.Container, rep.Stats, rep.Reader
}
