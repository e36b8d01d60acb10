package bench

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/inject"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
	"github.com/amf-edge/amf/lab/testbed"
)

// One round of every case against the real kubelet, with a short light
// load. It checks what must hold whatever the machine's speed; the numbers
// are the benchmark's (`amf-lab bench signal --node`).
func TestNodeBenchSignalsBeforeTheKubelet(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a real node")
	}
	cp, node := kubenodetest.Start(t, kubenodetest.Options{Node: kubenode.Config{Name: NodeName, MaxRestartBackoff: NodeRestartBackoff}})
	repo, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	rep, err := RunNode(ctx, NodeConfig{Runs: 1, Repo: repo, ControlPlane: cp, Node: node, Progress: &progress,
		Loads: []Load{{CPU: 0.3, Duration: 15 * time.Second, Traffic: 50 * time.Millisecond}}})
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := PrintNode(&out, rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", out.String())

	if lv := rep.Liveness; lv.PeriodSeconds != 10 || lv.TimeoutSeconds != 1 || lv.FailureThreshold != 3 {
		t.Errorf("liveness period %d s, timeout %d s, threshold %d: want the kubelet's defaults 10, 1, 3", lv.PeriodSeconds, lv.TimeoutSeconds, lv.FailureThreshold)
	}
	for _, c := range []struct {
		name string
		got  []time.Duration
		want int
	}{
		{"crash signal", rep.CrashSignal.Samples, 2},
		{"crash in the pod status", rep.CrashStatus.Samples, 2},
		{"hang signal", rep.HangSignal.Samples, 2},
		{"hang decided by the kubelet", rep.HangDecided.Samples, 1},
		{"hang in the pod status", rep.HangStatus.Samples, 1},
	} {
		if len(c.got) != c.want {
			t.Errorf("%s: %d samples, want %d", c.name, len(c.got), c.want)
		}
		for _, d := range c.got {
			if d <= 0 {
				t.Errorf("%s: sample %v", c.name, d)
			}
		}
	}
	// The agent has the crash before the pod status shows it.
	for i := range min(len(rep.CrashSignal.Samples), len(rep.CrashStatus.Samples)) {
		if s, k := rep.CrashSignal.Samples[i], rep.CrashStatus.Samples[i]; s >= k {
			t.Errorf("crash %d: agent after %v, pod status after %v: the agent should be first", i+1, s, k)
		}
	}
	if rep.CrashFinishedSameSecond != len(rep.CrashStatus.Samples) {
		t.Errorf("finishedAt at the kill's second in %d of %d crashes", rep.CrashFinishedSameSecond, len(rep.CrashStatus.Samples))
	}
	// A liveness probe cannot decide before failureThreshold − 1 periods of
	// failures; the sidecar has the hang first, and the end comes after
	// the decision (the grace period: SIGTERM waits for a stopped process).
	if len(rep.HangDecided.Samples) == 1 && len(rep.HangStatus.Samples) == 1 {
		decided, ended := rep.HangDecided.Samples[0], rep.HangStatus.Samples[0]
		if least := 2 * 10 * time.Second; decided < least {
			t.Errorf("the kubelet decided %v after the hang, before %v of failures", decided, least)
		}
		for _, s := range rep.HangSignal.Samples {
			if s >= decided {
				t.Errorf("hang signalled after %v, the kubelet decided after %v: the agent should be first", s, decided)
			}
		}
		// The decision's time is the kubelet's log line of the last failed
		// probe, written about when it starts the kill, not strictly before
		// (once 32 ms after, in CI); a second of slack still tells a grace
		// period waited from an end at once.
		const logSlack = time.Second
		if grace := time.Duration(rep.GracePeriod) * time.Second; ended < decided+grace-logSlack {
			t.Errorf("hung broker ended %v after the hang, before decision %v + grace %v (less %v for the log line's timing)", ended, decided, grace, logSlack)
		}
	}
	// A tcpSocket probe connects to a stopped broker: it sees no hang.
	if rep.HangTCPRuns != 1 || rep.HangTCPSeen != 0 {
		t.Errorf("tcpSocket liveness failed on %d of %d hangs, want 0 of 1", rep.HangTCPSeen, rep.HangTCPRuns)
	}
	// A light load: the broker works, so nothing may restart it or signal it
	// unhealthy while it answers the test's own traffic in time (a starved
	// machine's slow answers count apart: SlowSignals).
	if len(rep.LoadRuns) != 2 {
		t.Errorf("%d load results, want one per pod", len(rep.LoadRuns))
	}
	for _, lr := range rep.LoadRuns {
		if lr.Runs != 1 || lr.Restarts != 0 || lr.FalseSignals != 0 || lr.Sent == 0 || lr.Lost > 0 || len(lr.Cores) != 1 {
			t.Errorf("%s pod under a light load: %+v, want 1 run, no restart, no false signal, traffic without loss, its CPU measured", lr.Kind, lr)
		}
		if lr.SlowSignals > 0 {
			t.Logf("%s pod: %d unhealthy signals while the test's own traffic went unanswered within the probe's timeout too (a machine short of CPU)", lr.Kind, lr.SlowSignals)
		}
	}
	if line := out.String(); !strings.Contains(line, `"hang_pcm_p99_ms"`) || !strings.Contains(line, `"false_signals":0`) {
		t.Errorf("last line lacks the fields: %s", line)
	}
}

func TestBrokerDeploymentIsInjectedWithTheLivenessProbeAtItsDefaults(t *testing.T) {
	for _, tc := range []struct {
		kind    string
		exec    bool
		tcp     bool
		refused bool
	}{
		{kind: ProbeExec, exec: true},
		{kind: ProbeTCP, tcp: true},
		{kind: "httpGet", refused: true},
	} {
		t.Run(tc.kind, func(t *testing.T) {
			d, err := brokerDeployment("ns", "broker", tc.kind, "node-a")
			if tc.refused {
				if err == nil {
					t.Fatal("an unknown probe kind was accepted")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			spec := d.Spec.Template.Spec
			if len(spec.InitContainers) != 1 || spec.InitContainers[0].Name != inject.SidecarName {
				t.Fatalf("init containers %v: want the injected sidecar", spec.InitContainers)
			}
			if spec.NodeSelector["kubernetes.io/hostname"] != "node-a" {
				t.Errorf("node selector %v", spec.NodeSelector)
			}
			if d.Annotations[contract.AnnRedundancy] != string(contract.None) {
				t.Errorf("redundancy %q: the kubelet alone must act", d.Annotations[contract.AnnRedundancy])
			}
			c := spec.Containers[0]
			if c.Name != testbed.BrokerContainer || c.Image != images.MosquittoRef || c.Resources.Limits.Cpu().String() != "500m" {
				t.Errorf("broker container %s %s, CPU limit %s", c.Name, c.Image, c.Resources.Limits.Cpu())
			}
			lp := c.LivenessProbe
			if lp == nil {
				t.Fatal("no liveness probe")
			}
			// Left for the API server to default: what a user who writes none gets.
			if lp.PeriodSeconds != 0 || lp.TimeoutSeconds != 0 || lp.FailureThreshold != 0 {
				t.Errorf("liveness sets period %d, timeout %d, threshold %d", lp.PeriodSeconds, lp.TimeoutSeconds, lp.FailureThreshold)
			}
			if got := lp.Exec != nil && slices.Equal(lp.Exec.Command, LivenessCommand); got != tc.exec {
				t.Errorf("exec liveness %v, want %v", lp.Exec, tc.exec)
			}
			if got := lp.TCPSocket != nil && lp.TCPSocket.Port.StrVal == inject.MQTTPortName; got != tc.tcp {
				t.Errorf("tcpSocket liveness %v, want %v", lp.TCPSocket, tc.tcp)
			}
		})
	}
}
