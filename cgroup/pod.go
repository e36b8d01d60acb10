package cgroup

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Pod is a Kubernetes pod's cgroup as the kubelet lays it out.
type Pod struct {
	UID        string      // pod UID with dashes, as in metadata.uid
	QoS        string      // "guaranteed", "burstable" or "besteffort"
	Driver     string      // kubelet cgroup driver: "cgroupfs" or "systemd"
	Path       string      // hierarchy path of the pod cgroup
	Containers []Container // its container cgroups, sorted by ID; the sandbox (pause) container is one of them
}

// Container is a container cgroup inside a pod.
type Container struct {
	ID      string // runtime container ID (hex)
	Runtime string // name prefix: "cri-containerd", "crio", "docker", or "" for a bare ID (cgroupfs driver)
	Path    string // hierarchy path, e.g. /kubepods/burstable/pod<uid>/<id>
	// Name is the container's name in the pod spec, when FindContainer
	// learnt it; Via says how FindContainer chose it.
	Name, Via string
}

// String describes the container for logs: name (when known), short ID and
// how it was chosen.
func (c Container) String() string {
	id := c.ID
	if len(id) > 12 {
		id = id[:12]
	}
	s := "container " + id
	if c.Name != "" {
		s = "container " + c.Name + " " + id
	}
	if c.Via != "" {
		s += " (" + c.Via + ")"
	}
	return s
}

// PodQuery selects one container of a pod.
type PodQuery struct {
	// UID is the pod UID (metadata.uid, from the downward API), with dashes
	// or with underscores as in systemd slice names.
	UID string
	// ContainerID selects the target by runtime ID: full, a unique prefix of
	// at least 12 hex digits, or as in the pod status ("containerd://<id>").
	ContainerID string
	// PID selects the container of this process, when the caller can see it
	// (shareProcessNamespace): the last element of its /proc/<pid>/cgroup
	// path names the container, whether or not the path is shown relative to
	// a cgroup namespace ("/../<id>").
	PID int
	// Name selects the target by its name in the pod spec, through the
	// kubelet's container log symlinks in LogDir (see ContainerLogDir), which
	// need the pod's name and namespace (downward API).
	Name               string
	LogDir             string
	PodName, Namespace string
	// Exclude lists container IDs that are not the target, in addition to
	// the ones FindContainer recognises itself (see there). Needed when the
	// sandbox cannot be recognised, e.g. on recorded trees.
	Exclude []string
}

// validUID accepts the characters of a UUID in either spelling, which also
// keeps the UID from escaping the cgroup tree ("..", "/").
func validUID(uid string) bool {
	if uid == "" || len(uid) > 64 {
		return false
	}
	for _, c := range uid {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

const hostMountHint = "mount the host /sys/fs/cgroup read-only into the sidecar (hostPath volume, e.g. at /host/sys/fs/cgroup) and pass that directory with WithCgroupRoot, and set POD_UID from the downward API (env valueFrom fieldRef metadata.uid)"

// FindPod finds the cgroup of the pod with the given UID under the host's
// cgroup filesystem (WithCgroupRoot) and lists its container cgroups.
//
// The kubelet puts a pod at <kubepods>/[burstable/|besteffort/]pod<uid>
// (cgroupfs driver) or <kubepods>.slice/<kubepods>-<qos>.slice/<kubepods>-<qos>-pod<uid_with_underscores>.slice
// (systemd driver; no QoS level for guaranteed pods), where <kubepods> is
// /kubepods, or below the kubelet's cgroup root when it has one of its own
// (kubelet --cgroup-root, cgroupRoot in its config file: /kubelet as kind
// sets it gives /kubelet/kubepods and /kubelet.slice/kubelet-kubepods.slice).
// The pod is looked for, in this order:
//
//  1. with WithKubeletCgroupRoot, only below that root (and <root>.slice);
//  2. at the default places, /kubepods and /kubepods.slice;
//  3. on the path of this process's own cgroup (/proc/self/cgroup): a
//     sidecar is in the pod it looks for, and without a cgroup namespace
//     (cgroup v1) the path names the pod's directory whatever the root;
//  4. under every directory named kubepods or *kubepods.slice within
//     maxKubepodsDepth levels of the hierarchy's top (cgroup v2, where a
//     container's cgroup namespace hides its own path).
//
// Container cgroup names are the bare ID (containerd, Docker) or crio-<id>
// (cgroupfs), or <runtime>-<id>.scope with runtime cri-containerd, crio or
// docker (systemd). CRI-O's conmon scopes are skipped.
func FindPod(uid string, opts ...Option) (Pod, error) {
	cfg := newConfig(opts)
	l, err := loadLayout(cfg)
	if err != nil {
		return Pod{}, fmt.Errorf("find pod %s: %w", uid, err)
	}
	return findPod(cfg, l, uid)
}

// WithKubeletCgroupRoot says the kubelet runs with this cgroup root
// (--cgroup-root, cgroupRoot in its config file), a path in the hierarchy
// such as /kubelet: FindPod then looks only below it, instead of finding the
// root by itself.
func WithKubeletCgroupRoot(root string) Option {
	return func(c *config) { c.kubeletRoot = root }
}

// maxKubepodsDepth bounds how deep below the hierarchy's top FindPod looks
// for a kubepods directory: enough for /kubelet/kubepods and for a node that
// is itself a container (/docker/<id>/kubelet/kubepods). maxSearchDirs bounds
// the directories it lists on the way, so a host with thousands of cgroups
// costs milliseconds, once, at start.
const (
	maxKubepodsDepth = 4
	maxSearchDirs    = 4096
)

func findPod(cfg config, l layout, uid string) (Pod, error) {
	if !validUID(uid) {
		return Pod{}, fmt.Errorf("find pod: %q is not a pod UID: set POD_UID from the downward API (fieldRef metadata.uid)", uid)
	}
	base, err := l.base()
	if err != nil {
		return Pod{}, fmt.Errorf("find pod %s: %w", uid, err)
	}
	var tried []string // directories looked at, for the error
	try := func(candidates []Pod) (Pod, bool, error) {
		for _, p := range candidates {
			pod, ok, err := readPod(base, p, uid)
			if err != nil || ok {
				return pod, ok, err
			}
			if dir, err := base.dir(p.Path); err == nil {
				tried = append(tried, dir)
			}
		}
		return Pod{}, false, nil
	}

	if root := cfg.kubeletRoot; root != "" {
		root = path.Clean("/" + root)
		starts := []string{root}
		if !strings.HasSuffix(root, ".slice") && root != "/" {
			starts = append(starts, root+".slice") // the systemd driver's name for it
		}
		var found []string
		for _, s := range starts {
			kp, _ := findKubepods(base, s, 1)
			found = append(found, kp...)
		}
		for _, k := range found {
			if pod, ok, err := try(podPathsUnder(k, uid)); err != nil || ok {
				return pod, err
			}
		}
		return Pod{}, fmt.Errorf("find pod %s: no pod cgroup below the kubelet cgroup root %s (kubepods directories there: %s; looked at %s): is the pod on this node and is %s the kubelet's --cgroup-root? %s",
			uid, root, listOrNone(found), listOrNone(tried), root, hostMountHint)
	}

	if pod, ok, err := try(append(podPathsUnder("/kubepods", uid), podPathsUnder("/kubepods.slice", uid)...)); err != nil || ok {
		return pod, err
	}
	self := selfCgroupPath(cfg, l)
	if p, ok := podOnPath(self, uid); ok {
		if pod, ok, err := try([]Pod{p}); err != nil || ok {
			return pod, err
		}
	}
	found, err := findKubepods(base, "/", maxKubepodsDepth)
	if err != nil {
		return Pod{}, fmt.Errorf("find pod %s: %w", uid, err)
	}
	for _, k := range found {
		if k == "/kubepods" || k == "/kubepods.slice" {
			continue // tried above
		}
		if pod, ok, err := try(podPathsUnder(k, uid)); err != nil || ok {
			return pod, err
		}
	}
	if self == "" {
		self = "unknown"
	}
	top, _ := base.dir("/")
	return Pod{}, fmt.Errorf("find pod %s: no pod cgroup at any of %s, nor on this process's cgroup path (%s), nor below the kubepods directories within %d levels of %s (%s): %s; if the kubelet has a cgroup root of its own (kubelet --cgroup-root), pass it with WithKubeletCgroupRoot",
		uid, strings.Join(tried, ", "), self, maxKubepodsDepth, top, listOrNone(found), hostMountHint)
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

// podPathsUnder lists where the kubelet puts a pod's cgroup below the
// kubepods directory k, for each QoS class: k is "<parent>/kubepods" for the
// cgroupfs driver, "<parent>/<prefix>kubepods.slice" for the systemd driver,
// which repeats the slice's name as the prefix of its children's names.
// Guaranteed pods sit directly in k.
func podPathsUnder(k, uid string) []Pod {
	name := path.Base(k)
	if slice, ok := strings.CutSuffix(name, ".slice"); ok {
		us := strings.ReplaceAll(uid, "-", "_")
		return []Pod{
			{QoS: "guaranteed", Driver: "systemd", Path: path.Join(k, slice+"-pod"+us+".slice")},
			{QoS: "burstable", Driver: "systemd", Path: path.Join(k, slice+"-burstable.slice", slice+"-burstable-pod"+us+".slice")},
			{QoS: "besteffort", Driver: "systemd", Path: path.Join(k, slice+"-besteffort.slice", slice+"-besteffort-pod"+us+".slice")},
		}
	}
	dash := strings.ReplaceAll(uid, "_", "-")
	return []Pod{
		{QoS: "guaranteed", Driver: "cgroupfs", Path: path.Join(k, "pod"+dash)},
		{QoS: "burstable", Driver: "cgroupfs", Path: path.Join(k, "burstable", "pod"+dash)},
		{QoS: "besteffort", Driver: "cgroupfs", Path: path.Join(k, "besteffort", "pod"+dash)},
	}
}

// isKubepods says whether a cgroup directory name is the kubelet's kubepods
// directory: "kubepods" (cgroupfs) or "[<root>-]kubepods.slice" (systemd).
func isKubepods(name string) bool {
	return name == "kubepods" || name == "kubepods.slice" || strings.HasSuffix(name, "-kubepods.slice")
}

// podOnPath finds the pod's directory among the elements of a cgroup path
// (a container's, from /proc/<pid>/cgroup) and returns where it is, with its
// QoS class and driver, when the path goes through the pod.
func podOnPath(p, uid string) (Pod, bool) {
	if p == "" {
		return Pod{}, false
	}
	elems := strings.Split(strings.Trim(p, "/"), "/")
	for i := len(elems) - 1; i >= 0; i-- {
		if !isKubepods(elems[i]) {
			continue
		}
		k := "/" + strings.Join(elems[:i+1], "/")
		for _, c := range podPathsUnder(k, uid) {
			if c.Path == p || strings.HasPrefix(p, c.Path+"/") {
				return c, true
			}
		}
		return Pod{}, false
	}
	return Pod{}, false
}

// selfCgroupPath is this process's cgroup path in the base hierarchy, as
// /proc/self/cgroup shows it ("" when unknown). Inside a cgroup namespace it
// is relative to the namespace ("/" or "/../x") and names no pod.
func selfCgroupPath(cfg config, l layout) string {
	b, err := os.ReadFile(filepath.Join(cfg.procRoot, "self", "cgroup"))
	if err != nil {
		return ""
	}
	lines, err := parseProcCgroup(b)
	if err != nil {
		return ""
	}
	if l.useV1() {
		for _, c := range []string{ctrlMemory, ctrlCPUAcct} {
			if p, ok := v1Path(lines, c); ok {
				return p
			}
		}
		return ""
	}
	p, _ := v2Path(lines)
	return p
}

// findKubepods lists the kubepods directories (isKubepods) at most depth
// levels below the hierarchy path start, breadth first, without descending
// into them.
func findKubepods(base hierarchy, start string, depth int) ([]string, error) {
	var found []string
	level := []string{start}
	listed := 0
	for d := 0; d < depth && len(level) > 0; d++ {
		var next []string
		for _, p := range level {
			dir, err := base.dir(p)
			if err != nil {
				continue
			}
			if listed++; listed > maxSearchDirs {
				return found, fmt.Errorf("looked through %d cgroup directories below %s without finding all kubepods directories: pass the kubelet's cgroup root with WithKubeletCgroupRoot", maxSearchDirs, start)
			}
			ents, err := os.ReadDir(dir)
			if err != nil {
				continue // vanished or unreadable: not where the pods are
			}
			for _, e := range ents {
				if !e.IsDir() {
					continue
				}
				child := path.Join(p, e.Name())
				if isKubepods(e.Name()) {
					found = append(found, child)
				} else {
					next = append(next, child)
				}
			}
		}
		level = next
	}
	return found, nil
}

// readPod lists the container cgroups of the pod directory p.Path; ok is
// false when there is no such directory.
func readPod(base hierarchy, p Pod, uid string) (Pod, bool, error) {
	dir, err := base.dir(p.Path)
	if err != nil {
		return Pod{}, false, nil // outside the mounted part: not there
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return Pod{}, false, nil
	}
	if err != nil {
		return Pod{}, false, fmt.Errorf("find pod %s: %w", uid, err)
	}
	p.UID = strings.ReplaceAll(uid, "_", "-")
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		if rt, id, ok := parseContainerName(e.Name()); ok {
			p.Containers = append(p.Containers, Container{ID: id, Runtime: rt, Path: path.Join(p.Path, e.Name())})
		}
	}
	slices.SortFunc(p.Containers, func(a, b Container) int { return strings.Compare(a.ID, b.ID) })
	return p, true, nil
}

// parseContainerName extracts the runtime and ID from a container cgroup's
// directory name; ok is false for names that are not containers.
func parseContainerName(name string) (runtime, id string, ok bool) {
	name = strings.TrimSuffix(name, ".scope")
	if strings.HasPrefix(name, "crio-conmon-") {
		return "", "", false // CRI-O's container monitor, not a container
	}
	for _, rt := range []string{"cri-containerd", "crio", "docker"} {
		if rest, cut := strings.CutPrefix(name, rt+"-"); cut {
			runtime, name = rt, rest
			break
		}
	}
	if len(name) < 12 || len(name) > 128 || !isHex(name) {
		return "", "", false
	}
	return runtime, strings.ToLower(name), true
}

func isHex(s string) bool {
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// FindContainer finds the pod (see FindPod) and selects one container.
//
// With q.ContainerID, that container; else with q.PID, the container of that
// process; else with q.Name, the live container of that name according to the
// kubelet's symlinks in q.LogDir (see ContainerLogDir). A name that the
// symlinks of this pod do not list, or list without a live cgroup, is an
// error naming what they list. When they tell nothing about the pod (no
// LogDir, not mounted, no symlink of this pod: a kubelet that writes none),
// and without any of the three, the target is the only container left after
// removing:
//
//  1. the IDs in q.Exclude;
//  2. the caller's own container: the one named by the last element of a
//     path in /proc/self/cgroup (cgroup v1, or v2 without a cgroup
//     namespace), or else the one whose cgroup.procs lists the caller's PID
//     (cgroup.procs shows PIDs as the reader's PID namespace sees them, so
//     only the caller's own container can list it);
//  3. the sandbox (pause) container: the one whose ID is a directory in the
//     source of /etc/hostname, /etc/resolv.conf or /etc/hosts in
//     /proc/self/mountinfo (containerd, CRI-O and Docker all bind-mount these
//     from the sandbox's directory), or one whose cgroup.procs lists exactly
//     one visible process and that process is named "pause" (visible with
//     shareProcessNamespace).
//
// It fails, naming the containers left, unless exactly one remains. A name
// chosen this way is not checked: the Container's Via says so.
func FindContainer(q PodQuery, opts ...Option) (Container, error) {
	cfg := newConfig(opts)
	l, err := loadLayout(cfg)
	if err != nil {
		return Container{}, fmt.Errorf("find pod %s: %w", q.UID, err)
	}
	return findContainer(cfg, l, q)
}

func findContainer(cfg config, l layout, q PodQuery) (Container, error) {
	pod, err := findPod(cfg, l, q.UID)
	if err != nil {
		return Container{}, err
	}
	if len(pod.Containers) == 0 {
		return Container{}, fmt.Errorf("pod %s: no container cgroups in %s yet (is the pod starting?)", pod.UID, pod.Path)
	}
	if q.ContainerID != "" {
		c, err := matchID(pod, q.ContainerID)
		c.Via = "ID given"
		return c, err
	}
	if q.PID > 0 {
		c, err := containerOfPID(cfg, pod, q.PID)
		c.Via = fmt.Sprintf("the container of process %d", q.PID)
		return c, err
	}
	var unverified error // why q.Name could not be checked
	if q.Name != "" {
		c, err := containerByName(pod, q)
		if !errors.Is(err, errNamesUnknown) {
			return c, err
		}
		unverified = err
	}
	base, err := l.base()
	if err != nil {
		return Container{}, err
	}
	excluded := map[string]string{} // ID → why
	for _, id := range q.Exclude {
		if c, err := matchID(pod, id); err == nil {
			excluded[c.ID] = "excluded by the caller"
		}
	}
	if id := selfContainer(cfg, pod, base); id != "" {
		excluded[id] = "the caller's own container"
	}
	for _, id := range sandboxContainers(cfg, pod, base) {
		if _, ok := excluded[id]; !ok {
			excluded[id] = "the pod's sandbox (pause) container"
		}
	}
	var left []Container
	for _, c := range pod.Containers {
		if _, ok := excluded[c.ID]; !ok {
			left = append(left, c)
		}
	}
	if len(left) == 1 {
		c := left[0]
		c.Via = "the only container besides this one and the sandbox"
		if unverified != nil {
			c.Name = q.Name
			c.Via += "; name not checked: " + unverified.Error()
		}
		return c, nil
	}
	var why []string
	for _, c := range pod.Containers {
		if w, ok := excluded[c.ID]; ok {
			why = append(why, c.ID+" ("+w+")")
		}
	}
	skipped := "none"
	if len(why) > 0 {
		skipped = strings.Join(why, ", ")
	}
	hint := "pass the target's container ID"
	if unverified != nil {
		// The name would have told them apart: say why it could not.
		hint = fmt.Sprintf("container %q could not be looked up by name (%v)", q.Name, unverified)
	}
	if len(left) == 0 {
		return Container{}, fmt.Errorf("pod %s: no container left in %s after excluding %s: %s", pod.UID, pod.Path, skipped, hint)
	}
	ids := make([]string, len(left))
	for i, c := range left {
		ids[i] = c.ID
	}
	if unverified == nil {
		hint += ", or the IDs to exclude"
	}
	return Container{}, fmt.Errorf("pod %s: %d containers could be the target (%s) in %s, excluded %s: %s", pod.UID, len(left), strings.Join(ids, ", "), pod.Path, skipped, hint)
}

func normalizeID(id string) string {
	if _, rest, ok := strings.Cut(id, "://"); ok {
		id = rest
	}
	return strings.ToLower(strings.TrimSpace(id))
}

// matchID finds the container with the given full ID or unique prefix.
func matchID(pod Pod, id string) (Container, error) {
	id = normalizeID(id)
	if len(id) < 12 || !isHex(id) {
		return Container{}, fmt.Errorf("pod %s: container ID %q: want at least 12 hex digits", pod.UID, id)
	}
	var found []Container
	for _, c := range pod.Containers {
		if c.ID == id {
			return c, nil
		}
		if strings.HasPrefix(c.ID, id) {
			found = append(found, c)
		}
	}
	if len(found) == 1 {
		return found[0], nil
	}
	ids := make([]string, len(pod.Containers))
	for i, c := range pod.Containers {
		ids[i] = c.ID
	}
	if len(found) > 1 {
		return Container{}, fmt.Errorf("pod %s: container ID prefix %s is ambiguous among %s", pod.UID, id, strings.Join(ids, ", "))
	}
	return Container{}, fmt.Errorf("pod %s: no container %s in %s (containers: %s): the ID changes when a container restarts", pod.UID, id, pod.Path, strings.Join(ids, ", "))
}

// containerOfPID finds the container of process pid in pod.
func containerOfPID(cfg config, pod Pod, pid int) (Container, error) {
	p := filepath.Join(cfg.procRoot, strconv.Itoa(pid), "cgroup")
	b, err := os.ReadFile(p)
	if err != nil {
		return Container{}, fmt.Errorf("pod %s: container of process %d (needs shareProcessNamespace to see it): %w", pod.UID, pid, err)
	}
	lines, err := parseProcCgroup(b)
	if err != nil {
		return Container{}, fmt.Errorf("pod %s: %w", pod.UID, inFile(p, err))
	}
	for _, l := range lines {
		if _, id, ok := parseContainerName(path.Base(l.Path)); ok {
			for _, c := range pod.Containers {
				if c.ID == id {
					return c, nil
				}
			}
		}
	}
	return Container{}, fmt.Errorf("pod %s: process %d is in none of the pod's containers (per %s)", pod.UID, pid, p)
}

// selfContainer returns the ID of the caller's own container in pod, or "".
func selfContainer(cfg config, pod Pod, base hierarchy) string {
	if b, err := os.ReadFile(filepath.Join(cfg.procRoot, "self", "cgroup")); err == nil {
		if lines, err := parseProcCgroup(b); err == nil {
			for _, l := range lines {
				_, id, ok := parseContainerName(path.Base(l.Path))
				if ok && slices.ContainsFunc(pod.Containers, func(c Container) bool { return c.ID == id }) {
					return id
				}
			}
		}
	}
	self := os.Getpid()
	for _, c := range pod.Containers {
		if pids := containerPIDs(base, c); slices.Contains(pids, self) {
			return c.ID
		}
	}
	return ""
}

// sandboxContainers returns the IDs in pod that are recognisably the sandbox.
func sandboxContainers(cfg config, pod Pod, base hierarchy) []string {
	var ids []string
	if b, err := os.ReadFile(filepath.Join(cfg.procRoot, "self", "mountinfo")); err == nil {
		if ms, err := parseMountInfo(b); err == nil {
			for _, m := range ms {
				switch m.MountPoint {
				case "/etc/hostname", "/etc/resolv.conf", "/etc/hosts":
				default:
					continue
				}
				for _, elem := range strings.Split(m.Root, "/") {
					for _, c := range pod.Containers {
						if elem == c.ID && !slices.Contains(ids, c.ID) {
							ids = append(ids, c.ID)
						}
					}
				}
			}
		}
	}
	for _, c := range pod.Containers {
		pids := containerPIDs(base, c)
		if len(pids) != 1 {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(cfg.procRoot, strconv.Itoa(pids[0]), "comm"))
		if err == nil && string(bytes.TrimSpace(comm)) == "pause" && !slices.Contains(ids, c.ID) {
			ids = append(ids, c.ID)
		}
	}
	return ids
}

// containerPIDs lists the PIDs in a container's cgroup.procs that the caller
// can see; the kernel shows the others as 0 (v2) or not at all (v1).
func containerPIDs(base hierarchy, c Container) []int {
	dir, err := base.dir(c.Path)
	if err != nil {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil && n > 0 {
			pids = append(pids, n)
		}
	}
	return pids
}

// OpenPod finds a pod's container (see FindContainer) and opens it (see
// Open). A sidecar passes WithPID(os.Getpid()) to get the pod's network
// counters, since all containers of a pod share its network namespace.
func OpenPod(q PodQuery, opts ...Option) (Reader, error) {
	cfg := newConfig(opts)
	l, err := loadLayout(cfg)
	if err != nil {
		return nil, fmt.Errorf("find pod %s: %w", q.UID, err)
	}
	c, err := findContainer(cfg, l, q)
	if err != nil {
		return nil, err
	}
	r, err := openIn(cfg, l, c.Path)
	if err != nil {
		return nil, fmt.Errorf("pod %s %s: %w", q.UID, c, err)
	}
	r.desc = "pod " + q.UID + " " + c.String() + ": " + r.desc
	return r, nil
}
