package inject

// The YAML stream: documents in, documents out.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

var separator = regexp.MustCompile(`(?m)^---[ \t]*(#.*)?$`)

// document is one YAML document of the stream.
type document struct {
	raw        []byte
	deployment *appsv1.Deployment            // nil: pass through
	claim      *corev1.PersistentVolumeClaim // passed through; read for a standby's own
	where      string                        // for messages: "document 2 (Deployment x)"
}

// leadingComments is the comment block that opens a document, which
// re-serialization would otherwise drop.
func leadingComments(raw []byte) []byte {
	n := 0
	for _, line := range bytes.SplitAfter(raw, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			break
		}
		n += len(line)
	}
	return raw[:n]
}

// parse splits the stream and decodes its apps/v1 Deployments.
func parse(in []byte) ([]document, error) {
	var docs []document
	n := 0
	for _, part := range separator.Split(string(in), -1) {
		raw := []byte(part)
		if len(bytes.TrimSpace(raw)) == 0 {
			continue
		}
		raw = bytes.TrimLeft(raw, "\n")
		if !bytes.HasSuffix(raw, []byte("\n")) {
			raw = append(raw, '\n')
		}
		n++
		where := fmt.Sprintf("document %d", n)
		items, isList, err := listItems(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if !isList {
			items = [][]byte{raw}
		}
		for i, item := range items {
			w := where
			if isList {
				w = fmt.Sprintf("%s item %d", where, i+1)
			}
			d, err := parseDocument(item, w)
			if err != nil {
				return nil, err
			}
			docs = append(docs, d)
		}
	}
	return docs, nil
}

// listItems returns the items of a v1 List (kubectl get -o yaml of several
// objects) as YAML documents, so that the List is written as separate documents.
func listItems(raw []byte) (items [][]byte, isList bool, err error) {
	var list struct {
		APIVersion string            `json:"apiVersion"`
		Kind       string            `json:"kind"`
		Items      []json.RawMessage `json:"items"`
	}
	if err := yaml.Unmarshal(raw, &list); err != nil || list.Kind != "List" || list.APIVersion != "v1" {
		return nil, false, nil // not a List; parseDocument reports bad YAML
	}
	for i, it := range list.Items {
		y, err := yaml.JSONToYAML(it)
		if err != nil {
			return nil, true, fmt.Errorf("item %d: %w", i+1, err)
		}
		items = append(items, y)
	}
	return items, true, nil
}

// parseDocument decodes one document; where names it in messages.
func parseDocument(raw []byte, where string) (document, error) {
	d := document{raw: raw, where: where}
	var meta struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(raw, &meta); err != nil {
		return d, fmt.Errorf("%s: not YAML: %w", d.where, err)
	}
	if meta.Kind != "" {
		d.where = fmt.Sprintf("%s (%s)", d.where, strings.TrimSpace(meta.Kind+" "+meta.Metadata.Name))
	}
	switch {
	case meta.Kind == "Deployment" && meta.APIVersion == "apps/v1":
		var dep appsv1.Deployment
		if err := yaml.UnmarshalStrict(raw, &dep); err != nil {
			return d, fmt.Errorf("%s: not an apps/v1 Deployment this version knows: %w", d.where, err)
		}
		if dep.Name == "" {
			return d, fmt.Errorf("%s: Deployment without metadata.name", d.where)
		}
		d.deployment = &dep
	case meta.Kind == "Deployment":
		return d, fmt.Errorf("%s: apiVersion %q: only apps/v1 Deployments can be injected", d.where, meta.APIVersion)
	case meta.Kind == "StatefulSet":
		return d, fmt.Errorf("%s: a StatefulSet is not injected: AMF pairs a primary Deployment with a standby Deployment, which its agent scales; "+
			"run a one-replica broker as a Deployment (strategy Recreate, its claim in the input: inject --standby gives the standby a claim of its own), "+
			"or leave this StatefulSet out of the input if it is not the broker", d.where)
	case meta.Kind == "PersistentVolumeClaim" && meta.APIVersion == "v1":
		var c corev1.PersistentVolumeClaim
		if err := yaml.Unmarshal(raw, &c); err != nil {
			return d, fmt.Errorf("%s: not a v1 PersistentVolumeClaim: %w", d.where, err)
		}
		d.claim = &c
	case strings.HasSuffix(meta.Kind, "List"):
		return d, fmt.Errorf("%s: a %s %s is not injected: give its items as separate documents (for example kubectl get deployment NAME -o yaml)", d.where, meta.APIVersion, meta.Kind)
	}
	return d, nil
}

// marshal writes d as YAML without status and null timestamps.
func marshal(d *appsv1.Deployment) ([]byte, error) {
	d = d.DeepCopy()
	d.APIVersion, d.Kind = "apps/v1", "Deployment"
	// Written by the server (kubectl get -o yaml): the output is a manifest to
	// apply, not an update of that snapshot.
	d.UID, d.ResourceVersion, d.Generation, d.ManagedFields = "", "", 0, nil
	d.CreationTimestamp = metav1.Time{}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(d)
	if err != nil {
		return nil, err
	}
	delete(u, "status")
	if spec, _ := u["spec"].(map[string]any); spec != nil {
		if st, _ := spec["strategy"].(map[string]any); st != nil && len(st) == 0 {
			delete(spec, "strategy")
		}
	}
	for _, path := range [][]string{{"metadata"}, {"spec", "template", "metadata"}} {
		m := u
		for _, p := range path {
			m, _ = m[p].(map[string]any)
		}
		if m != nil && m["creationTimestamp"] == nil {
			delete(m, "creationTimestamp")
		}
	}
	return yaml.Marshal(u)
}

// output is the stream Inject writes: documents joined by "---" lines.
type output struct {
	buf bytes.Buffer
	n   int // documents written
}

// add writes one document: the comment lines that open it, then its body.
func (o *output) add(comments, body []byte) {
	if o.n > 0 {
		o.buf.WriteString("---\n")
	}
	o.n++
	o.buf.Write(comments)
	o.buf.Write(body)
}

// bytes is the stream written; nil if no document was.
func (o *output) bytes() []byte { return o.buf.Bytes() }

// deployment writes dep, injected from the document raw, after the comment
// lines that opened raw.
func (o *output) deployment(raw []byte, dep *appsv1.Deployment) error {
	b, err := marshal(dep)
	if err != nil {
		return err
	}
	o.add(leadingComments(raw), b)
	return nil
}

// standby writes s, derived from primary, and after it the claims of its
// own, each under a comment saying where it comes from.
func (o *output) standby(primary *appsv1.Deployment, s *standby) error {
	b, err := marshal(s.Deployment)
	if err != nil {
		return fmt.Errorf("standby: %w", err)
	}
	o.add([]byte(standbyComment(primary.Name, redundancy(primary), s.shared)), b)
	for _, c := range s.claims {
		b, err := marshalClaim(c.PersistentVolumeClaim)
		if err != nil {
			return fmt.Errorf("claim of the standby: %w", err)
		}
		o.add([]byte(claimComment(c.From, s.Name)), b)
	}
	return nil
}
