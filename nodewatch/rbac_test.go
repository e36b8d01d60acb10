package nodewatch

import (
	"os"
	"reflect"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// TestRBACFileMatchesRules keeps the overlay's ClusterRole, the rules written
// down for people and manifests, equal to Rules().
func TestRBACFileMatchesRules(t *testing.T) {
	const file = "../manifests/overlays/node-mode/clusterrole-node-mode.yaml"
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(b, &role); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(role.Rules, Rules()) {
		t.Errorf("%s rules\n%+v\ndiffer from Rules()\n%+v", file, role.Rules, Rules())
	}
}
