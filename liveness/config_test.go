package liveness

import (
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/cluster/clusterfake"
)

// TestPeerConfigValidateNamesWhatIsMissingOrUnsafe: a peer needs a safe
// timing, a cluster, the Leases' namespace, its node and the address it
// advertises; the error names the missing fields. Validate binds nothing.
func TestPeerConfigValidateNamesWhatIsMissingOrUnsafe(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(*PeerConfig)
		want string // in the error; "" passes
	}{
		{"complete", func(*PeerConfig) {}, ""},
		{"no logger or registerer", func(c *PeerConfig) { c.Logger, c.Registerer = nil, nil }, ""},
		{"no cluster", func(c *PeerConfig) { c.Cluster = nil }, "(missing: Cluster)"},
		{"no namespace", func(c *PeerConfig) { c.Namespace = "" }, "the Leases' namespace, its node, the address it answers probes at and the one it advertises (missing: Namespace)"},
		{"no node", func(c *PeerConfig) { c.Node = "" }, "(missing: Node)"},
		{"no advertised address", func(c *PeerConfig) { c.Advertise = "" }, "(missing: Advertise)"},
		{"neither node nor address", func(c *PeerConfig) { c.Node, c.Advertise = "", "" }, "(missing: Node, Advertise)"},
		{"no timing", func(c *PeerConfig) { c.Timing = Timing{} }, "must all be positive"},
		{"a guard that could act before the fence", func(c *PeerConfig) { c.Timing.Lost = c.Timing.Fence }, "lost 1.5s must be at least fence"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// A taken address would not matter: Validate binds nothing.
			cfg := PeerConfig{Cluster: clusterfake.New(), Namespace: "amf-system", Node: "n0", Listen: ":1885", Advertise: "10.0.0.5:1885", Timing: DefaultTiming}
			tt.edit(&cfg)
			err := cfg.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
		})
	}
}

// TestGuardConfigValidateNeedsNodesAndASafeTiming: a guard guards at least
// one node through a cluster, knows its namespace and its own node, on a
// timing that lets a cut-off node fence first; the error names every field
// missing.
func TestGuardConfigValidateNeedsNodesAndASafeTiming(t *testing.T) {
	for _, tt := range []struct {
		name string
		edit func(*GuardConfig)
		want string // in the error; "" passes
	}{
		{"complete", func(*GuardConfig) {}, ""},
		{"no nodes", func(c *GuardConfig) { c.Nodes = nil }, "RunGuard needs Nodes to guard"},
		{"no cluster", func(c *GuardConfig) { c.Cluster = nil }, "RunGuard needs Cluster (the API server)"},
		{"no namespace nor own node", func(c *GuardConfig) { c.Namespace, c.Self = "", "" }, "needs Namespace (of the agents' Leases), Self (the guard's own node)"},
		{"a fence within two periods", func(c *GuardConfig) { c.Timing.Fence = c.Timing.Period }, "fence 500ms is under two periods"},
		{"a negative period", func(c *GuardConfig) { c.Timing.Period = -time.Second }, "must all be positive"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := GuardConfig{Cluster: clusterfake.New(), Namespace: "amf-system", Self: "guard", Nodes: []string{"n1"}, Timing: DefaultTiming}
			tt.edit(&cfg)
			err := cfg.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
			if tt.want != "" {
				// RunGuard makes the same check before it watches anything.
				if rerr := RunGuard(t.Context(), cfg); rerr == nil || rerr.Error() != err.Error() {
					t.Errorf("RunGuard: %v, want %v", rerr, err)
				}
			}
		})
	}
}
