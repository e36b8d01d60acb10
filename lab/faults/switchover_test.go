package faults_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/amf-edge/amf/actuate"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
	"github.com/amf-edge/amf/lab/probe"
	"github.com/amf-edge/amf/lab/testbed"
)

// step is the moment of the switchover a fault is injected at.
type step string

const (
	// afterDecision: the agent logged the decision's scale-up of the
	// standby (its record goes out at the same time).
	afterDecision step = "after the decision"
	// standbyStarting: the standby's pod sandbox is up and the pod is not
	// Ready yet: the kubelet is creating and starting its containers (the
	// native sidecar first, then the broker) and waiting for the probe.
	standbyStarting step = "while the standby starts"
	// holding: the standby is Ready, the record says Confirm: the agent is
	// re-confirming and holding before it retires the primary.
	holding step = "while holding"
	// retiring: the record says Retiring: the primary is about to be
	// scaled to 0 and the roles exchanged.
	retiring step = "once retiring"
	// retired: the primary is scaled to 0 and the roles are not exchanged
	// yet (the standby is not the primary).
	retired step = "once the primary is retired"
)

// fault prepares what can be done before the step (find the process,
// subscribe to the node's events), so that the act itself, called at the
// step, is only the kill; the act returns once the faulty part is back (or
// says when it was, for the agent) and describes what it did.
type fault func(ctx context.Context, r *rig) (act func() (string, error), err error)

// killAgent SIGKILLs the agent container's main process, as the kernel or a
// crash would: the kubelet restarts the container (its first restart: no
// back-off), and the new agent knows only what the record says.
func killAgent(ctx context.Context, r *rig) (func() (string, error), error) {
	evs, stop := r.node.Subscribe(ctx)
	pid, err := r.node.ContainerPID(ctx, testbed.AgentNamespace, r.agent.Pod, "agent")
	if err != nil {
		stop()
		return nil, fmt.Errorf("the agent's process: %w", err)
	}
	return func() (string, error) {
		defer stop()
		t0 := time.Now()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			return "", fmt.Errorf("kill the agent (pid %d): %w", pid, err)
		}
		for {
			select {
			case ev := <-evs:
				if ev.Pod == r.agent.Pod && ev.Container == "agent" && ev.Type == kubenode.EventRestarted {
					return fmt.Sprintf("agent pid %d killed; the kubelet restarted its container, seen %v later", pid, ev.Seen.Sub(t0).Round(time.Millisecond)), nil
				}
			case <-ctx.Done():
				return "", fmt.Errorf("the agent's container was not restarted after its kill: %w", ctx.Err())
			}
		}
	}, nil
}

// restart SIGKILLs one of the node's daemons and starts it again.
func restart(daemon string) fault {
	return func(ctx context.Context, r *rig) (func() (string, error), error) {
		return func() (string, error) {
			t0 := time.Now()
			if err := r.node.RestartDaemon(ctx, daemon, syscall.SIGKILL); err != nil {
				return "", err
			}
			return fmt.Sprintf("%s killed and started again, back after %v", daemon, time.Since(t0).Round(time.Millisecond)), nil
		}, nil
	}
}

// Policy of the edge broker for these tests: a 5 s hold (the paper's 15 s
// only lengthens every case), a 5 s abort delay (so an abort ends within the
// test), and a 60 s ready timeout (so a standby that never gets Ready aborts
// well within the test's two minutes).
var policy = map[string]string{contract.AnnHold: "5s", contract.AnnAbortDelay: "5s", contract.AnnReadyTimeout: "60s"}

// stressProfile is the paper's stress phase (below the limit: P1, the
// sidecars' model here, says anomalous within a second; no OOM), long enough to outlast
// every case.
const stressProfile = "180s:mem=60Mi,cpu=0.4"

// Bounds.
const (
	// kubeletReprobe bounds the time without a Ready broker that a kubelet
	// restart causes by itself: a restarted kubelet reports every running
	// container unready until its first readiness probe (the prober's
	// initial result is a failure), and it starts each probe worker after a
	// random part of the probe's period. So: one period of the broker's
	// readiness probe (1 s, testbed.Edge) plus one probe timeout (1 s, the
	// default). The brokers keep serving meanwhile (the messages say so):
	// it is the API server's view that has no Ready broker, and AMF's
	// switchover must not add to it.
	kubeletReprobe = 2 * time.Second
	// maxGap bounds the longest interval between fresh messages at the OBU
	// through the whole case, the cut-over included: a stall, never an
	// outage. A break-before-make switchover would leave the service down
	// for a standby's start (seconds). The cut-over's own gap is logged; its
	// ≤ 250 ms target is a benchmark's (the experiment's table), not a
	// test's bound, as the next reason shows.
	// None of the faults is in the data path (the kubelet and containerd
	// do not carry a running container's traffic, the agent acts on the
	// cluster only), but the primary's broker runs beside the injector's
	// 0.4 core within its 0.5 core limit, so on a busy host CFS throttling
	// stalls it for a few hundred ms (281 ms seen at a load average of 39).
	// A broker that stopped is caught by the restart and pod counts, a
	// broken path by the lost messages.
	maxGap = time.Second
)

// TestSwitchoverCompletesOrAbortsCleanlyThroughNodeFaults runs, per case, a
// real node with the agent DaemonSet and the edge brokers, starts the
// paper's stress in the primary, and at a step of the switchover kills the
// agent's container or restarts the kubelet or containerd. Then: the
// switchover completes (the standby Ready and the primary, which it
// replaces, at 0 with no pod left) or aborts cleanly (the standby back at 0,
// the primary Ready); the service never lacks a Ready broker; every
// switchover record ends Idle; each Deployment had one pod at most (no
// duplicate standby), no broker container was restarted; the node holds
// nothing of a pod the API server does not bind to it, also after the
// namespace is deleted; no probe message was lost.
func TestSwitchoverCompletesOrAbortsCleanlyThroughNodeFaults(t *testing.T) {
	for _, tc := range []struct {
		name  string
		at    step
		fault fault
		// noReady bounds the time without a Ready broker: none, but where
		// the kubelet restarts (kubeletReprobe).
		noReady time.Duration
	}{
		{"agent killed after the decision", afterDecision, killAgent, 0},
		{"agent killed while the standby starts", standbyStarting, killAgent, 0},
		{"agent killed while holding", holding, killAgent, 0},
		{"agent killed once retiring", retiring, killAgent, 0},
		{"agent killed once the primary is retired", retired, killAgent, 0},
		{"kubelet restarted after the decision", afterDecision, restart(kubenode.Kubelet), kubeletReprobe},
		{"kubelet restarted while the standby starts", standbyStarting, restart(kubenode.Kubelet), kubeletReprobe},
		{"kubelet restarted while holding", holding, restart(kubenode.Kubelet), kubeletReprobe},
		{"containerd restarted after the decision", afterDecision, restart(kubenode.Containerd), 0},
		{"containerd restarted while the standby starts", standbyStarting, restart(kubenode.Containerd), 0},
	} {
		t.Run(tc.name, func(t *testing.T) { switchoverWithFault(t, tc.at, tc.fault, tc.noReady) })
	}
}

// rig is one case's cluster: a control plane, a real node, the RDS and OBU
// brokers in the node's network, the probe between them, the agent.
type rig struct {
	cp    *controlplane.ControlPlane
	node  *kubenode.Node
	probe *probe.Probe
	agent *testbed.AgentPod
	ns    string
}

func newRig(t *testing.T, ctx context.Context) *rig {
	t.Helper()
	repo, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cp, n := kubenodetest.Start(t, kubenodetest.Options{ControlPlane: controlplane.Options{NoFakeNodes: true}})
	r := &rig{cp: cp, node: n, ns: "mqtt"}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	site := testbed.Site{NetNS: n.NetNS, IP: n.IP}
	var brokers []*testbed.Broker
	for _, name := range []string{"rds-broker", "obu-broker"} {
		b, err := testbed.StartMosquittoAt(ctx, dir, name, "", site)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Cleanup(b.Stop)
		brokers = append(brokers, b)
	}
	rds, obu := brokers[0], brokers[1]
	if r.probe, err = probe.Start(ctx, probe.Config{PublishURL: rds.URL(), SubscribeURL: obu.URL()}); err != nil {
		t.Fatalf("the E2E probe between RDS and OBU: %v", err)
	}
	t.Cleanup(func() { r.probe.Stop() })
	if r.agent, err = testbed.DeployAgent(ctx, cp, repo, n.Name, []string{"--log-level=debug"}); err != nil {
		t.Fatalf("the agent DaemonSet: %v", err)
	}
	t.Cleanup(r.agent.Stop)

	// The paper's model, which the paper's stress makes anomalous: the
	// default (leadtime) rightly stays quiet on a hold under the healthy
	// ceiling, and these tests are about the switchover, not the detector.
	ed := testbed.Edge{Namespace: r.ns, Node: n.Name, RDS: rds.Addr, OBU: obu.Addr, Bridge: testbed.DefaultBridge,
		BrokerPortA: 1883, BrokerPortB: 1883, BrokerImage: images.MosquittoRef, Policy: policy,
		SidecarModel: model.PaperName}
	objs, err := ed.AMF()
	if err != nil {
		t.Fatalf("the edge brokers' objects: %v", err)
	}
	c := cp.Client()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, cm := range objs.ConfigMaps {
		if _, err := c.CoreV1().ConfigMaps(r.ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range objs.Deployments {
		if _, err := c.AppsV1().Deployments(r.ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

func switchoverWithFault(t *testing.T, at step, inject fault, maxNoReady time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r := newRig(t, ctx)
	lines, unsub := r.agent.Subscribe()
	defer unsub()
	c := r.cp.Client()
	obs := observe(ctx, c, r.ns)
	defer obs.close()

	var primary string
	if err := obs.wait(ctx, "the primary is Ready", func() (ok bool) {
		primary, ok = obs.readyPod(testbed.PrimaryName)
		return ok
	}); err != nil {
		t.Fatal(err)
	}
	if err := r.probe.WaitReceived(ctx, r.probe.Received()+10); err != nil {
		t.Fatalf("no messages from RDS to OBU through the edge broker: %v", err)
	}
	from := time.Now()
	var stressOut lockedBuffer // written by kubectl exec's copiers
	stress, err := r.node.Exec(ctx, r.ns, primary, testbed.BrokerContainer, []string{images.LabBinary, "stress", "--memory-file", "--profile", stressProfile}, &stressOut, &stressOut)
	if err != nil {
		t.Fatalf("the stress in %s: %v", primary, err)
	}
	onset := time.Now()
	defer func() { _ = stress.Process.Kill(); _ = stress.Wait() }()

	// The decision, from the agent's log.
	var decision time.Time
	for decision.IsZero() {
		select {
		case l := <-lines:
			if l.Msg == "decision" && l.Deployment == r.ns+"/"+testbed.PrimaryName && l.Action == string(actuate.ActScaleStandby) {
				decision = l.Time
			}
		case <-ctx.Done():
			t.Fatalf("no switchover decided after the stress began: %v; the stress said: %s", ctx.Err(), stressOut.String())
		}
	}
	act, err := inject(ctx, r)
	if err != nil {
		t.Fatalf("prepare the fault: %v", err)
	}
	switch at {
	case standbyStarting:
		err = obs.wait(ctx, "the kubelet starts the standby's containers", obs.standbyStarting)
	case holding:
		err = obs.wait(ctx, "the record says Confirm", func() bool {
			rec, ok := record(obs.deps[testbed.PrimaryName])
			return ok && rec.Phase == actuate.PhaseConfirm
		})
	case retiring:
		err = obs.wait(ctx, "the record says Retiring", func() bool {
			rec, ok := record(obs.deps[testbed.PrimaryName])
			return ok && rec.Phase == actuate.PhaseRetiring
		})
	case retired:
		err = obs.wait(ctx, "the primary is scaled to 0, the roles not exchanged", func() bool {
			a, b := obs.deps[testbed.PrimaryName], obs.deps[testbed.StandbyName]
			return a != nil && b != nil && replicas(a) == 0 && b.Annotations[contract.AnnRole] != "primary"
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	faultAt := time.Now()
	what, err := act()
	if err != nil {
		t.Fatalf("fault %s: %v", at, err)
	}
	t.Logf("fault %s, %+.2f s after the decision (decided %.2f s after the onset): %s", at, faultAt.Sub(decision).Seconds(), decision.Sub(onset).Seconds(), what)

	// The ready timeout (60 s) and abort delay (5 s) bound an abort; a
	// completion takes the hold and a few seconds.
	octx, ocancel := context.WithTimeout(ctx, 2*time.Minute)
	defer ocancel()
	outcome := ""
	if err := obs.wait(octx, "the switchover completes or aborts", func() bool {
		switch {
		case obs.completed():
			outcome = "completed"
		case obs.aborted():
			outcome = "aborted"
		}
		return outcome != ""
	}); err != nil {
		r.dump(t, obs)
		t.Fatal(err)
	}
	end := time.Now()
	r.report(t, obs, outcome, onset, decision, end)

	// What must hold.
	obs.mu.Lock()
	for _, d := range []string{testbed.PrimaryName, testbed.StandbyName} {
		if rec, ok := record(obs.deps[d]); ok && rec.Phase != actuate.PhaseIdle {
			t.Errorf("%s: switchover record in phase %s at the end, want Idle", d, rec.Phase)
		}
		if ever, _ := obs.podsOf(d); ever > 1 {
			t.Errorf("%s had %d pods: want at most one (a duplicate standby, or a broker replaced)", d, ever)
		}
	}
	// One switchover throughout: every record in progress carries the
	// decision's time, so an agent that restarted resumed it, and nothing
	// decided it again.
	decisions := map[time.Time]bool{}
	for _, p := range obs.phases {
		if p.rec.Active() {
			decisions[p.rec.Decision] = true
		}
	}
	if len(decisions) != 1 {
		t.Errorf("records in progress carry %d decision times, want the one switchover's: %v", len(decisions), decisions)
	}
	// A broker that served is never restarted by a fault. A pod the kubelet
	// was starting when it died may have a container started again by the
	// new kubelet (it does not adopt a container it had not finished
	// starting): that is said, not failed, as nothing served from it yet.
	for _, p := range obs.pods {
		switch {
		case p.everReady && p.restarts > p.readyRestarts:
			t.Errorf("pod %s: restarted after it was Ready: %s", p.name, strings.Join(p.restarted, "; "))
		case p.restarts > 0:
			t.Logf("pod %s: restarted before it was first Ready: %s", p.name, strings.Join(p.restarted, "; "))
		}
	}
	cutover := interval{from: obs.retiring, to: obs.oldPrimaryGone}
	for _, iv := range obs.noReady {
		if iv.length() > maxNoReady {
			t.Errorf("no Ready broker for %v at %+.2fs after the decision (%s), want at most %v", iv.length().Round(time.Millisecond), iv.from.Sub(decision).Seconds(), iv.why, maxNoReady)
		}
		// A restarted kubelet re-probes every container, its pods not Ready
		// meanwhile, whatever AMF does (both brokers run on this one node):
		// if the kubelet was down as the primary was retired (the standby's
		// Ready, read from the API, was the dead kubelet's last word), the
		// re-probe falls in the cut-over. That is the fault's own outage,
		// bounded above (seen once: 45 ms); any other gap in the cut-over
		// is AMF's.
		reprobe := maxNoReady > 0 && !iv.from.Before(faultAt) && iv.length() <= maxNoReady
		if outcome == "completed" && reprobe && iv.from.Before(cutover.to) && iv.to.After(cutover.from) {
			t.Logf("no Ready broker for %v during the cut-over, the restarted kubelet re-probing: %s", iv.length().Round(time.Millisecond), iv.why)
			continue
		}
		if outcome == "completed" && iv.from.Before(cutover.to) && iv.to.After(cutover.from) {
			t.Errorf("no Ready broker for %v during the cut-over (%+.2fs to %+.2fs after the decision): %s", iv.length().Round(time.Millisecond),
				cutover.from.Sub(decision).Seconds(), cutover.to.Sub(decision).Seconds(), iv.why)
		}
	}
	obs.mu.Unlock()
	rec := r.probe.Snapshot()
	if g, ok := rec.MaxGap(from, end); ok && g.Duration() > maxGap {
		t.Errorf("largest interval between fresh messages %v at %+.2fs after the decision, want ≤ %v", g.Duration().Round(time.Millisecond), g.Start.Sub(decision).Seconds(), maxGap)
	}
	if lost := rec.Lost(from, end.Add(-time.Second)); len(lost) > 0 {
		t.Errorf("%d messages lost: %v", len(lost), lost)
	}
	if left, err := r.node.Leftovers(ctx); err != nil || len(left) > 0 {
		t.Errorf("after the switchover the node holds %q (%v), want nothing of pods it no longer runs", left, err)
	}
	// And once the namespace is gone, nothing of it is left on the node.
	if err := c.CoreV1().Namespaces().Delete(ctx, r.ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := obs.wait(ctx, "the namespace's pods are gone", func() bool {
		_, a := obs.podsOf(testbed.PrimaryName)
		_, b := obs.podsOf(testbed.StandbyName)
		return a+b == 0
	}); err != nil {
		t.Fatal(err)
	}
	if left, err := r.node.Leftovers(ctx); err != nil || len(left) > 0 {
		t.Errorf("after the namespace's deletion the node holds %q (%v), want nothing", left, err)
	}
}

// standbyStarting: a pod of the standby has its sandbox and is not Ready
// yet (observer locked).
func (o *observer) standbyStarting() bool {
	for _, p := range o.pods {
		if p.deployment == testbed.StandbyName && !p.gone && p.sandboxed && !p.ready {
			return true
		}
	}
	return false
}

// report logs the case's timeline and measures.
func (r *rig) report(t *testing.T, o *observer, outcome string, onset, decision, end time.Time) {
	t.Helper()
	o.mu.Lock()
	var phases []string
	for _, p := range o.phases {
		phases = append(phases, fmt.Sprintf("%s %s %+.2fs", p.deployment, p.rec.Phase, p.at.Sub(decision).Seconds()))
	}
	var none []string
	for _, iv := range o.noReady {
		none = append(none, fmt.Sprintf("%v at %+.2fs (%s)", iv.length().Round(time.Millisecond), iv.from.Sub(decision).Seconds(), iv.why))
	}
	retiring, gone, scaledDown := o.retiring, o.oldPrimaryGone, o.scaledDown
	o.mu.Unlock()
	rec := r.probe.Snapshot()
	gap, _ := rec.MaxGap(onset, end)
	cut, _ := rec.MaxGap(retiring, gone.Add(time.Second))
	resumed := 0
	retired := "never"
	if !scaledDown.IsZero() {
		retired = fmt.Sprintf("%+.2fs", scaledDown.Sub(decision).Seconds())
	}
	for _, l := range r.agent.Lines() {
		if (l.Msg == "decision" && l.Action == "resume") || l.Msg == "resuming switchover" {
			resumed++
		}
	}
	kubeletErrs, firstErr := r.kubeletErrorsAbout(testbed.StandbyName + "-")
	t.Logf("%s %+.2f s after the decision (decided %.2f s after the onset); primary scaled to 0 at %s; the agent resumed %d times; the kubelet logged %d errors about the standby's pod%s; records: %s; without a Ready broker: %s; largest message gap %v at %+.2fs, at the cut-over %v, duplicates %d, lost %d",
		outcome, end.Sub(decision).Seconds(), decision.Sub(onset).Seconds(), retired, resumed, kubeletErrs, firstErr, strings.Join(phases, ", "),
		strings.Join(none, ", "), gap.Duration().Round(time.Millisecond), gap.Start.Sub(decision).Seconds(), cut.Duration().Round(time.Millisecond), rec.Duplicates(onset, end), len(rec.Lost(onset, end.Add(-time.Second))))
}

// lockedBuffer is a bytes.Buffer safe to read while a command writes it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// kubeletErrorsAbout counts the kubelet's error lines (klog's E) that name
// pods starting with prefix, and quotes the first one: what a runtime
// restart did to a pod being started.
func (r *rig) kubeletErrorsAbout(prefix string) (n int, first string) {
	b, err := os.ReadFile(filepath.Join(r.node.Dir, "logs", "kubelet.log"))
	if err != nil {
		return 0, ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "E") && strings.Contains(l, prefix) {
			if n == 0 {
				_, msg, _ := strings.Cut(l, "] ")
				first = fmt.Sprintf(" (first: %.200s)", msg)
			}
			n++
		}
	}
	return n, first
}

// dump logs what a case that did not end shows.
func (r *rig) dump(t *testing.T, o *observer) {
	t.Helper()
	for _, l := range r.agent.Lines() {
		if l.Msg == "decision" || l.Level == "ERROR" || l.Level == "WARN" {
			t.Logf("agent: %s %s %s %s %s %s", l.Time.Format("15:04:05.000"), l.Level, l.Msg, l.Action, l.Phase, l.Error)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for name, d := range o.deps {
		t.Logf("%s: replicas %d, ready %d, annotations %v", name, replicas(d), d.Status.ReadyReplicas, d.Annotations)
	}
}
