package manifests_test

import (
	"bytes"
	"os"
	"reflect"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/amf-edge/amf/actuate"
	"github.com/amf-edge/amf/connkill"
	"github.com/amf-edge/amf/liveness"
	"github.com/amf-edge/amf/nodewatch"
)

// TestRBACFilesMatchTheRulesInGo keeps each role written down for people
// and kustomize equal to the rules its package states in Go, which the
// packages' tests bind and probe with SubjectAccessReviews.
func TestRBACFilesMatchTheRulesInGo(t *testing.T) {
	for _, tc := range []struct {
		file      string
		kind      string // Role or ClusterRole, the file's first document
		namespace string // a Role's
		rules     []rbacv1.PolicyRule
	}{
		{"base/clusterrole-actuate.yaml", "ClusterRole", "", actuate.Rules()},
		{"base/role-liveness.yaml", "Role", "amf-system", liveness.Rules()},
		{"base/clusterrole-connkill.yaml", "ClusterRole", "", connkill.WatchRules()},
		{"overlays/node-mode/clusterrole-node-mode.yaml", "ClusterRole", "", nodewatch.Rules()},
	} {
		t.Run(tc.file, func(t *testing.T) {
			b, err := os.ReadFile(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			first, _, _ := bytes.Cut(b, []byte("\n---\n"))
			// A Role's fields are a ClusterRole's without aggregation:
			// one strict decoding reads both.
			var role rbacv1.ClusterRole
			if err := yaml.UnmarshalStrict(first, &role); err != nil {
				t.Fatal(err)
			}
			if role.Kind != tc.kind || role.Namespace != tc.namespace {
				t.Fatalf("first document is a %s in %q, want a %s in %q", role.Kind, role.Namespace, tc.kind, tc.namespace)
			}
			if !reflect.DeepEqual(role.Rules, tc.rules) {
				t.Errorf("rules\n%+v\ndiffer from the Go rules\n%+v", role.Rules, tc.rules)
			}
		})
	}
}
