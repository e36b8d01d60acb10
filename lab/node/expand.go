package node

import (
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// expand replaces $(NAME) in s by lookup(NAME) with the rules of Kubernetes
// (k8s.io/kubernetes/third_party/forked/golang/expansion): "$$" is a literal
// "$", a reference to an unknown name or an unclosed "$(" stays as it is.
func expand(s string, lookup func(string) (string, bool)) string {
	var b strings.Builder
	checkpoint := 0
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			continue
		}
		b.WriteString(s[checkpoint:i])
		switch rest := s[i+1:]; rest[0] {
		case '$': // escaped
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(rest, ')')
			if end < 0 { // unclosed: keep "$(" and go on after it
				b.WriteString("$(")
				i++
				break
			}
			name := rest[1:end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(" + name + ")")
			}
			i += end + 1
		default: // a lone operator: keep it and the byte after it
			b.WriteString(s[i : i+2])
			i++
		}
		checkpoint = i + 1
	}
	return b.String() + s[checkpoint:]
}

// envVar is one variable of a container's environment.
type envVar struct{ name, value string }

// lookupIn returns a lookup over vars, the last definition winning.
func lookupIn(vars []envVar) func(string) (string, bool) {
	return func(name string) (string, bool) {
		for i := len(vars) - 1; i >= 0; i-- {
			if vars[i].name == name {
				return vars[i].value, true
			}
		}
		return "", false
	}
}

// rewrite maps a container path prefix to a host directory (see the package
// documentation: volumes are seen by path rewriting).
type rewrite struct{ from, to string }

// newRewrites returns the rewrites of the given mountPath → host directory
// pairs, longest mountPath first so nested mounts win. "/" is never rewritten.
func newRewrites(mounts map[string]string) []rewrite {
	var rs []rewrite
	for from, to := range mounts {
		from = path.Clean("/" + from)
		if from == "/" {
			continue
		}
		rs = append(rs, rewrite{from: from, to: to})
	}
	sort.Slice(rs, func(i, j int) bool {
		if len(rs[i].from) != len(rs[j].from) {
			return len(rs[i].from) > len(rs[j].from)
		}
		return rs[i].from < rs[j].from
	})
	return rs
}

// rewritePaths replaces each mountPath in s that starts the string or follows
// '=' (as in --flag=/path or VAR=/path) and ends there or at a '/' by its host
// directory. It is applied once to each final string, after $(VAR) expansion,
// so a host path is never rewritten again.
func rewritePaths(s string, rs []rewrite) string {
	if len(rs) == 0 {
		return s
	}
	var b strings.Builder
	last := 0
	for i := 0; i < len(s); i++ {
		if i > 0 && s[i-1] != '=' {
			continue
		}
		for _, r := range rs {
			if !strings.HasPrefix(s[i:], r.from) {
				continue
			}
			end := i + len(r.from)
			if end < len(s) && s[end] != '/' {
				continue
			}
			b.WriteString(s[last:i])
			b.WriteString(r.to)
			last = end
			i = end - 1
			break
		}
	}
	if last == 0 {
		return s
	}
	return b.String() + s[last:]
}

// commandLine returns the argv of a container as Kubernetes composes it from
// the image and the container: command replaces the entrypoint (and drops the
// image's cmd), args replace the image's cmd; $(VAR) in command and args is
// expanded with the container's environment.
func commandLine(img Image, c *corev1.Container, lookup func(string) (string, bool)) []string {
	expandAll := func(in []string) []string {
		out := make([]string, len(in))
		for i, s := range in {
			out[i] = expand(s, lookup)
		}
		return out
	}
	var argv []string
	switch {
	case len(c.Command) > 0:
		argv = append(expandAll(c.Command), expandAll(c.Args)...)
	case len(c.Args) > 0:
		argv = append(slices.Clone(img.Entrypoint), expandAll(c.Args)...)
	default:
		argv = append(slices.Clone(img.Entrypoint), img.Cmd...)
	}
	return argv
}

// defaultPath is the PATH a container gets when its image sets none (what
// container runtimes use).
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// processEnv is the environment of a container's process: the image's, then
// PATH and HOSTNAME when the image has none, then the container's own
// variables, which win. Every value is rewritten (rs).
func processEnv(img Image, hostname string, vars []envVar, rs []rewrite) []string {
	var order []string
	vals := map[string]string{}
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			order = append(order, k)
		}
		vals[k] = v
	}
	for _, kv := range img.Env {
		k, v, _ := strings.Cut(kv, "=")
		set(k, v)
	}
	if _, ok := vals["PATH"]; !ok {
		set("PATH", defaultPath)
	}
	set("HOSTNAME", hostname)
	for _, v := range vars {
		set(v.name, v.value)
	}
	env := make([]string, 0, len(order))
	for _, k := range order {
		env = append(env, k+"="+rewritePaths(vals[k], rs))
	}
	return env
}

// lookPath finds an executable as a container would: a name with a slash is
// used as it is; otherwise it is searched in the PATH of env.
func lookPath(name string, env []string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("no command: the image mapping has no Entrypoint and the container no command")
	}
	if strings.Contains(name, "/") {
		if err := isExecutable(name); err != nil {
			return "", err
		}
		return name, nil
	}
	p := defaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			p = v
		}
	}
	for _, dir := range filepath.SplitList(p) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		if f := filepath.Join(dir, name); isExecutable(f) == nil {
			return f, nil
		}
	}
	return "", fmt.Errorf("executable %q not found in $PATH %s", name, p)
}

func isExecutable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
}

// objectSource reads the ConfigMaps and Secrets a container refers to.
type objectSource interface {
	configMap(name string) (*corev1.ConfigMap, error) // a NotFound error when absent
	secret(name string) (*corev1.Secret, error)
}

// podFacts are what the downward API exposes beyond the pod object.
type podFacts struct {
	hostIP      string
	allocatable corev1.ResourceList // the node's, for resourceFieldRef limits without a limit
}

// containerEnv computes a container's variables as the kubelet does: envFrom
// first, then env in order, each value expanded with the variables defined
// before it. Errors are CreateContainerConfigError material.
func containerEnv(pod *corev1.Pod, c *corev1.Container, facts podFacts, src objectSource) ([]envVar, error) {
	var vars []envVar
	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm, err := src.configMap(from.ConfigMapRef.Name)
			if err != nil {
				if isNotFound(err) && optional(from.ConfigMapRef.Optional) {
					continue
				}
				return nil, fmt.Errorf("envFrom configmap %q: %w", from.ConfigMapRef.Name, err)
			}
			for _, k := range sortedKeys(cm.Data) {
				if validEnvName(from.Prefix + k) {
					vars = append(vars, envVar{from.Prefix + k, cm.Data[k]})
				}
			}
		case from.SecretRef != nil:
			s, err := src.secret(from.SecretRef.Name)
			if err != nil {
				if isNotFound(err) && optional(from.SecretRef.Optional) {
					continue
				}
				return nil, fmt.Errorf("envFrom secret %q: %w", from.SecretRef.Name, err)
			}
			for _, k := range sortedKeys(s.Data) {
				if validEnvName(from.Prefix + k) {
					vars = append(vars, envVar{from.Prefix + k, string(s.Data[k])})
				}
			}
		}
	}
	for _, e := range c.Env {
		if e.ValueFrom == nil {
			vars = append(vars, envVar{e.Name, expand(e.Value, lookupIn(vars))})
			continue
		}
		v, ok, err := envValueFrom(pod, c, e.ValueFrom, facts, src)
		if err != nil {
			return nil, fmt.Errorf("env %s: %w", e.Name, err)
		}
		if ok {
			vars = append(vars, envVar{e.Name, v})
		}
	}
	return vars, nil
}

// envValueFrom resolves one valueFrom; ok is false for an optional reference
// that is absent (the variable is then not set).
func envValueFrom(pod *corev1.Pod, c *corev1.Container, from *corev1.EnvVarSource, facts podFacts, src objectSource) (string, bool, error) {
	switch {
	case from.FieldRef != nil:
		v, err := fieldValue(pod, from.FieldRef.FieldPath, facts)
		return v, err == nil, err
	case from.ResourceFieldRef != nil:
		target := c
		if from.ResourceFieldRef.ContainerName != "" {
			target = findContainer(pod, from.ResourceFieldRef.ContainerName)
			if target == nil {
				return "", false, fmt.Errorf("resourceFieldRef: no container %q", from.ResourceFieldRef.ContainerName)
			}
		}
		v, err := resourceValue(target, from.ResourceFieldRef, facts.allocatable)
		return v, err == nil, err
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		cm, err := src.configMap(ref.Name)
		if err != nil {
			if isNotFound(err) && optional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("configmap %q: %w", ref.Name, err)
		}
		if v, ok := cm.Data[ref.Key]; ok {
			return v, true, nil
		}
		if v, ok := cm.BinaryData[ref.Key]; ok {
			return string(v), true, nil
		}
		if optional(ref.Optional) {
			return "", false, nil
		}
		return "", false, fmt.Errorf("couldn't find key %s in ConfigMap %s/%s", ref.Key, pod.Namespace, ref.Name)
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		s, err := src.secret(ref.Name)
		if err != nil {
			if isNotFound(err) && optional(ref.Optional) {
				return "", false, nil
			}
			return "", false, fmt.Errorf("secret %q: %w", ref.Name, err)
		}
		if v, ok := s.Data[ref.Key]; ok {
			return string(v), true, nil
		}
		if optional(ref.Optional) {
			return "", false, nil
		}
		return "", false, fmt.Errorf("couldn't find key %s in Secret %s/%s", ref.Key, pod.Namespace, ref.Name)
	}
	return "", false, fmt.Errorf("valueFrom: no source the lab node supports")
}

// fieldValue is the downward API's value of a pod field.
func fieldValue(pod *corev1.Pod, field string, facts podFacts) (string, error) {
	if key, ok := subscript(field, "metadata.labels"); ok {
		return pod.Labels[key], nil
	}
	if key, ok := subscript(field, "metadata.annotations"); ok {
		return pod.Annotations[key], nil
	}
	switch field {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs":
		return facts.hostIP, nil // host network: one IP for all
	}
	return "", fmt.Errorf("fieldRef %q is not supported", field)
}

// subscript parses prefix['key'].
func subscript(field, prefix string) (string, bool) {
	rest, ok := strings.CutPrefix(field, prefix+"['")
	if !ok {
		return "", false
	}
	return strings.CutSuffix(rest, "']")
}

// formatMap formats labels or annotations as the downward API's files do:
// key="value" lines, sorted.
func formatMap(m map[string]string) string {
	var lines []string
	for _, k := range sortedKeys(m) {
		lines = append(lines, k+"="+strconv.Quote(m[k]))
	}
	return strings.Join(lines, "\n")
}

// resourceValue is the downward API's value of a container resource, divided
// by the divisor and rounded up, as the kubelet computes it.
func resourceValue(c *corev1.Container, ref *corev1.ResourceFieldSelector, alloc corev1.ResourceList) (string, error) {
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	var q resource.Quantity
	var ok bool
	name := corev1.ResourceName(strings.TrimPrefix(strings.TrimPrefix(ref.Resource, "limits."), "requests."))
	switch {
	case strings.HasPrefix(ref.Resource, "limits."):
		if q, ok = c.Resources.Limits[name]; !ok {
			q = alloc[name]
		}
	case strings.HasPrefix(ref.Resource, "requests."):
		q = c.Resources.Requests[name]
	default:
		return "", fmt.Errorf("resourceFieldRef %q is not supported", ref.Resource)
	}
	switch name {
	case corev1.ResourceCPU:
		return strconv.FormatInt(int64(math.Ceil(float64(q.MilliValue())/float64(divisor.MilliValue()))), 10), nil
	case corev1.ResourceMemory, corev1.ResourceEphemeralStorage:
		return strconv.FormatInt(int64(math.Ceil(float64(q.Value())/float64(divisor.Value()))), 10), nil
	}
	return "", fmt.Errorf("resourceFieldRef %q is not supported", ref.Resource)
}

func findContainer(pod *corev1.Pod, name string) *corev1.Container {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			if cs[i].Name == name {
				return &cs[i]
			}
		}
	}
	return nil
}

func optional(b *bool) bool { return b != nil && *b }

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// validEnvName is Kubernetes' rule for names from envFrom (C identifiers,
// relaxed to any printable ASCII except '=' since 1.30).
func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' || s[i] == '=' {
			return false
		}
	}
	return true
}
