package liveness

import (
	"bytes"
	"os"
	"reflect"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// TestRBACFileMatchesRules keeps ../manifests/base/role-liveness.yaml, the
// Role the DaemonSet's agents run under, equal to Rules(), which the tests
// bind and probe with SubjectAccessReviews.
func TestRBACFileMatchesRules(t *testing.T) {
	b, err := os.ReadFile("../manifests/base/role-liveness.yaml")
	if err != nil {
		t.Fatal(err)
	}
	docs := bytes.Split(b, []byte("\n---\n"))
	var role rbacv1.Role
	if err := yaml.UnmarshalStrict(docs[0], &role); err != nil {
		t.Fatal(err)
	}
	if role.Kind != "Role" || role.Namespace != "amf-system" {
		t.Fatalf("first document is a %s in %q, want the Role in amf-system", role.Kind, role.Namespace)
	}
	if !reflect.DeepEqual(role.Rules, Rules()) {
		t.Errorf("../manifests/base/role-liveness.yaml rules\n%+v\ndiffer from Rules()\n%+v", role.Rules, Rules())
	}
}
