package experiment

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/inject"
	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/testbed"
)

// The amf mode's pair is what inject --standby --state-dir writes of the
// edge broker: its data on a volume the sidecar mounts, persistence on in
// each broker's configuration, the standby cold and on its own
// configuration (its bridges' client IDs), the model folder mounted.
func TestStatefulEdgeIsWhatInjectWrites(t *testing.T) {
	ed := testbed.Edge{Namespace: "amf-1", Node: NodeName, RDS: "10.0.0.1:1883", OBU: "10.0.0.2:1883", Bridge: testbed.DefaultBridge,
		BrokerPortA: 1883, BrokerPortB: 1883, BrokerImage: images.MosquittoRef, SidecarModel: testbed.ModelMount + "/m.json", ModelDir: "/tmp/models",
		Policy: map[string]string{contract.AnnDebounce: "3"}}
	objs, err := statefulEdge(ed)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.Deployments) != 2 || len(objs.ConfigMaps) != 2 {
		t.Fatalf("%d Deployments, %d ConfigMaps; want 2 and 2", len(objs.Deployments), len(objs.ConfigMaps))
	}
	primary, standby := objs.Deployments[0], objs.Deployments[1]
	if primary.Name != testbed.PrimaryName || standby.Name != testbed.StandbyName {
		t.Fatalf("Deployments %s, %s", primary.Name, standby.Name)
	}
	if a := primary.Annotations; a[contract.AnnStandby] != testbed.StandbyName || a[contract.AnnRedundancy] != string(contract.Cold) || a[contract.AnnDebounce] != "3" {
		t.Errorf("the primary's annotations %v: want its cold standby named and the run's policy", a)
	}
	if r := ptr.Deref(standby.Spec.Replicas, -1); r != 0 {
		t.Errorf("the standby has %d replicas, want 0 (cold)", r)
	}
	for i, d := range objs.Deployments {
		spec := d.Spec.Template.Spec
		if got := d.Spec.Template.Annotations[contract.AnnStateDir]; got != brokerstate.DataDir {
			t.Errorf("%s: %s = %q, want %s", d.Name, contract.AnnStateDir, got, brokerstate.DataDir)
		}
		sidecar := container(spec.InitContainers, inject.SidecarName)
		broker := container(spec.Containers, testbed.BrokerContainer)
		if sidecar == nil || broker == nil {
			t.Fatalf("%s: no sidecar or no broker", d.Name)
		}
		if !mounts(*broker, "data", brokerstate.DataDir) || !mounts(*sidecar, "data", brokerstate.DataDir) {
			t.Errorf("%s: the broker's and the sidecar's mounts %v, %v: want the data volume at %s in both", d.Name, broker.VolumeMounts, sidecar.VolumeMounts, brokerstate.DataDir)
		}
		if !mounts(*sidecar, "amf-models", testbed.ModelMount) || !slices.Contains(sidecar.Args, "--model="+ed.SidecarModel) {
			t.Errorf("%s: the sidecar's mounts %v and arguments %v: want the model folder and the model", d.Name, sidecar.VolumeMounts, sidecar.Args)
		}
		if !ptr.Deref(spec.ShareProcessNamespace, false) {
			t.Errorf("%s: the pod's process namespace is not shared: the sidecar cannot signal its broker", d.Name)
		}
		config := []string{testbed.PrimaryName, testbed.StandbyName}[i]
		if v := volume(spec.Volumes, "config"); v == nil || v.ConfigMap == nil || v.ConfigMap.Name != config {
			t.Errorf("%s: config volume %+v, want ConfigMap %s", d.Name, v, config)
		}
	}
	for i, cm := range objs.ConfigMaps {
		conf := cm.Data["mosquitto.conf"]
		id := []string{"edge-a", "edge-b"}[i]
		if !strings.Contains(conf, "\npersistence true\npersistence_location "+brokerstate.DataDir+"/\n") || strings.Contains(conf, "persistence false") ||
			!strings.Contains(conf, "local_clientid "+id+"-obu\n") {
			t.Errorf("ConfigMap %s:\n%s\nwant persistence on in %s and the bridges' client IDs %s-*", cm.Name, conf, brokerstate.DataDir, id)
		}
	}
}

// The state's figures sit beside the run's others in results.json
// (state_retained_lost, switchover_complete_s, ...), only for a stateful
// run, and the summary has a table of them and the agent's Events.
func TestResultsSayWhatBecameOfTheState(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	carried := RunResult{Mode: AMF, Index: 1, StandbyReady: f(5.2), PrimaryRetired: f(5.9), StateHandedOn: f(6.8), StateCarried: f(8.3), NewPrimaryReady: f(8.6), SwitchoverComplete: f(8.6),
		StateNotes: []string{"StateCarried: edge-broker-b runs on the final state of edge-broker-a"},
		StateCheck: stateCheckOf(statePlan, brokerstate.Result{RetainedFound: statePlan.Retained})}
	lost := RunResult{Mode: AMF, Index: 2, PrimaryRetired: f(6), NewPrimaryReady: f(16), SwitchoverComplete: f(16),
		StateCheck: stateCheckOf(statePlan, brokerstate.Result{RetainedLost: statePlan.Retained, SessionsLost: statePlan.SessionIDs(), QueuedLost: 15})}
	unchecked := RunResult{Mode: AMF, Index: 3, StateError: "no switchover: the state was not carried anywhere"}
	res := Results{StatePlan: planText(statePlan), Runs: []RunResult{carried, lost, unchecked, {Mode: Reactive, Index: 1}}}

	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var back struct{ Runs []map[string]any }
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{"state_retained": 200.0, "state_retained_lost": 0.0, "state_sessions": 3.0, "state_sessions_lost": 0.0,
		"state_qos1": 15.0, "state_qos1_lost": 0.0, "state_duplicates": 0.0, "switchover_complete_s": 8.6, "state_carried_s": 8.3} {
		if got := back.Runs[0][k]; got != want {
			t.Errorf("run 1: %s = %v, want %v", k, got, want)
		}
	}
	if got := back.Runs[1]["state_sessions_lost"]; got != 3.0 {
		t.Errorf("run 2: state_sessions_lost = %v, want 3", got)
	}
	for _, r := range back.Runs[2:] {
		for k := range r {
			if strings.HasPrefix(k, "state_") && k != "state_error" || k == "switchover_complete_s" {
				t.Errorf("run %v (%v) has %s: a run without a check has no figures", r["run"], r["mode"], k)
			}
		}
	}
	if !carried.StateCheck.lossless() || lost.StateCheck.lossless() {
		t.Errorf("lossless: %v, %v; want true, false", carried.StateCheck.lossless(), lost.StateCheck.lossless())
	}
	// A run without a check prints as any value does (RunResult embeds a
	// nil *StateCheck, whose methods it must not take for its own).
	if s := fmt.Sprintf("%v", unchecked); strings.Contains(s, "PANIC") {
		t.Errorf("%%v of a run without a check: %s", s)
	}
	if l := carried.Line(); !strings.Contains(l, "switchover complete +8.6 s") || !strings.Contains(l, "state on the new primary: retained lost 0 of 200, sessions lost 0 of 3, QoS 1 lost 0 of 15, duplicates 0") {
		t.Errorf("line %q", l)
	}

	var out bytes.Buffer
	res.Summary(&out)
	s := out.String()
	for _, want := range []string{
		"| 1 | – | – | 5.2 | 8.6 | no |", // the AMF table's switchover complete: the stateful one
		"before the fault the primary held 200 retained messages, 2 MQTT 3.1.1 and 1 MQTT 5 persistent sessions, 5 QoS 1 messages queued for each",
		"| 1 | 5.2 | 5.9 | 6.8 | 8.3 | 8.6 | 8.6 | 2.70 | 0 of 200 | 0 of 3 | 0 of 15 | 0 |",
		"| 2 | – | 6.0 | – | – | 16.0 | 16.0 | 10.00 | 200 of 200 | 3 of 3 | 15 of 15 | 0 |",
		"- run 1: StateCarried: edge-broker-b runs on the final state of edge-broker-a\n",
		"- run 3: not checked: no switchover",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("summary lacks %q:\n%s", want, s)
		}
	}
}

func container(cs []corev1.Container, name string) *corev1.Container {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

func volume(vs []corev1.Volume, name string) *corev1.Volume {
	for i := range vs {
		if vs[i].Name == name {
			return &vs[i]
		}
	}
	return nil
}

func mounts(c corev1.Container, volume, at string) bool {
	return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == volume && m.MountPath == at })
}
