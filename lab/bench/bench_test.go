package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// buildBinaries builds the real programs the benchmarks run.
func buildBinaries(t *testing.T) Binaries {
	t.Helper()
	dir := t.TempDir()
	b := Binaries{Sidecar: filepath.Join(dir, "amf-sidecar"), Agent: filepath.Join(dir, "amf-agent"), Self: filepath.Join(dir, "amf-lab")}
	for pkg, out := range map[string]string{"../../cmd/amf-sidecar": b.Sidecar, "../../cmd/amf-agent": b.Agent, "../../cmd/amf-lab": b.Self} {
		if msg, err := exec.Command("go", "build", "-o", out, pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, msg)
		}
	}
	if p, err := exec.LookPath("mosquitto"); err == nil {
		b.Mosquitto = p
	} else if p, err := exec.LookPath("/usr/sbin/mosquitto"); err == nil {
		b.Mosquitto = p
	}
	return b
}

// One round of every fault with real processes, on a fast poller so the test is
// short. It checks what must hold whatever the machine's speed; the numbers
// themselves are the benchmark's (`amf-lab bench signal`).
func TestSignalBenchDetectsEveryFault(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real brokers, sidecars and agents")
	}
	bins := buildBinaries(t)
	for _, broker := range []string{"mosquitto", "mochi"} {
		t.Run(broker, func(t *testing.T) {
			b := bins
			if broker == "mochi" {
				b.Mosquitto = ""
			} else if b.Mosquitto == "" {
				t.Skip("mosquitto not installed (make deps installs it)")
			}
			poller := PollerConfig{Period: 300 * time.Millisecond, Timeout: 200 * time.Millisecond, Threshold: 3}
			keepAlive := time.Second
			rep, err := RunSignal(t.Context(), SignalConfig{Modes: []string{ModeSidecar}, Runs: 1, KeepAlive: keepAlive, Poller: poller, Bin: b, WorkDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range []Case{rep.BrokerCrash, rep.Poller, rep.SidecarCrash, rep.SidecarFreeze} {
				if len(c.Samples) != 1 || c.Samples[0] <= 0 {
					t.Fatalf("%s: samples %v", c.Name, c.Samples)
				}
			}
			// As root the broker has a cgroup of its own and is OOM-killed
			// too, which the sidecar's OOM notification pushes.
			if rep.OOMSkipped == "" {
				if len(rep.OOM.Samples) != 1 || !strings.Contains(rep.OOM.Reasons[0], "OOM kill") {
					t.Errorf("OOM kill: samples %v, reasons %q; want one, by the OOM notification", rep.OOM.Samples, rep.OOM.Reasons)
				}
			} else if os.Geteuid() == 0 {
				t.Errorf("root, but the OOM case was skipped: %s", rep.OOMSkipped)
			}
			// A poller cannot declare death before its threshold of failed periods.
			if min := poller.Period * time.Duration(poller.Threshold-1); rep.Poller.Samples[0] < min {
				t.Errorf("poller detected in %v, before %v", rep.Poller.Samples[0], min)
			}
			// A frozen client is only noticed once its keep-alive lapses: the broker
			// waits 1.5 keep-alives after the last packet, which came at most one
			// keep-alive before the freeze.
			if d := rep.SidecarFreeze.Samples[0]; d < keepAlive/2 {
				t.Errorf("freeze detected in %v, before half the %v keep-alive", d, keepAlive)
			}
		})
	}
}

func TestAgentLoadBenchMeasuresIntake(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real agent and simulated sidecars")
	}
	rep, err := RunAgentLoad(t.Context(), AgentLoadConfig{Sidecars: 10, Period: 100 * time.Millisecond, Duration: time.Second,
		Bin: buildBinaries(t), WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Messages < 10 || rep.IntakeP99 <= 0 || rep.IntakeMean <= 0 || rep.AgentRSS <= 0 {
		t.Fatalf("report %+v", rep)
	}
}

func TestFloodBenchSeesEverySidecarConnectDuringTheFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a real agent, sidecars and a flood")
	}
	// More flood sources × their share (40 × 8) than the agent's pending
	// places (256): the flood itself has to be evicted for sidecars to get in.
	rep, err := RunFlood(t.Context(), FloodConfig{Sidecars: 20, Rounds: 2, FloodSources: 40, FloodPerSource: 9,
		Bin: buildBinaries(t), WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Quiet.Connects != 40 || rep.Flood.Connects != 40 || rep.Quiet.Failed != 0 || rep.Flood.Failed != 0 {
		t.Fatalf("connects quiet %+v, flood %+v (first error %q)", rep.Quiet, rep.Flood, rep.FirstError)
	}
	if rep.FloodConnections <= 40*8 || rep.FloodSessions < 1 || rep.Flood.P99Millis <= 0 {
		t.Fatalf("the flood did not run as meant: %+v", rep)
	}
}
