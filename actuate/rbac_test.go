package actuate

import (
	"os"
	"reflect"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// TestRBACFileMatchesRules keeps ../manifests/base/clusterrole-actuate.yaml, the rules written down
// for people and manifests, equal to Rules(), which the tests run under.
func TestRBACFileMatchesRules(t *testing.T) {
	b, err := os.ReadFile("../manifests/base/clusterrole-actuate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(b, &role); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(role.Rules, Rules()) {
		t.Errorf("../manifests/base/clusterrole-actuate.yaml rules\n%+v\ndiffer from Rules()\n%+v", role.Rules, Rules())
	}
}
