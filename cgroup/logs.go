package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Finding a container by name. The cgroup tree names containers by runtime
// ID only, and the sidecar may not ask the API server (no client-go) nor the
// runtime (its socket would give a broker's sidecar control of the node). The
// kubelet itself writes the mapping, as one symlink per container in
// /var/log/containers:
//
//	<pod>_<namespace>_<container>-<container ID>.log -> /var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log
//
// for cluster logging agents (kubelet pkg/kubelet/kuberuntime/legacy.go,
// logSymlink: written once the container has started, removed with the
// container). Every kubelet writes it (kubeadm, k3s, MicroK8s, kind: the
// directory is fixed in the kubelet, not configurable, and created at start);
// the symlinks' names are all the sidecar reads: their targets, the logs, stay
// outside the read-only mount. A restarted container gets a new symlink with
// its new ID; the kubelet keeps the previous one while it keeps the dead
// container, so the IDs are matched against the pod's live container cgroups,
// which also rules out a stale symlink of an earlier pod of the same name.

// ContainerLogDir is where the kubelet writes its container log symlinks.
const ContainerLogDir = "/var/log/containers"

// containerLog is one parsed symlink name.
type containerLog struct {
	pod, namespace, container, id string
}

// parseContainerLogName parses a symlink name of ContainerLogDir; ok is false
// for anything else. Pod, namespace and container names never hold "_"
// (Kubernetes names are DNS labels and subdomains), and a container name ends
// at the last "-". The kubelet cuts names longer than 255 bytes before
// ".log", so the ID may be a prefix: at least 12 hex digits are required,
// the length at which IDs are matched as prefixes.
func parseContainerLogName(name string) (containerLog, bool) {
	base, ok := strings.CutSuffix(name, ".log")
	if !ok {
		return containerLog{}, false
	}
	parts := strings.Split(base, "_")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" {
		return containerLog{}, false
	}
	i := strings.LastIndexByte(parts[2], '-')
	if i <= 0 {
		return containerLog{}, false
	}
	id := parts[2][i+1:]
	if len(id) < 12 || len(id) > 128 || !isHex(id) {
		return containerLog{}, false
	}
	return containerLog{pod: parts[0], namespace: parts[1], container: parts[2][:i], id: strings.ToLower(id)}, true
}

// errNamesUnknown means the log directory cannot tell the pod's container
// names (not mounted, or nothing of this pod in it): the caller may fall back
// to finding the target by elimination.
var errNamesUnknown = errors.New("container names unknown")

// containerByName finds the live container named q.Name in pod through the
// symlinks in q.LogDir. It fails wrapping errNamesUnknown when the directory
// tells nothing about the pod.
func containerByName(pod Pod, q PodQuery) (Container, error) {
	if q.LogDir == "" {
		return Container{}, fmt.Errorf("%w: no container log directory given (the kubelet's %s, mounted read-only)", errNamesUnknown, ContainerLogDir)
	}
	if q.PodName == "" || q.Namespace == "" {
		return Container{}, fmt.Errorf("%w: the pod's name and namespace are needed to read %s: set POD_NAME and POD_NAMESPACE from the downward API (fieldRef metadata.name, metadata.namespace)", errNamesUnknown, q.LogDir)
	}
	ents, err := os.ReadDir(q.LogDir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Container{}, fmt.Errorf("%w: %s does not exist: mount the host's %s there read-only (hostPath)", errNamesUnknown, q.LogDir, ContainerLogDir)
		}
		return Container{}, fmt.Errorf("%w: %w", errNamesUnknown, err)
	}
	var names []string // of this pod's containers, for errors
	var links []string // of the wanted one
	var found []Container
	for _, e := range ents {
		l, ok := parseContainerLogName(e.Name())
		if !ok || l.pod != q.PodName || l.namespace != q.Namespace {
			continue
		}
		if !slices.Contains(names, l.container) {
			names = append(names, l.container)
		}
		if l.container != q.Name {
			continue
		}
		links = append(links, e.Name())
		for _, c := range pod.Containers {
			if strings.HasPrefix(c.ID, l.id) && !slices.ContainsFunc(found, func(f Container) bool { return f.ID == c.ID }) {
				c.Name, c.Via = q.Name, "by name, from "+filepath.Join(q.LogDir, e.Name())
				found = append(found, c)
			}
		}
	}
	where := q.Namespace + "/" + q.PodName
	switch {
	case len(names) == 0:
		return Container{}, fmt.Errorf("%w: no symlink of pod %s in %s yet (the kubelet writes one as each container starts)", errNamesUnknown, where, q.LogDir)
	case len(links) == 0:
		slices.Sort(names)
		return Container{}, fmt.Errorf("pod %s has no container %q (the kubelet's %s names %s): give the name of the broker's container as in the pod spec, or wait if it has not started yet",
			where, q.Name, q.LogDir, strings.Join(names, ", "))
	case len(found) == 0:
		return Container{}, fmt.Errorf("container %q of pod %s is not running: none of its IDs in %s (%s) has a cgroup in %s (restarting?)",
			q.Name, where, q.LogDir, strings.Join(links, ", "), pod.Path)
	case len(found) > 1:
		ids := make([]string, len(found))
		for i, c := range found {
			ids[i] = c.ID
		}
		return Container{}, fmt.Errorf("container %q of pod %s has %d live cgroups (%s) in %s: a restart in progress?",
			q.Name, where, len(found), strings.Join(ids, ", "), pod.Path)
	}
	return found[0], nil
}
