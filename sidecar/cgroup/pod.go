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
	// Exclude lists container IDs that are not the target, in addition to
	// the ones FindContainer recognises itself (see there). Needed when the
	// sandbox cannot be recognised, e.g. on recorded trees.
	Exclude []string
}

// podPaths lists where the kubelet puts a pod's cgroup, for each driver and
// QoS class. Guaranteed pods sit directly under kubepods.
func podPaths(uid string) []Pod {
	dash := strings.ReplaceAll(uid, "_", "-")
	us := strings.ReplaceAll(uid, "-", "_")
	return []Pod{
		{QoS: "guaranteed", Driver: "cgroupfs", Path: "/kubepods/pod" + dash},
		{QoS: "burstable", Driver: "cgroupfs", Path: "/kubepods/burstable/pod" + dash},
		{QoS: "besteffort", Driver: "cgroupfs", Path: "/kubepods/besteffort/pod" + dash},
		{QoS: "guaranteed", Driver: "systemd", Path: "/kubepods.slice/kubepods-pod" + us + ".slice"},
		{QoS: "burstable", Driver: "systemd", Path: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + us + ".slice"},
		{QoS: "besteffort", Driver: "systemd", Path: "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + us + ".slice"},
	}
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
// cgroup filesystem (WithCgroupRoot), trying the cgroupfs layout
// kubepods[/burstable|/besteffort]/pod<uid> and the systemd layout
// kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid_with_underscores>.slice
// for all QoS classes, and lists its container cgroups: cgroupfs names are
// the bare ID (containerd, Docker) or crio-<id>; systemd names are
// <runtime>-<id>.scope with runtime cri-containerd, crio or docker. CRI-O's
// conmon scopes are skipped. A kubelet with a non-default --cgroup-root is not
// supported.
func FindPod(uid string, opts ...Option) (Pod, error) {
	cfg := newConfig(opts)
	l, err := loadLayout(cfg)
	if err != nil {
		return Pod{}, fmt.Errorf("find pod %s: %w", uid, err)
	}
	return findPod(l, uid)
}

func findPod(l layout, uid string) (Pod, error) {
	if !validUID(uid) {
		return Pod{}, fmt.Errorf("find pod: %q is not a pod UID: set POD_UID from the downward API (fieldRef metadata.uid)", uid)
	}
	base, err := l.base()
	if err != nil {
		return Pod{}, fmt.Errorf("find pod %s: %w", uid, err)
	}
	var tried []string
	for _, p := range podPaths(uid) {
		dir, err := base.dir(p.Path)
		if err != nil {
			return Pod{}, fmt.Errorf("find pod %s: %w", uid, err)
		}
		ents, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			tried = append(tried, dir)
			continue
		}
		if err != nil {
			return Pod{}, fmt.Errorf("find pod %s: %w", uid, err)
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
		return p, nil
	}
	return Pod{}, fmt.Errorf("find pod %s: no pod cgroup at any of %s: %s", uid, strings.Join(tried, ", "), hostMountHint)
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
// process. Otherwise the target is the only
// container left after removing:
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
// It fails, naming the containers left, unless exactly one remains.
func FindContainer(q PodQuery, opts ...Option) (Container, error) {
	cfg := newConfig(opts)
	l, err := loadLayout(cfg)
	if err != nil {
		return Container{}, fmt.Errorf("find pod %s: %w", q.UID, err)
	}
	return findContainer(cfg, l, q)
}

func findContainer(cfg config, l layout, q PodQuery) (Container, error) {
	pod, err := findPod(l, q.UID)
	if err != nil {
		return Container{}, err
	}
	if len(pod.Containers) == 0 {
		return Container{}, fmt.Errorf("pod %s: no container cgroups in %s yet (is the pod starting?)", pod.UID, pod.Path)
	}
	if q.ContainerID != "" {
		return matchID(pod, q.ContainerID)
	}
	if q.PID > 0 {
		return containerOfPID(cfg, pod, q.PID)
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
		return left[0], nil
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
	if len(left) == 0 {
		return Container{}, fmt.Errorf("pod %s: no container left in %s after excluding %s: pass the target's container ID", pod.UID, pod.Path, skipped)
	}
	ids := make([]string, len(left))
	for i, c := range left {
		ids[i] = c.ID
	}
	return Container{}, fmt.Errorf("pod %s: %d containers could be the target (%s) in %s, excluded %s: pass the target's container ID, or the IDs to exclude", pod.UID, len(left), strings.Join(ids, ", "), pod.Path, skipped)
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
		return nil, fmt.Errorf("pod %s container %s: %w", q.UID, c.ID, err)
	}
	return r, nil
}
