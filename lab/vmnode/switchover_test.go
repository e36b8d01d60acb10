package vmnode_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/lab/experiment"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
	"github.com/amf-edge/amf/lab/testbed"
	"github.com/amf-edge/amf/lab/vmnode"
)

// TestSwitchoverToTheV2Node is the make-before-break core of the paper's
// experiment across the two configurations: the lab's cgroup v1 node and
// the guest node as Kubernetes ships it now (cgroup v2, the kubelet at its
// defaults, containerd 2, the systemd driver) on one LAN, the agent
// DaemonSet of manifests/base on both, a stateful pair as inject --standby
// --state-dir writes it with its primary on the v1 node and its standby on
// the v2 node, seeded by real clients, and live QoS 1 clients through the
// pair's Service on the v1 node. The paper's stress in the primary's
// broker: the agent must switch over to the v2 node, the primary's final
// state carried to it, with no retained message, session or QoS 1 message
// lost, and the live clients served throughout with nothing lost. The
// clients that seed and check the pair run on this host and reach both
// pods at their own addresses across the LAN.
func TestSwitchoverToTheV2Node(t *testing.T) {
	require(t)
	cp, cl := kubenodetest.StartCluster(t, 1, kubenodetest.Options{})
	v1 := cl.Nodes[0]
	repo, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cfg := vmnode.Config{ControlPlane: cp, Repo: repo, LAN: cl.LAN, Log: t.Logf}
	for _, im := range kubenodetest.Images(t) {
		cfg.Images = append(cfg.Images, im.Archive)
	}
	began := time.Now()
	v2, err := vmnode.Launch(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("guest node %s Ready %.1fs after the boot began, at %s on LAN %d: kubelet %s, %s, guest %v",
		v2.Name, time.Since(began).Seconds(), v2.IP, cl.LAN.Index, v2.KubeletVersion, v2.RuntimeVersion, v2.Guest)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the guest's console ends with:\n%s", v2.ConsoleTail(16<<10))
			diagnose(t, v2)
		}
		v2.Stop()
	})
	// The node as Kubernetes ships it now, on the LAN's address.
	if v2.Guest["cgroup"] != "cgroup2fs" || v2.Guest["ip"] != v2.IP {
		t.Fatalf("the guest says cgroup=%q ip=%q, want cgroup2fs and %s", v2.Guest["cgroup"], v2.Guest["ip"], v2.IP)
	}
	if !strings.HasPrefix(v2.RuntimeVersion, "containerd://2.") || !strings.HasPrefix(v2.KubeletVersion, "v1.36.") {
		t.Fatalf("the Node runs kubelet %q and %q, want v1.36 and containerd 2", v2.KubeletVersion, v2.RuntimeVersion)
	}

	agents, err := testbed.DeployAgents(ctx, cp, repo, []string{v1.Name, v2.Name}, nil)
	if err != nil {
		t.Fatalf("the agent DaemonSet on both nodes: %v", err)
	}
	defer func() {
		for _, ag := range agents {
			ag.Stop()
		}
	}()
	lines, unsub := testbed.SubscribeAll(agents...)
	defer unsub()
	defer func() {
		if !t.Failed() {
			return
		}
		for i, ag := range agents {
			var b strings.Builder
			for _, l := range ag.Lines() {
				if strings.Contains(l.Raw, "v2switch") || l.Msg == "relay" || strings.Contains(l.Msg, "state") || strings.Contains(l.Msg, "hub") {
					b.WriteString(l.Raw + "\n")
				}
			}
			t.Logf("the agent on %s said of the pair and its state:\n%s", []string{v1.Name, v2.Name}[i], b.String())
		}
	}()
	cs := cp.Client()
	const ns = "v2switch"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	plan := brokerstate.Plan{Retained: 30, Sessions: 2, V5Sessions: 1, Queued: 3}
	p, err := testbed.StartStatePairTo(ctx, cs, v1, v2.Name, lines, ns, "broker", plan)
	if err != nil {
		t.Fatal(err)
	}
	if p.Primary.Spec.NodeName != v1.Name || p.Standby.Spec.NodeName != v2.Name {
		t.Fatalf("the pair runs on %s and %s, want %s and %s", p.Primary.Spec.NodeName, p.Standby.Spec.NodeName, v1.Name, v2.Name)
	}
	// The standby's broker in the layout the systemd driver makes on v2.
	cg, err := v2.ContainerCgroup(ctx, p.Standby, brokerstate.BrokerContainer)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(cg, "/sys/fs/cgroup/kubepods.slice/") {
		t.Errorf("the standby's broker's cgroup is %s, want it under kubepods.slice", cg)
	}
	live, err := p.StartLive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stop, err := p.Stress(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	onset := time.Now()
	h, err := p.Handover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	served, err := p.AwaitServing(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	lr, err := live.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Check(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h.NotCarried != "" {
		t.Errorf("the agent gave the state up: %s", h.NotCarried)
	}
	if !strings.Contains(h.Line, `"kind":"final"`) {
		t.Errorf("the state carried is not the primary's final state: %s", h.Line)
	}
	if !res.Lossless() || res.RetainedFound != plan.Retained || res.Duplicates != 0 {
		t.Errorf("the new primary on the v2 node holds %v; want nothing lost, nothing twice", res)
	}
	if lr.Lost != 0 || lr.Refused != 0 || lr.MarkerMissed || lr.Acked == 0 {
		t.Errorf("live QoS 1 clients through the Service: %v; want nothing lost or given up", lr)
	}
	node := func(name, kubelet, runtime string, cgroup func() (string, string)) experiment.NodeInfo {
		i := experiment.NodeInfo{Name: name, Kubelet: kubelet, Runtime: runtime}
		i.Cgroup, i.CgroupDriver = cgroup()
		return i
	}
	standbyNode := node(v2.Name, v2.KubeletVersion, v2.RuntimeVersion, v2.CgroupMode)
	if standbyNode.Cgroup != "v2" || !strings.HasPrefix(standbyNode.Runtime, "containerd://2.") {
		t.Errorf("the standby's node is %+v, want cgroup v2 and containerd 2", standbyNode)
	}
	rec := map[string]any{
		"primary_node": node(v1.Name, v1.KubeletVersion, v1.RuntimeVersion, v1.CgroupMode),
		"standby_node": standbyNode,
		"retired_s":    h.Retired.Sub(onset).Seconds(),
		"handed_on_s":  h.HandedOn.Sub(onset).Seconds(),
		"carried_s":    h.Carried.Sub(onset).Seconds(),
		"complete_s":   served.Sub(onset).Seconds(),
		"state":        res.String(),
		"live":         lr.String(),
	}
	b, _ := json.Marshal(rec)
	t.Logf("switchover to the v2 node: %s", b)
}
