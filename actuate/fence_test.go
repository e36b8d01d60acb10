package actuate

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
)

// commands records what an Actuator sends to the sidecars.
type commands struct {
	mu   sync.Mutex
	sent []podsignal.Command
}

func (c *commands) send(cmd podsignal.Command) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent = append(c.sent, cmd)
	return nil
}

func (c *commands) all() []podsignal.Command {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.sent)
}

func TestFencePausesTheGuardedPrimaryAndLiftsItOnlyWhileItStillServes(t *testing.T) {
	unreachable := errors.New("dial tcp 10.0.0.1:6443: i/o timeout")
	for _, tc := range []struct {
		name     string
		standby  string               // the standby's node
		meantime func(f *fakeCluster) // what happened while cut off
		apiDown  bool                 // the first Lift cannot read the primary
		fenced   bool                 // a fence command is sent
		lifted   bool                 // a lift command is sent
		nodeMode bool                 // the primary is in node mode: no sidecar to command
	}{
		{"nothing happened meanwhile: paused, then resumed", "node-b", nil, false, true, true, false},
		{"the API server still unreachable at the first lift: kept, resumed at the next", "node-b", nil, true, true, true, false},
		{"the guard retired the primary: kept paused for the kubelet to stop", "node-b", func(f *fakeCluster) {
			*f.depLocked(ns, "primary").Spec.Replicas = 0
		}, false, true, false, false},
		{"the guard recorded a failover: kept paused", "node-b", func(f *fakeCluster) {
			d := f.depLocked(ns, "primary")
			d.Annotations = maps.Clone(d.Annotations)
			d.Annotations[contract.AnnRecord] = `{"phase":"Retiring","standby":"standby"}`
		}, false, true, false, false},
		{"the roles were exchanged: kept paused", "node-b", func(f *fakeCluster) {
			d := f.depLocked(ns, "primary")
			d.Annotations = maps.Clone(d.Annotations)
			delete(d.Annotations, contract.AnnStandby)
		}, false, true, false, false},
		{"the standby on the same node: nobody guards it, nothing to fence", "node-a", nil, false, false, false, false},
		{"node mode: no sidecar to pause the broker, the fence only reported", "node-b", nil, false, false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCluster()
			pp, _ := f.addHotPair(ns, "primary", "standby", map[string]string{contract.AnnStandbyNode: tc.standby})
			if tc.nodeMode {
				f.Lock()
				d := f.depLocked(ns, "primary")
				d.Annotations = maps.Clone(d.Annotations)
				d.Annotations[contract.AnnMode] = string(contract.ModeNode)
				f.Unlock()
			}
			var cmds commands
			g := &guardRig{}
			cfg := Config{Node: "node-a", Instance: "node-a", Command: cmds.send, OnGuards: func(gs Guards) {
				g.mu.Lock()
				g.guards = append(g.guards, gs)
				g.mu.Unlock()
				f.Lock()
				f.ChangedLocked(nil)
				f.Unlock()
			}}
			g.rig = start(t, f, "", cfg)
			g.act = g.rig.act
			g.send(podsignal.Healthy, pp)
			f.await(t, "own node recorded on the standby", func() bool { return f.depLocked(ns, "standby").Annotations[contract.AnnPrimaryNode] == "node-a" })
			if tc.standby != "node-a" {
				f.await(t, "guarded by the standby's node", func() bool { return slices.Equal(g.latest().GuardedBy, []string{tc.standby}) })
			}
			g.act.NodeBack(context.Background(), "node-x", g.act.now()) // a barrier: Run synced the nodes

			// A restarted agent lifts what its predecessor may have fenced:
			// one lift for the guarded primary, once it is known here.
			arrival := cmds.all()
			if wantArrival := tc.fenced; (len(arrival) == 1 && !arrival[0].Fence && arrival[0].Pod == pp) != wantArrival || (!wantArrival && len(arrival) > 0) {
				t.Fatalf("on arrival, commands %+v; want one lift of %s: %v", arrival, pp, wantArrival)
			}
			base := len(arrival)
			g.act.Fence(context.Background(), "cut off", []string{"node-c"}) // another guard's: not this primary's
			if got := cmds.all()[base:]; len(got) != 0 {
				t.Fatalf("fenced for a guard that does not guard it: %+v", got)
			}
			g.act.Fence(context.Background(), "cut off", []string{"node-b"})
			if tc.nodeMode {
				g.logs.wait(t, "the fence reported", func(l map[string]any) bool {
					return l["msg"] == "fence only reported: in node mode no sidecar can pause the broker"
				})
			}
			got := cmds.all()[base:]
			if fenced := len(got) == 1 && got[0].Fence && got[0].Pod == pp && got[0].Namespace == ns; fenced != tc.fenced || (!tc.fenced && len(got) > 0) {
				t.Fatalf("after the fence, commands %+v; want a fence of %s: %v", got, pp, tc.fenced)
			}
			f.Lock()
			if tc.meantime != nil {
				tc.meantime(f)
			}
			if tc.apiDown {
				f.Fail["get"] = unreachable
			}
			f.Unlock()
			if tc.apiDown {
				if n := g.act.Lift(context.Background()); n != 1 {
					t.Errorf("Lift with the API server unreachable: %d unsettled, want 1", n)
				}
				if got := cmds.all()[base:]; len(got) != 1 {
					t.Errorf("commands while unreachable: %+v", got)
				}
				f.Lock()
				delete(f.Fail, "get")
				f.Unlock()
			}
			if n := g.act.Lift(context.Background()); n != 0 {
				t.Errorf("Lift: %d unsettled, want 0", n)
			}
			got = cmds.all()[base:]
			lifted := len(got) == 2 && !got[1].Fence && got[1].Pod == pp
			if lifted != tc.lifted || (!tc.lifted && len(got) > 1) {
				t.Errorf("after the lift, commands %+v; want a lift: %v", got, tc.lifted)
			}
			if n := g.act.Lift(context.Background()); n != 0 || len(cmds.all()) != base+len(got) {
				t.Errorf("a second Lift did more: %d unsettled, commands %+v", n, cmds.all())
			}
		})
	}
}
