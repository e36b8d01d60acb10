package actuate

import (
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes/fake"
)

// TestValidateNeedsAClusterOrAClient: the actuator talks to the API server
// through Cluster, or a cluster.Kube on Client; every other setting has a
// default.
func TestValidateNeedsAClusterOrAClient(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  Config
		want string // in the error; "" passes
	}{
		{"a cluster", Config{Cluster: newFakeCluster()}, ""},
		{"a client", Config{Client: fake.NewClientset()}, ""},
		{"neither", Config{Instance: "n1", DryRun: true}, "Config.Cluster or Config.Client is required"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
			if _, nerr := New(tt.cfg); (nerr == nil) != (err == nil) {
				t.Errorf("New: %v, Validate: %v; want both to pass or both to refuse", nerr, err)
			}
		})
	}
}
