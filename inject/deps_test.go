package inject

import (
	"testing"

	"github.com/amf-edge/amf/internal/depcheck"
)

// TestDepsStayPure keeps the rewriter a pure function of YAML: it names the policy through package contract, so it links neither the agent's MQTT broker nor a Kubernetes client.
func TestDepsStayPure(t *testing.T) {
	depcheck.Forbid(t, "inject", "github.com/mochi-mqtt/", "k8s.io/client-go/", "github.com/amf-edge/amf/agent", "github.com/amf-edge/amf/actuate")
}
