package inject

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDepsStayPure keeps the rewriter a pure function of YAML: it names the
// policy through package contract, so it must link neither the agent's MQTT
// broker nor a Kubernetes client.
func TestDepsStayPure(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH: cannot list dependencies")
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/mochi-mqtt/", "k8s.io/client-go/", "github.com/amf-edge/amf/agent", "github.com/amf-edge/amf/actuate"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("inject depends on %s", dep)
			}
		}
	}
}
