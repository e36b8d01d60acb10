package soak

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/lab/kubenode"
)

// TestAFaultActsOnEveryPairWhosePrimaryItTakes: which pairs a step must
// fail over follows where the primaries run when it begins, not which
// pair the step names alone.
func TestAFaultActsOnEveryPairWhosePrimaryItTakes(t *testing.T) {
	n0, n1, n2 := &kubenode.Node{Name: "n0"}, &kubenode.Node{Name: "n1"}, &kubenode.Node{Name: "n2"}
	apart := []*pairRun{{at: [2]*kubenode.Node{n0, n1}}, {at: [2]*kubenode.Node{n1, n0}}}    // as a run starts
	together := []*pairRun{{at: [2]*kubenode.Node{n0, n1}}, {at: [2]*kubenode.Node{n0, n1}}} // both primaries on n0
	for _, tc := range []struct {
		name  string
		pairs []*pairRun
		st    Step
		want  []bool
	}{
		{"a crash takes its own pair's broker only", together, Step{Kind: Crash, On: PrimaryNode, Pair: 1}, []bool{false, true}},
		{"an anomaly too", apart, Step{Kind: Anomaly, On: PrimaryNode, Pair: 0}, []bool{true, false}},
		{"a power cut of a node with one primary", apart, Step{Kind: PowerCut, On: PrimaryNode, Pair: 0}, []bool{true, false}},
		{"a partition of a node with both primaries", together, Step{Kind: Partition, On: PrimaryNode, Pair: 1}, []bool{true, true}},
		{"an asymmetric partition of a node with one primary", apart, Step{Kind: AsymmetricPartition, On: PrimaryNode, Pair: 1}, []bool{false, true}},
		{"the standby's power cut takes the other pair's primary", apart, Step{Kind: StandbyCut, On: StandbyNode, Pair: 0}, []bool{false, true}},
		{"the standby's power cut with both standbys there", together, Step{Kind: StandbyCut, On: StandbyNode, Pair: 0}, []bool{false, false}},
		{"a kubelet restart takes nothing", together, Step{Kind: KubeletRestart, On: PrimaryNode, Pair: 0}, []bool{false, false}},
		{"the agent killed is the guard's to judge", apart, Step{Kind: AgentKilled, On: PrimaryNode, Pair: 0}, []bool{false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &runner{pairs: tc.pairs, third: n2}
			if got := r.acting(tc.st); !slices.Equal(got, tc.want) {
				t.Errorf("acting(%s) = %v, want %v", tc.st, got, tc.want)
			}
		})
	}
}

// TestAHandoverLeftOnADeploymentIsALeftover: the agents remove
// amf.io/state-handover when a handover ends; one still there at the end is
// named, and the annotations a pair keeps are not.
func TestAHandoverLeftOnADeploymentIsALeftover(t *testing.T) {
	dep := func(name string, ann map[string]string) appsv1.Deployment {
		return appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "mqtt-2", Name: name, Annotations: ann}}
	}
	kept := map[string]string{contract.AnnRole: "primary", contract.AnnStandbyReady: "b-1", contract.AnnStandby: "b"}
	if got := staleAnnotations([]appsv1.Deployment{dep("a", kept), dep("b", nil)}); len(got) != 0 {
		t.Errorf("a whole pair's annotations named as left over: %q", got)
	}
	got := staleAnnotations([]appsv1.Deployment{dep("a", kept), dep("b", map[string]string{contract.AnnHandover: `{"from":"a"}`})})
	if len(got) != 1 || !strings.Contains(got[0], "mqtt-2/b") || !strings.Contains(got[0], contract.AnnHandover) {
		t.Errorf("staleAnnotations = %q, want the handover on mqtt-2/b", got)
	}
}
