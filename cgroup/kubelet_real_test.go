package cgroup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A real kubelet + containerd node, as far as the cgroups go: a pod's
// cgroups at <kubelet root>/kubepods/<qos>/pod<uid>/<container id> in every
// v1 hierarchy, the sandbox's pause process in one of them, the sidecar in
// another, and two app containers (a broker and an exporter). The sidecar is
// a child of this test binary that runs FindContainer from inside its own
// container cgroup, as amf-sidecar does in a pod.

// Child modes (childEnv values) of this file.
const (
	childIdle     = "idle" // allocate childAllocEnv bytes, say "ready", sleep
	childFind     = "find" // run FindContainer with childQueryEnv, print the result as JSON
	childAllocEnv = "AMF_CGROUP_TEST_ALLOC"
	childQueryEnv = "AMF_CGROUP_TEST_QUERY"
)

// runIdleChild and runFindChild run once told to go (runChild).
func runIdleChild() int {
	n, _ := strconv.Atoi(os.Getenv(childAllocEnv))
	mem := make([]byte, n)
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 1
	}
	fmt.Println("ready")
	for {
		time.Sleep(time.Hour)
		mem[0]++
	}
}

// findQuery is what the find child is asked, findResult what it answers.
type findQuery struct {
	Query       PodQuery
	KubeletRoot string
}

type findResult struct {
	ID, Name, Via, PodPath, Err string
	MemoryBytes                 float64
	Reference                   MemoryReference
}

func runFindChild() int {
	var fq findQuery
	if err := json.Unmarshal([]byte(os.Getenv(childQueryEnv)), &fq); err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	var opts []Option
	if fq.KubeletRoot != "" {
		opts = append(opts, WithKubeletCgroupRoot(fq.KubeletRoot))
	}
	var res findResult
	if pod, err := FindPod(fq.Query.UID, opts...); err == nil {
		res.PodPath = pod.Path
	}
	c, err := FindContainer(fq.Query, opts...)
	if err == nil {
		res.ID, res.Name, res.Via = c.ID, c.Name, c.Via
		var r Reader
		if r, err = Open(c.Path, WithPID(os.Getpid())); err == nil {
			var s Stats
			if s, err = r.Read(context.Background()); err == nil {
				res.MemoryBytes = s.MemoryBytes
				res.Reference, err = r.MemoryReference()
			}
		}
	}
	if err != nil {
		res.Err = err.Error()
	}
	b, _ := json.Marshal(res)
	fmt.Println(string(b))
	return 0
}

// realTree creates cgroups in every v1 hierarchy this package reads.
type realTree struct {
	l layout
}

func newRealTree(t *testing.T) realTree {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skip: creating real cgroups needs root")
	}
	l, err := loadLayout(newConfig(nil))
	if err != nil || !l.useV1() {
		t.Skipf("skip: no cgroup v1 controllers mounted (%v)", err)
	}
	for _, c := range v1Controllers {
		if _, ok := l.v1[c]; !ok {
			t.Skipf("skip: cgroup v1 controller %s not mounted", c)
		}
	}
	return realTree{l: l}
}

// dirs are the directories of hierarchy path p, one per distinct mount.
func (r realTree) dirs(t *testing.T, p string) []string {
	t.Helper()
	var ds []string
	for _, c := range v1Controllers {
		d, err := r.l.v1[c].dir(p)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(ds, d) {
			ds = append(ds, d)
		}
	}
	return ds
}

// mkdir creates hierarchy path p and the parents it lacks, each removed at
// cleanup (after the processes started later are stopped: cleanups run last
// first).
func (r realTree) mkdir(t *testing.T, p string) []string {
	t.Helper()
	elems := strings.Split(strings.Trim(p, "/"), "/")
	for i := range elems {
		for _, d := range r.dirs(t, "/"+strings.Join(elems[:i+1], "/")) {
			err := os.Mkdir(d, 0o755)
			if errors.Is(err, os.ErrExist) {
				continue
			}
			if err != nil {
				t.Fatalf("create cgroup: %v", err)
			}
			t.Cleanup(func() {
				if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
					t.Errorf("remove test cgroup: %v", err)
				}
			})
		}
	}
	return r.dirs(t, p)
}

func (r realTree) setMemoryLimit(t *testing.T, p string, bytes int) {
	t.Helper()
	d, _ := r.l.v1[ctrlMemory].dir(p)
	if err := os.WriteFile(filepath.Join(d, "memory.limit_in_bytes"), []byte(strconv.Itoa(bytes)), 0o644); err != nil {
		t.Fatalf("set memory limit of %s: %v", p, err)
	}
}

func TestDiscoveryOnARealKubeletLayout(t *testing.T) {
	tree := newRealTree(t)
	u := randomHex(t, 32)
	uid := u[:8] + "-" + u[8:12] + "-" + u[12:16] + "-" + u[16:20] + "-" + u[20:]
	kubeletRoot := "/amf-test-kubelet-" + randomHex(t, 8) // not /: as kind's /kubelet
	podPath := kubeletRoot + "/kubepods/besteffort/pod" + uid
	const podName, ns = "edge-broker-a-5c6d7f8b9-q2w3e", "mqtt"
	ids := map[string]string{}
	for _, c := range []string{"pause", "amf-sidecar", "mosquitto", "exporter"} {
		ids[c] = randomHex(t, 64)
		tree.mkdir(t, podPath+"/"+ids[c])
	}
	// A pod-level limit (pod-level resources, or every container limited)
	// and an exporter with a limit of its own; the broker has none.
	const podLimit, exporterLimit = 256 << 20, 32 << 20
	tree.setMemoryLimit(t, podPath, podLimit)
	tree.setMemoryLimit(t, podPath+"/"+ids["exporter"], exporterLimit)
	// The sandbox: one process whose name is "pause", as the pause image's.
	pauseExe := filepath.Join(t.TempDir(), "pause")
	if err := os.Symlink(os.Args[0], pauseExe); err != nil {
		t.Fatal(err)
	}
	start := func(container, exe string, alloc int) *child {
		ch, line := spawnInCgroups(t, exe, tree.dirs(t, podPath+"/"+ids[container]), childEnv+"="+childIdle, childAllocEnv+"="+strconv.Itoa(alloc))
		if line != "ready" {
			t.Fatalf("%s said %q", container, line)
		}
		return ch
	}
	start("pause", pauseExe, 0)
	broker := start("mosquitto", os.Args[0], childAlloc)
	start("exporter", os.Args[0], 1<<20)

	link := func(container string) string {
		return podName + "_" + ns + "_" + container + "-" + ids[container] + ".log"
	}
	logs := t.TempDir()
	for _, c := range []string{"amf-sidecar", "mosquitto", "exporter"} {
		if err := os.Symlink("/var/log/pods/"+ns+"_"+podName+"_"+uid+"/"+c+"/0.log", filepath.Join(logs, link(c))); err != nil {
			t.Fatal(err)
		}
	}
	find := func(t *testing.T, q PodQuery, kubeletRoot string) findResult {
		t.Helper()
		q.UID, q.PodName, q.Namespace = uid, podName, ns
		b, err := json.Marshal(findQuery{Query: q, KubeletRoot: kubeletRoot})
		if err != nil {
			t.Fatal(err)
		}
		ch, line := spawnInCgroups(t, os.Args[0], tree.dirs(t, podPath+"/"+ids["amf-sidecar"]), childEnv+"="+childFind, childQueryEnv+"="+string(b))
		defer ch.stop()
		var res findResult
		if err := json.Unmarshal([]byte(line), &res); err != nil {
			t.Fatalf("sidecar child said %q: %v", line, err)
		}
		return res
	}

	tests := []struct {
		name        string
		q           PodQuery
		kubeletRoot string
		want        string   // container
		err         []string // in the error, with want ""
		// byComm: the case needs the pause child's process name, which an
		// emulator (AMF_TEST_EXEC_WRAPPER, qemu-user) replaces with its own.
		byComm bool
	}{
		{name: "the broker by name", q: PodQuery{Name: "mosquitto", LogDir: logs}, want: "mosquitto"},
		{name: "the exporter by name", q: PodQuery{Name: "exporter", LogDir: logs}, want: "exporter"},
		{name: "the broker by name under the kubelet root given", q: PodQuery{Name: "mosquitto", LogDir: logs}, kubeletRoot: kubeletRoot, want: "mosquitto"},
		{name: "a name that matches nothing", q: PodQuery{Name: "broker", LogDir: logs},
			err: []string{`has no container "broker"`, "names amf-sidecar, exporter, mosquitto"}},
		{name: "without names, the sidecar and pause are recognised and two are left", q: PodQuery{}, byComm: true,
			err: []string{"2 containers could be the target", ids["amf-sidecar"] + " (the caller's own container)", ids["pause"] + " (the pod's sandbox (pause) container)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.byComm && os.Getenv("AMF_TEST_EXEC_WRAPPER") != "" {
				t.Skip("children run under an emulator, whose process name hides the pause child's")
			}
			res := find(t, tc.q, tc.kubeletRoot)
			if res.PodPath != podPath {
				t.Errorf("pod found at %q, want %s", res.PodPath, podPath)
			}
			if tc.want == "" {
				for _, s := range tc.err {
					if !strings.Contains(res.Err, s) {
						t.Errorf("error %q does not contain %q", res.Err, s)
					}
				}
				return
			}
			if res.Err != "" || res.ID != ids[tc.want] || res.Name != tc.want || !strings.HasPrefix(res.Via, "by name") {
				t.Fatalf("got %+v, want %s (%s) by name", res, tc.want, ids[tc.want])
			}
		})
	}
	if res := find(t, PodQuery{Name: "mosquitto", LogDir: logs}, ""); res.MemoryBytes < childAlloc ||
		res.Reference.Source != RefParentLimit || res.Reference.Bytes != podLimit || !strings.Contains(res.Reference.Why, podPath+" (the pod's)") {
		t.Errorf("broker: memory %v (touched %d), reference %+v; want the pod's %d-byte limit", res.MemoryBytes, childAlloc, res.Reference, podLimit)
	}
	if res := find(t, PodQuery{Name: "exporter", LogDir: logs}, ""); res.Reference.Source != RefContainerLimit || res.Reference.Bytes != exporterLimit {
		t.Errorf("exporter: reference %+v, want its own %d-byte limit", res.Reference, exporterLimit)
	}

	// The broker restarts: its cgroup goes, a new one with a new ID comes,
	// and the kubelet keeps the dead container's symlink beside the new one.
	// (Not a subtest: the new cgroup must outlive the processes in it.)
	{
		broker.stop()
		for _, d := range tree.dirs(t, podPath+"/"+ids["mosquitto"]) {
			if err := os.Remove(d); err != nil {
				t.Fatal(err)
			}
		}
		old := ids["mosquitto"]
		if res := find(t, PodQuery{Name: "mosquitto", LogDir: logs}, ""); !strings.Contains(res.Err, `container "mosquitto" of pod mqtt/`+podName+" is not running") || !strings.Contains(res.Err, old) {
			t.Errorf("while it is gone: %+v, want an error saying it is not running", res)
		}
		ids["mosquitto"] = randomHex(t, 64)
		tree.mkdir(t, podPath+"/"+ids["mosquitto"])
		start("mosquitto", os.Args[0], 1<<20)
		if err := os.Symlink("/var/log/pods/x/mosquitto/1.log", filepath.Join(logs, link("mosquitto"))); err != nil {
			t.Fatal(err)
		}
		res := find(t, PodQuery{Name: "mosquitto", LogDir: logs}, "")
		if res.Err != "" || res.ID != ids["mosquitto"] {
			t.Fatalf("restarted: got %+v, want the new broker %s", res, ids["mosquitto"])
		}
	}
}
