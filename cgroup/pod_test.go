package cgroup

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestFindPodLayouts(t *testing.T) {
	us := func(uid string) string { return strings.ReplaceAll(uid, "-", "_") }
	tests := []struct {
		name    string
		root    string
		uid     string
		qos     string
		driver  string
		path    string
		ids     []string
		runtime string
	}{
		{name: "cgroupfs burstable", root: v2Root, uid: burstableUID, qos: "burstable", driver: "cgroupfs",
			path: "/kubepods/burstable/pod" + burstableUID, ids: []string{brokerID, pauseID, sidecarID}},
		{name: "cgroupfs guaranteed sits under kubepods", root: v2Root, uid: guaranteedUID, qos: "guaranteed", driver: "cgroupfs",
			path: "/kubepods/pod" + guaranteedUID, ids: []string{guaranteedPauseID, guaranteedID}},
		{name: "cgroupfs besteffort", root: v2Root, uid: besteffortUID, qos: "besteffort", driver: "cgroupfs",
			path: "/kubepods/besteffort/pod" + besteffortUID, ids: []string{besteffortID, besteffortPauseID}},
		{name: "systemd guaranteed containerd", root: systemdRoot, uid: guaranteedUID, qos: "guaranteed", driver: "systemd",
			path: "/kubepods.slice/kubepods-pod" + us(guaranteedUID) + ".slice", ids: []string{guaranteedPauseID, guaranteedID}, runtime: "cri-containerd"},
		{name: "systemd burstable crio skips conmon", root: systemdRoot, uid: burstableUID, qos: "burstable", driver: "systemd",
			path: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + us(burstableUID) + ".slice", ids: []string{brokerID, pauseID}, runtime: "crio"},
		{name: "systemd besteffort docker", root: systemdRoot, uid: besteffortUID, qos: "besteffort", driver: "systemd",
			path: "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + us(besteffortUID) + ".slice", ids: []string{besteffortID, besteffortPauseID}, runtime: "docker"},
		{name: "UID with underscores", root: systemdRoot, uid: us(besteffortUID), qos: "besteffort", driver: "systemd",
			path: "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + us(besteffortUID) + ".slice", ids: []string{besteffortID, besteffortPauseID}, runtime: "docker"},
		{name: "cgroup v1 through the memory controller", root: v1Root, uid: burstableUID, qos: "burstable", driver: "cgroupfs",
			path: "/kubepods/burstable/pod" + burstableUID, ids: []string{brokerID, pauseID, sidecarID}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod, err := FindPod(tc.uid, WithCgroupRoot(tc.root))
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, c := range pod.Containers {
				ids = append(ids, c.ID)
				if c.Runtime != tc.runtime {
					t.Errorf("container %s runtime %q, want %q", c.ID, c.Runtime, tc.runtime)
				}
				if !strings.HasPrefix(c.Path, tc.path+"/") {
					t.Errorf("container path %s not under %s", c.Path, tc.path)
				}
			}
			if pod.UID != strings.ReplaceAll(tc.uid, "_", "-") || pod.QoS != tc.qos || pod.Driver != tc.driver || pod.Path != tc.path || !slices.Equal(ids, tc.ids) {
				t.Errorf("got %+v (ids %v)\nwant qos %s driver %s path %s ids %v", pod, ids, tc.qos, tc.driver, tc.path, tc.ids)
			}
		})
	}
}

func TestFindPodErrorsSayWhatToDo(t *testing.T) {
	tests := []struct {
		name     string
		uid      string
		contains []string
	}{
		{name: "unknown pod", uid: "11111111-2222-3333-4444-555555555555", contains: []string{
			"no pod cgroup", filepath.Join(v2Root, "kubepods", "burstable", "pod11111111-2222-3333-4444-555555555555"),
			"kubepods.slice", "mount the host /sys/fs/cgroup read-only", "POD_UID", "downward API"}},
		{name: "empty UID", uid: "", contains: []string{"not a pod UID", "POD_UID"}},
		{name: "path in UID", uid: "../../etc", contains: []string{"not a pod UID"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := FindPod(tc.uid, WithCgroupRoot(v2Root))
			if err == nil {
				t.Fatal("no error")
			}
			for _, c := range tc.contains {
				if !strings.Contains(err.Error(), c) {
					t.Errorf("error %q does not contain %q", err, c)
				}
			}
		})
	}
}

func TestFindContainerByID(t *testing.T) {
	tests := []struct {
		name string
		id   string
		want string
		err  string
	}{
		{name: "full ID", id: brokerID, want: brokerID},
		{name: "12-digit prefix", id: brokerID[:12], want: brokerID},
		{name: "pod status form", id: "containerd://" + brokerID, want: brokerID},
		{name: "upper case", id: strings.ToUpper(brokerID), want: brokerID},
		{name: "too short", id: brokerID[:8], err: "at least 12 hex digits"},
		{name: "unknown lists the containers", id: strings.Repeat("0", 64), err: pauseID},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := FindContainer(PodQuery{UID: burstableUID, ContainerID: tc.id}, WithCgroupRoot(v2Root))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %+v, %v; want error with %q", c, err, tc.err)
				}
				return
			}
			if err != nil || c.ID != tc.want {
				t.Fatalf("got %+v, %v; want %s", c, err, tc.want)
			}
		})
	}
}

func TestFindContainerByPID(t *testing.T) {
	tests := []struct {
		name   string
		cgroup string
		want   string
		err    string
	}{
		{name: "full path", cgroup: "0::/kubepods/burstable/pod" + burstableUID + "/" + brokerID + "\n", want: brokerID},
		{name: "path relative to the caller's cgroup namespace", cgroup: "0::/../" + brokerID + "\n", want: brokerID},
		{name: "v1 systemd scope name", cgroup: "4:memory:/kubepods.slice/x.slice/crio-" + pauseID + ".scope\n1:name=systemd:/\n", want: pauseID},
		{name: "process outside the pod", cgroup: "0::/user.slice\n", err: "in none of the pod's containers"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			proc := writeTree(t, map[string]string{"31/cgroup": tc.cgroup})
			c, err := FindContainer(PodQuery{UID: burstableUID, PID: 31}, WithCgroupRoot(v2Root), WithProcRoot(proc))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %+v, %v; want error with %q", c, err, tc.err)
				}
				return
			}
			if err != nil || c.ID != tc.want {
				t.Fatalf("got %+v, %v; want %s", c, err, tc.want)
			}
		})
	}
	if _, err := FindContainer(PodQuery{UID: burstableUID, PID: 99999999}, WithCgroupRoot(v2Root), WithProcRoot(procRoot)); err == nil || !strings.Contains(err.Error(), "shareProcessNamespace") {
		t.Errorf("invisible process: %v, want a hint about shareProcessNamespace", err)
	}
}

func TestFindContainerByExclusion(t *testing.T) {
	pid := strconv.Itoa(os.Getpid())
	sandboxMountinfo := "900 800 254:0 /var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/" + pauseID + "/hostname /etc/hostname rw,relatime - ext4 /dev/vda rw\n" +
		"901 800 254:0 /var/lib/kubelet/pods/" + burstableUID + "/etc-hosts /etc/hosts rw,relatime - ext4 /dev/vda rw\n"
	selfCgroupV1 := "10:memory:/kubepods/burstable/pod" + burstableUID + "/" + sidecarID + "\n0::/\n"
	pod := "kubepods/burstable/pod" + burstableUID + "/"

	// A tree where cgroup.procs shows what a sidecar would see: its own PID
	// in its own container, and with shareProcessNamespace the pause process.
	liveTree := func(t *testing.T, pausePID string) string {
		files := map[string]string{"cgroup.controllers": ""}
		for id, procs := range map[string]string{brokerID: "0\n0\n", sidecarID: pid + "\n", pauseID: pausePID + "\n"} {
			files[pod+id+"/cgroup.procs"] = procs
		}
		return writeTree(t, files)
	}
	tests := []struct {
		name    string
		root    func(t *testing.T) string
		proc    map[string]string
		exclude []string
		want    string
		err     []string
	}{
		{name: "caller excludes sidecar and pause", exclude: []string{sidecarID, pauseID[:12]}, want: brokerID},
		{name: "self from /proc/self/cgroup, pause excluded by caller",
			proc: map[string]string{"self/cgroup": selfCgroupV1}, exclude: []string{pauseID}, want: brokerID},
		{name: "self from /proc/self/cgroup, sandbox from mountinfo",
			proc: map[string]string{"self/cgroup": selfCgroupV1, "self/mountinfo": sandboxMountinfo}, want: brokerID},
		{name: "self from cgroup.procs in a cgroup namespace, pause by its process name",
			root: func(t *testing.T) string { return liveTree(t, "4100") },
			proc: map[string]string{"self/cgroup": "0::/\n", "4100/comm": "pause\n"}, want: brokerID},
		{name: "pause not recognisable without a shared PID namespace",
			root: func(t *testing.T) string { return liveTree(t, "0") },
			proc: map[string]string{"self/cgroup": "0::/\n"},
			err:  []string{"2 containers could be the target", brokerID, pauseID, sidecarID + " (the caller's own container)", "pass the target's container ID"}},
		{name: "nothing recognisable lists all three",
			proc: map[string]string{"self/cgroup": "0::/\n"},
			err:  []string{"3 containers could be the target", "excluded none"}},
		{name: "everything excluded",
			exclude: []string{brokerID, sidecarID, pauseID}, err: []string{"no container left", "excluded by the caller"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := v2Root
			if tc.root != nil {
				root = tc.root(t)
			}
			proc := writeTree(t, tc.proc)
			c, err := FindContainer(PodQuery{UID: burstableUID, Exclude: tc.exclude}, WithCgroupRoot(root), WithProcRoot(proc))
			if tc.err != nil {
				if err == nil {
					t.Fatalf("got %+v, want an error", c)
				}
				for _, s := range tc.err {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %q", err, s)
					}
				}
				return
			}
			if err != nil || c.ID != tc.want {
				t.Fatalf("got %+v, %v; want %s", c, err, tc.want)
			}
		})
	}
}

func TestOpenPodReadsTheTarget(t *testing.T) {
	tests := []struct {
		name   string
		root   string
		q      PodQuery
		memory float64
		limit  float64
	}{
		{name: "cgroupfs v2 burstable by exclusion", root: v2Root, q: PodQuery{UID: burstableUID, Exclude: []string{sidecarID, pauseID}}, memory: brokerMemory, limit: brokerLimit},
		{name: "cgroupfs v2 guaranteed", root: v2Root, q: PodQuery{UID: guaranteedUID, Exclude: []string{guaranteedPauseID}}, memory: 20971520, limit: brokerLimit},
		{name: "cgroupfs v2 besteffort has no limit", root: v2Root, q: PodQuery{UID: besteffortUID, ContainerID: besteffortID}, memory: 15728640},
		{name: "systemd guaranteed", root: systemdRoot, q: PodQuery{UID: guaranteedUID, ContainerID: guaranteedID}, memory: 20971520, limit: brokerLimit},
		{name: "systemd burstable crio", root: systemdRoot, q: PodQuery{UID: burstableUID, Exclude: []string{pauseID}}, memory: brokerMemory, limit: brokerLimit},
		{name: "systemd besteffort docker", root: systemdRoot, q: PodQuery{UID: besteffortUID, ContainerID: besteffortID}, memory: 15728640},
		{name: "cgroupfs v1", root: v1Root, q: PodQuery{UID: burstableUID, ContainerID: brokerID}, memory: brokerMemory, limit: brokerLimit},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := OpenPod(tc.q, WithCgroupRoot(tc.root), WithProcRoot(procRoot), WithPID(recordedNetPID))
			if err != nil {
				t.Fatal(err)
			}
			s := mustRead(t, r)
			if s.MemoryBytes != tc.memory || s.MemoryLimitBytes != tc.limit || s.NetworkBytes != recordedNet || !s.HasNetwork {
				t.Errorf("got %+v, want memory %v limit %v network %v", s, tc.memory, tc.limit, recordedNet)
			}
		})
	}
}

func TestParseContainerName(t *testing.T) {
	tests := []struct {
		name, runtime, id string
		ok                bool
	}{
		{name: brokerID, id: brokerID, ok: true},
		{name: "cri-containerd-" + brokerID + ".scope", runtime: "cri-containerd", id: brokerID, ok: true},
		{name: "crio-" + brokerID + ".scope", runtime: "crio", id: brokerID, ok: true},
		{name: "crio-" + brokerID, runtime: "crio", id: brokerID, ok: true},
		{name: "docker-" + brokerID + ".scope", runtime: "docker", id: brokerID, ok: true},
		{name: "crio-conmon-" + brokerID + ".scope"},
		{name: "kubepods-burstable.slice"},
		{name: "init.scope"},
		{name: "abc"},
	}
	for _, tc := range tests {
		rt, id, ok := parseContainerName(tc.name)
		if rt != tc.runtime || id != tc.id || ok != tc.ok {
			t.Errorf("parseContainerName(%q) = %q, %q, %v; want %q, %q, %v", tc.name, rt, id, ok, tc.runtime, tc.id, tc.ok)
		}
	}
}

func TestFindPodUnderAKubeletCgroupRootOfItsOwn(t *testing.T) {
	deep := "/machine.slice/node-7/sandbox/kubelet/kubepods/burstable/pod" + burstableUID
	deepTree := func(t *testing.T) string {
		files := v2Files(deep[1:]+"/"+brokerID, "1", "1", "max", "")
		files["cgroup.controllers"] = "cpu io memory\n"
		return writeTree(t, files)
	}
	tests := []struct {
		name       string
		root       func(t *testing.T) string
		uid        string
		kubelet    string // WithKubeletCgroupRoot; "" = find it
		selfCgroup string // /proc/self/cgroup; "" = none
		qos        string
		driver     string
		path       string
		ids        []string
	}{
		{name: "kind, systemd driver, found by search", root: fixed(kindRoot), uid: kindUID, qos: "burstable", driver: "systemd",
			path: kindPodPath, ids: []string{brokerID, pauseID, sidecarID, exporterID}},
		{name: "kind, root given as the kubelet's cgroupRoot", root: fixed(kindRoot), uid: kindUID, kubelet: "/kubelet", qos: "burstable", driver: "systemd",
			path: kindPodPath, ids: []string{brokerID, pauseID, sidecarID, exporterID}},
		{name: "kind, root given as its slice", root: fixed(kindRoot), uid: kindUID, kubelet: "/kubelet.slice", qos: "burstable", driver: "systemd",
			path: kindPodPath, ids: []string{brokerID, pauseID, sidecarID, exporterID}},
		{name: "cgroupfs root beside the default one, found by search", root: fixed(nodeARoot), uid: nodeAUID, qos: "besteffort", driver: "cgroupfs",
			path: nodeAPodPath, ids: []string{brokerID, pauseID, sidecarID}},
		{name: "cgroupfs root given", root: fixed(nodeARoot), uid: nodeAUID, kubelet: "node-a", qos: "besteffort", driver: "cgroupfs",
			path: nodeAPodPath, ids: []string{brokerID, pauseID, sidecarID}},
		{name: "the default root still comes first", root: fixed(nodeARoot), uid: guaranteedUID, qos: "besteffort", driver: "cgroupfs",
			path: "/kubepods/besteffort/pod" + guaranteedUID, ids: []string{guaranteedID}},
		{name: "too deep to search, found on this process's cgroup path", root: deepTree, uid: burstableUID,
			selfCgroup: "12:memory:/\n0::" + deep + "/" + sidecarID + "\n", qos: "burstable", driver: "cgroupfs", path: deep, ids: []string{brokerID}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := []Option{WithCgroupRoot(tc.root(t)), WithProcRoot(writeTree(t, map[string]string{"self/cgroup": tc.selfCgroup}))}
			if tc.kubelet != "" {
				opts = append(opts, WithKubeletCgroupRoot(tc.kubelet))
			}
			pod, err := FindPod(tc.uid, opts...)
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, c := range pod.Containers {
				ids = append(ids, c.ID)
			}
			if pod.QoS != tc.qos || pod.Driver != tc.driver || pod.Path != tc.path || !slices.Equal(ids, tc.ids) {
				t.Errorf("got %+v (ids %v)\nwant qos %s driver %s path %s ids %v", pod, ids, tc.qos, tc.driver, tc.path, tc.ids)
			}
		})
	}
}

func fixed(dir string) func(*testing.T) string { return func(*testing.T) string { return dir } }

func TestFindPodUnderAnyRootErrorsNameTheSearch(t *testing.T) {
	tests := []struct {
		name     string
		kubelet  string
		contains []string
	}{
		{name: "searched", contains: []string{"no pod cgroup at any of", "kubepods.slice",
			"below the kubepods directories within 4 levels", "/kubelet.slice/kubelet-kubepods.slice", "WithKubeletCgroupRoot", "POD_UID"}},
		{name: "wrong root given", kubelet: "/node-b", contains: []string{"no pod cgroup below the kubelet cgroup root /node-b",
			"kubepods directories there: none", "is /node-b the kubelet's --cgroup-root?"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := []Option{WithCgroupRoot(kindRoot), WithProcRoot(t.TempDir())}
			if tc.kubelet != "" {
				opts = append(opts, WithKubeletCgroupRoot(tc.kubelet))
			}
			_, err := FindPod("11111111-2222-3333-4444-555555555555", opts...)
			if err == nil {
				t.Fatal("no error")
			}
			for _, c := range tc.contains {
				if !strings.Contains(err.Error(), c) {
					t.Errorf("error %q does not contain %q", err, c)
				}
			}
		})
	}
}

func TestPodOnPath(t *testing.T) {
	us := strings.ReplaceAll(burstableUID, "-", "_")
	tests := []struct {
		path, want, qos string
	}{
		{"/kubepods/burstable/pod" + burstableUID + "/" + sidecarID, "/kubepods/burstable/pod" + burstableUID, "burstable"},
		{"/kubelet/kubepods/pod" + burstableUID + "/" + sidecarID, "/kubelet/kubepods/pod" + burstableUID, "guaranteed"},
		{"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + us + ".slice/cri-containerd-" + sidecarID + ".scope",
			"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod" + us + ".slice", "besteffort"},
		{"/kubepods/burstable/pod" + guaranteedUID + "/" + sidecarID, "", ""}, // another pod
		{"/", "", ""},
		{"/../" + sidecarID, "", ""},
		{"", "", ""},
	}
	for _, tc := range tests {
		p, ok := podOnPath(tc.path, burstableUID)
		if ok != (tc.want != "") || p.Path != tc.want || p.QoS != tc.qos {
			t.Errorf("podOnPath(%q) = %+v, %v; want %q %q", tc.path, p, ok, tc.want, tc.qos)
		}
	}
}

// logDir writes a /var/log/containers of symlinks, name → target, as the
// kubelet does (the targets need not exist: only the names are read).
func logDir(t *testing.T, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, n := range names {
		if err := os.Symlink("/var/log/pods/"+n, filepath.Join(dir, n)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestFindContainerByName(t *testing.T) {
	const pod, ns = "edge-broker-a-6d5f7c9b8-x2x7q", "mqtt"
	link := func(container, id string) string { return pod + "_" + ns + "_" + container + "-" + id + ".log" }
	oldBroker := strings.Repeat("0a", 32)
	kindLinks := []string{link("amf-sidecar", sidecarID), link("mosquitto", brokerID), link("exporter", exporterID),
		"other-0_mqtt_mosquitto-" + oldBroker + ".log", "coredns-1_kube-system_coredns-" + strings.Repeat("1b", 32) + ".log"}
	tests := []struct {
		name string
		root string
		uid  string
		q    PodQuery
		logs []string // nil: no log directory mounted
		want string
		via  string
		err  []string
	}{
		{name: "the broker beside an exporter", root: kindRoot, uid: kindUID, q: PodQuery{Name: "mosquitto"}, logs: kindLinks,
			want: brokerID, via: "by name, from "},
		{name: "the exporter, if asked", root: kindRoot, uid: kindUID, q: PodQuery{Name: "exporter"}, logs: kindLinks, want: exporterID},
		{name: "a restarted container: the dead one's symlink is still there", root: kindRoot, uid: kindUID, q: PodQuery{Name: "mosquitto"},
			logs: append([]string{link("mosquitto", oldBroker)}, kindLinks...), want: brokerID},
		{name: "a name cut by the kubelet's 255-byte limit", root: kindRoot, uid: kindUID, q: PodQuery{Name: "mosquitto"},
			logs: []string{link("mosquitto", brokerID[:20])}, want: brokerID},
		{name: "a name that matches nothing lists the pod's containers", root: kindRoot, uid: kindUID, q: PodQuery{Name: "broker"}, logs: kindLinks,
			err: []string{`pod mqtt/` + pod + ` has no container "broker"`, "names amf-sidecar, exporter, mosquitto"}},
		{name: "only a dead container of that name", root: kindRoot, uid: kindUID, q: PodQuery{Name: "mosquitto"}, logs: []string{link("mosquitto", oldBroker)},
			err: []string{`container "mosquitto" of pod mqtt/` + pod + ` is not running`, oldBroker, "restarting?"}},
		{name: "no symlink of this pod: one container left by elimination, name unchecked", root: nodeARoot, uid: nodeAUID,
			q: PodQuery{Name: "mosquitto", Exclude: []string{sidecarID, pauseID}}, logs: kindLinks[3:], want: brokerID,
			via: "the only container besides this one and the sandbox; name not checked: container names unknown: no symlink of pod mqtt/" + pod},
		{name: "no log directory and two candidates: says why the name did not help", root: kindRoot, uid: kindUID,
			q:   PodQuery{Name: "mosquitto", Exclude: []string{sidecarID, pauseID}},
			err: []string{"2 containers could be the target", `container "mosquitto" could not be looked up by name`, "no container log directory given"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			q := tc.q
			q.UID, q.PodName, q.Namespace = tc.uid, pod, ns
			if tc.logs != nil {
				q.LogDir = logDir(t, tc.logs...)
			}
			c, err := FindContainer(q, WithCgroupRoot(tc.root), WithProcRoot(t.TempDir()))
			if tc.err != nil {
				if err == nil {
					t.Fatalf("got %+v, want an error", c)
				}
				for _, s := range tc.err {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %q", err, s)
					}
				}
				return
			}
			if err != nil || c.ID != tc.want || c.Name != q.Name || !strings.Contains(c.Via, tc.via) {
				t.Fatalf("got %+v, %v; want %s named %s via %q", c, err, tc.want, q.Name, tc.via)
			}
		})
	}
}

func TestFindContainerByNameNeedsThePodsName(t *testing.T) {
	_, err := FindContainer(PodQuery{UID: kindUID, Name: "mosquitto", LogDir: t.TempDir(), Exclude: []string{sidecarID, pauseID}},
		WithCgroupRoot(kindRoot), WithProcRoot(t.TempDir()))
	if err == nil || !strings.Contains(err.Error(), "set POD_NAME and POD_NAMESPACE from the downward API") {
		t.Fatalf("error %v, want one asking for POD_NAME and POD_NAMESPACE", err)
	}
}
