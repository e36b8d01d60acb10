package node

import (
	"errors"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
)

// The cases of Kubernetes' own expansion tests
// (third_party/forked/golang/expansion/expand_test.go) that matter here.
func TestExpand(t *testing.T) {
	vars := map[string]string{"VAR_A": "A", "VAR_B": "B", "VAR_C": "C", "VAR_REF": "$(VAR_A)", "VAR_EMPTY": ""}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	for _, tc := range []struct{ in, want string }{
		{"$(VAR_A)", "A"},
		{"___$(VAR_B)___", "___B___"},
		{"$(VAR_A)-$(VAR_A)", "A-A"},
		{"$(VAR_A)$(VAR_B)$(VAR_C)", "ABC"},
		{"$(VAR_REF)", "$(VAR_A)"}, // no recursion
		{"$(VAR_EMPTY)", ""},
		{"$(UNKNOWN)", "$(UNKNOWN)"},
		{"$$(VAR_A)", "$(VAR_A)"}, // escaped
		{"$$$(VAR_A)", "$A"},
		{"$$$$(VAR_A)", "$$(VAR_A)"},
		{"$(VAR_A", "$(VAR_A"}, // unclosed
		{"$VAR_A", "$VAR_A"},   // not the syntax
		{"foo$", "foo$"},
		{"$", "$"},
		{"$()", "$()"},
		{"tcp://$(NODE_IP):1884", "tcp://$(NODE_IP):1884"},
		{"", ""},
		{"f00__(VAR_A)__", "f00__(VAR_A)__"},
		{"$?_boo_$!", "$?_boo_$!"},
		{"$(VAR_A)$", "A$"},
	} {
		if got := expand(tc.in, lookup); got != tc.want {
			t.Errorf("expand(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestRewritePaths(t *testing.T) {
	rs := newRewrites(map[string]string{
		"/mosquitto/config":    "/state/pods/x/volumes/config",
		"/mosquitto/config/a":  "/state/pods/x/volumes/nested",
		"/host/sys/fs/cgroup/": "/sys/fs/cgroup",
		"/":                    "/never",
		"/tmp":                 "/tmp/node/volumes/tmp",
	})
	for _, tc := range []struct{ in, want string }{
		{"/mosquitto/config/mosquitto.conf", "/state/pods/x/volumes/config/mosquitto.conf"},
		{"/mosquitto/config", "/state/pods/x/volumes/config"},
		{"/mosquitto/config/a/b", "/state/pods/x/volumes/nested/b"}, // nested mount wins
		{"/mosquitto/configx", "/mosquitto/configx"},                // not a path prefix
		{"--host-cgroup-root=/host/sys/fs/cgroup", "--host-cgroup-root=/sys/fs/cgroup"},
		{"-c=/mosquitto/config/m.conf", "-c=/state/pods/x/volumes/config/m.conf"},
		{"A=/tmp/x,B=/tmp/y", "A=/tmp/node/volumes/tmp/x,B=/tmp/node/volumes/tmp/y"},
		{"x/mosquitto/config", "x/mosquitto/config"}, // not at a start
		{"cat /mosquitto/config/a", "cat /mosquitto/config/a"},
		{"/etc/passwd", "/etc/passwd"},
		{"", ""},
		// Applied once: a host path under a mountPath is not rewritten again.
		{"/tmp/node/volumes/tmp/x", "/tmp/node/volumes/tmp/node/volumes/tmp/x"},
	} {
		if got := rewritePaths(tc.in, rs); got != tc.want {
			t.Errorf("rewritePaths(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got := rewritePaths("/a/b", nil); got != "/a/b" {
		t.Errorf("no rewrites: %q", got)
	}
}

func TestCommandLine(t *testing.T) {
	img := Image{Entrypoint: []string{"/usr/sbin/mosquitto"}, Cmd: []string{"-c", "/mosquitto/config/mosquitto.conf"}}
	vars := []envVar{{"PORT", "1883"}, {"DIR", "/mosquitto/config"}}
	for _, tc := range []struct {
		name          string
		command, args []string
		want          []string
	}{
		{"image", nil, nil, []string{"/usr/sbin/mosquitto", "-c", "/mosquitto/config/mosquitto.conf"}},
		{"args replace cmd", nil, []string{"-p", "$(PORT)"}, []string{"/usr/sbin/mosquitto", "-p", "1883"}},
		{"command drops cmd", []string{"/bin/sh", "-c"}, nil, []string{"/bin/sh", "-c"}},
		{"command and args", []string{"$(DIR)/run"}, []string{"$(PORT)", "$$(PORT)", "$(NOPE)"}, []string{"/mosquitto/config/run", "1883", "$(PORT)", "$(NOPE)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := commandLine(img, &corev1.Container{Command: tc.command, Args: tc.args}, lookupIn(vars))
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	imgWithVar := Image{Entrypoint: []string{"/bin/echo", "$(PORT)"}}
	if got := commandLine(imgWithVar, &corev1.Container{}, lookupIn(vars)); got[1] != "$(PORT)" {
		t.Errorf("the image's entrypoint was expanded: %q", got)
	}
}

type fakeObjects struct {
	cms     map[string]*corev1.ConfigMap
	secrets map[string]*corev1.Secret
}

func (f fakeObjects) configMap(name string) (*corev1.ConfigMap, error) {
	if cm, ok := f.cms[name]; ok {
		return cm, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, name)
}

func (f fakeObjects) secret(name string) (*corev1.Secret, error) {
	if s, ok := f.secrets[name]; ok {
		return s, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
}

func TestContainerEnv(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "broker-0", Namespace: "mqtt", UID: "1234-abcd", Labels: map[string]string{"app": "edge", "tier": "x"}},
		Spec:       corev1.PodSpec{NodeName: "amf-lab", ServiceAccountName: "amf"},
	}
	src := fakeObjects{
		cms:     map[string]*corev1.ConfigMap{"cfg": {Data: map[string]string{"port": "1883", "bad=name": "x", "level": "debug"}}},
		secrets: map[string]*corev1.Secret{"sec": {Data: map[string][]byte{"token": []byte("s3cret")}}},
	}
	field := func(p string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: p}}
	}
	c := &corev1.Container{
		Name: "sidecar",
		Resources: corev1.ResourceRequirements{
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("48Mi"), corev1.ResourceCPU: resource.MustParse("100m")},
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")},
		},
		EnvFrom: []corev1.EnvFromSource{{Prefix: "CFG_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}},
		Env: []corev1.EnvVar{
			{Name: "POD_UID", ValueFrom: field("metadata.uid")},
			{Name: "POD_NAME", ValueFrom: field("metadata.name")},
			{Name: "POD_NAMESPACE", ValueFrom: field("metadata.namespace")},
			{Name: "NODE", ValueFrom: field("spec.nodeName")},
			{Name: "SA", ValueFrom: field("spec.serviceAccountName")},
			{Name: "NODE_IP", ValueFrom: field("status.hostIP")},
			{Name: "POD_IP", ValueFrom: field("status.podIP")},
			{Name: "APP", ValueFrom: field("metadata.labels['app']")},
			{Name: "AMF_AGENT", Value: "tcp://$(NODE_IP):1884"},
			{Name: "LATER", Value: "$(DEFINED_AFTER)"},
			{Name: "DEFINED_AFTER", Value: "x"},
			{Name: "ESCAPED", Value: "$$(NODE_IP)"},
			{Name: "FROM_ENVFROM", Value: "$(CFG_port)"},
			{Name: "PORT", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, Key: "port"}}},
			{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "sec"}, Key: "token"}}},
			{Name: "OPT", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Key: "k", Optional: ptr.To(true)}}},
			{Name: "MEM_MI", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}}},
			{Name: "CPU_M", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "requests.cpu", Divisor: resource.MustParse("1m")}}},
			{Name: "CPU", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.cpu"}}},
		},
	}
	vars, err := containerEnv(pod, c, podFacts{hostIP: "127.0.0.1"}, src)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	var names []string
	for _, v := range vars {
		got[v.name] = v.value
		names = append(names, v.name)
	}
	want := map[string]string{
		"CFG_port": "1883", "CFG_level": "debug",
		"POD_UID": "1234-abcd", "POD_NAME": "broker-0", "POD_NAMESPACE": "mqtt", "NODE": "amf-lab", "SA": "amf",
		"NODE_IP": "127.0.0.1", "POD_IP": "127.0.0.1", "APP": "edge",
		"AMF_AGENT": "tcp://127.0.0.1:1884", "LATER": "$(DEFINED_AFTER)", "DEFINED_AFTER": "x", "ESCAPED": "$(NODE_IP)",
		"FROM_ENVFROM": "1883", "PORT": "1883", "TOKEN": "s3cret", "MEM_MI": "48", "CPU_M": "10", "CPU": "1",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if _, ok := got["OPT"]; ok {
		t.Error("an absent optional reference set its variable")
	}
	if _, ok := got["CFG_bad=name"]; ok {
		t.Error("envFrom kept an invalid name")
	}
	if names[0] != "CFG_level" || names[1] != "CFG_port" {
		t.Errorf("envFrom first, sorted: %v", names)
	}

	for _, tc := range []struct {
		name string
		env  corev1.EnvVar
	}{
		{"missing configmap", corev1.EnvVar{Name: "X", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Key: "k"}}}},
		{"missing key", corev1.EnvVar{Name: "X", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, Key: "nokey"}}}},
		{"missing secret", corev1.EnvVar{Name: "X", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Key: "k"}}}},
		{"unknown field", corev1.EnvVar{Name: "X", ValueFrom: field("spec.nope")}},
	} {
		_, err := containerEnv(pod, &corev1.Container{Env: []corev1.EnvVar{tc.env}}, podFacts{}, src)
		if err == nil {
			t.Errorf("%s: no error", tc.name)
		}
	}
	var nf apierrors.APIStatus
	_, err = containerEnv(pod, &corev1.Container{Env: []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Key: "k"}}}}}, podFacts{}, src)
	if !errors.As(err, &nf) {
		t.Errorf("the API error is not wrapped: %v", err)
	}
}

func TestProcessEnv(t *testing.T) {
	rs := newRewrites(map[string]string{"/data": "/host/data"})
	img := Image{Env: []string{"PATH=/opt/bin", "LANG=C", "HOME=/data"}}
	env := processEnv(img, "pod-1", []envVar{{"LANG", "en"}, {"CONF", "/data/x.conf"}, {"FLAG", "--dir=/data"}}, rs)
	want := []string{"PATH=/opt/bin", "LANG=en", "HOME=/host/data", "HOSTNAME=pod-1", "CONF=/host/data/x.conf", "FLAG=--dir=/host/data"}
	if !slices.Equal(env, want) {
		t.Errorf("env %q, want %q", env, want)
	}
	env = processEnv(Image{}, "p", nil, nil)
	if env[0] != "PATH="+defaultPath {
		t.Errorf("default PATH: %q", env)
	}
}

func TestLookPath(t *testing.T) {
	if p, err := lookPath("sh", []string{"PATH=/nonexistent:/bin"}); err != nil || p != "/bin/sh" {
		t.Errorf("sh: %q %v", p, err)
	}
	if _, err := lookPath("sh", []string{"PATH=/nonexistent"}); err == nil {
		t.Error("sh found in /nonexistent")
	}
	if _, err := lookPath("/etc/passwd", nil); err == nil {
		t.Error("/etc/passwd is executable?")
	}
	if _, err := lookPath("", nil); err == nil {
		t.Error("empty name accepted")
	}
}

func TestImages(t *testing.T) {
	images := map[string]Image{
		"eclipse-mosquitto":            {Entrypoint: []string{"/usr/sbin/mosquitto"}},
		"ghcr.io/amf-edge/amf-sidecar": {Entrypoint: []string{"/bin/amf-sidecar"}},
		"localhost:5000/broker":        {Entrypoint: []string{"/bin/b"}},
		"docker.io/library/busybox":    {Entrypoint: []string{"/bin/busybox"}},
	}
	for _, tc := range []struct {
		ref, repo string
		found     bool
	}{
		{"eclipse-mosquitto:2.0.20", "eclipse-mosquitto", true},
		{"eclipse-mosquitto", "eclipse-mosquitto", true},
		{"docker.io/library/eclipse-mosquitto:2", "eclipse-mosquitto", true},
		{"eclipse-mosquitto@sha256:0123", "eclipse-mosquitto", true},
		{"ghcr.io/amf-edge/amf-sidecar:v0.1.0", "ghcr.io/amf-edge/amf-sidecar", true},
		{"ghcr.io/amf-edge/amf-sidecar:v0.1.0@sha256:abcd", "ghcr.io/amf-edge/amf-sidecar", true},
		{"localhost:5000/broker:v1", "localhost:5000/broker", true},
		{"busybox:1.36", "docker.io/library/busybox", true},
		{"ghcr.io/amf-edge/amf-agent:v0.1.0", "ghcr.io/amf-edge/amf-agent", false},
		{"localhost:5000/other", "localhost:5000/other", false},
	} {
		_, repo, ok := lookupImage(images, tc.ref)
		if ok != tc.found || repo != tc.repo {
			t.Errorf("lookupImage(%q) = %q %v, want %q %v", tc.ref, repo, ok, tc.repo, tc.found)
		}
	}
}
