package manifests_test

import (
	"bytes"
	"os/exec"
	"regexp"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"
)

var separator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// split returns the non-empty documents of a multi-document YAML stream.
func split(stream []byte) [][]byte {
	var docs [][]byte
	for _, d := range separator.Split(string(stream), -1) {
		if b := bytes.TrimSpace([]byte(d)); len(b) > 0 {
			docs = append(docs, b)
		}
	}
	return docs
}

func documents(t *testing.T, stream []byte) int {
	t.Helper()
	return len(split(stream))
}

// namespaces returns the Namespace documents of stream as a stream.
func namespaces(t *testing.T, stream []byte) []byte {
	t.Helper()
	var out [][]byte
	for _, d := range split(stream) {
		var obj struct{ Kind string }
		if err := yaml.Unmarshal(d, &obj); err != nil {
			t.Fatal(err)
		}
		if obj.Kind == "Namespace" {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		t.Fatal("layout renders no Namespace")
	}
	return bytes.Join(out, []byte("\n---\n"))
}

// kustomize renders a layout with the project's kubectl, without a cluster.
func kustomize(t *testing.T, kubectl, layout string) []byte {
	t.Helper()
	cmd := exec.Command(kubectl, "kustomize", layout)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v: %s", layout, err, stderr.Bytes())
	}
	return out
}

func tolerates(ts []corev1.Toleration, key string) bool {
	return slices.ContainsFunc(ts, func(t corev1.Toleration) bool { return t.Key == key })
}

func contains(s []string, v string) bool { return slices.Contains(s, v) }

func condition(p *corev1.Pod, typ corev1.PodConditionType) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == typ {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func mustQuantity(s string) resource.Quantity { return resource.MustParse(s) }
