package liveness

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/cluster/clusterfake"
)

func TestListenRefusesWhatCannotWork(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	ok := PeerConfig{Cluster: clusterfake.New(), Namespace: "amf-system", Node: "n0", Listen: "127.0.0.1:0", Advertise: "10.0.0.5:1885", Timing: DefaultTiming}
	for _, tc := range []struct {
		name string
		edit func(*PeerConfig)
		want string
	}{
		{"a guard that could act before the fence", func(c *PeerConfig) { c.Timing.Lost = c.Timing.Fence }, "at least fence"},
		{"no node", func(c *PeerConfig) { c.Node = "" }, "needs a cluster, the Leases' namespace, its node"},
		{"no advertised address", func(c *PeerConfig) { c.Advertise = "" }, "the one it advertises (missing: Advertise)"},
		{"no probe address: a port nobody knows", func(c *PeerConfig) { c.Listen = "" }, "the address it answers probes at and the one it advertises (missing: Listen)"},
		{"the probe port taken", func(c *PeerConfig) { c.Listen = taken.Addr().String() }, "answer probes at " + taken.Addr().String()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.edit(&cfg)
			a, err := Listen(cfg)
			if err == nil {
				a.ln.Close()
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to say %q", err, tc.want)
			}
		})
	}
	a, err := Listen(ok)
	if err != nil {
		t.Fatal(err)
	}
	a.ln.Close()
	// SetGuards never blocks, whatever Run is doing: it keeps the latest.
	done := make(chan struct{})
	go func() {
		for range 3 {
			a.SetGuards([]string{"n1"}, []string{"n2"})
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("SetGuards blocked without a Run")
	}
	if g := <-a.guards; g.guard[0] != "n1" || g.guardedBy[0] != "n2" {
		t.Fatalf("kept %+v", g)
	}
}
