package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
	"github.com/amf-edge/amf/lab/testbed"
)

// TestStateBenchSeesWhatEachRestartKeeps runs bench state once on a real
// node with a small state: a crash with Mosquitto's default autosave loses
// everything (nothing was ever saved), a clean stop, AMF's handover levers
// and the agent's switchover and crash failover of a stateful pair lose
// nothing (the crash: nothing of the plan came after the last snapshot),
// the crash carries a retained clock as of that snapshot, and the report
// says so.
func TestStateBenchSeesWhatEachRestartKeeps(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real node")
	}
	cp, n := kubenodetest.Start(t, kubenodetest.Options{ControlPlane: controlplane.Options{NoFakeNodes: true}})
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	plan := brokerstate.Plan{Retained: 30, Sessions: 2, V5Sessions: 1, Queued: 3}
	repo, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	rep, err := RunState(ctx, StateConfig{Plan: plan, ControlPlane: cp, Node: n, Repo: repo})
	if err != nil {
		t.Fatal(err)
	}
	byKey := map[string]brokerstate.Result{}
	for _, c := range rep.Cases {
		byKey[c.Key] = c.Result
		t.Logf("%s: %v, back after %v", c.Key, c.Result, c.Back)
	}
	if r := byKey["k8s_crash"]; r.RetainedLost != plan.Retained || len(r.SessionsLost) != 3 || r.QueuedLost != 9 {
		t.Errorf("k8s_crash: %v; want everything lost (autosave 1800 s: nothing saved before the kill)", r)
	}
	for _, k := range []string{"k8s_restart", "handover", "switchover", "crash"} {
		if r := byKey[k]; !r.Lossless() || r.RetainedFound != plan.Retained || r.QueuedFound != 9 || r.Duplicates != 0 {
			t.Errorf("%s: %v; want nothing lost, nothing twice", k, r)
		}
	}
	for _, c := range rep.Cases {
		if c.Key == "crash" && c.RetainedAge <= 0 {
			t.Errorf("crash: the retained clock's age on the new primary %v; want it carried (above 0: the clock ran up to the crash)", c.RetainedAge)
		}
		if l := c.Live; l != nil && (l.Lost != 0 || l.Refused != 0 || l.MarkerMissed || l.Acked == 0) {
			t.Errorf("%s: live QoS 1 clients %v; want nothing lost or given up; the agent said of the pair:\n%s", c.Key, *l, c.AgentSaid)
		}
	}
	var out strings.Builder
	WriteStateReport(&out, rep)
	if !strings.Contains(out.String(), `"k8s_crash_retained_lost":30`) || !strings.Contains(out.String(), `"handover_qos1_lost":0`) ||
		!strings.Contains(out.String(), `"switchover_qos1_lost":0`) || !strings.Contains(out.String(), `"switchover_complete_s":`) ||
		!strings.Contains(out.String(), `"switchover_live_lost":0`) || !strings.Contains(out.String(), `"crash_retained_age_s":`) {
		t.Errorf("report's JSON line lacks the figures:\n%s", out.String())
	}
}
