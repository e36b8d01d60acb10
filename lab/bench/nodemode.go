package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"slices"
	"time"

	"github.com/amf-edge/amf/lab/proc"
	"github.com/amf-edge/amf/lab/scrape"
)

// NodeModeConfig configures the node-mode footprint benchmark.
type NodeModeConfig struct {
	Pods     int           // pods on the node; 110 is the kubelet's default limit
	Duration time.Duration // each measurement (without, then with the pipelines)
	Kills    int           // pods whose process is then killed, one at a time, to time the pushed exit (default 20)
	OOMKills int           // then pods OOM-killed, one at a time (default 10)
	Bin      Binaries
	WorkDir  string
	Progress io.Writer
}

// NodeModeReport is what it measured: the agent without pipelines and with
// one per pod, and the difference per pod.
type NodeModeReport struct {
	Pods         int     `json:"pods"`
	RSSMiBPerPod float64 `json:"rss_mib_per_pod"`
	CPUPctPerPod float64 `json:"cpu_pct_per_pod"` // of one core
	BaseRSSMiB   float64 `json:"base_rss_mib"`
	BaseCPUPct   float64 `json:"base_cpu_pct"`
	RSSMiB       float64 `json:"rss_mib"`
	CPUPct       float64 `json:"cpu_pct"`
	StartSeconds float64 `json:"start_s"` // opt-in → every pod healthy in the tracker
	// Kill → unhealthy in the agent's tracker (the received time of its
	// transition line), for the pushed exit.
	Kills         int     `json:"kills"`
	ExitP50Millis float64 `json:"exit_p50_ms"`
	ExitP99Millis float64 `json:"exit_p99_ms"`
	ExitMaxMillis float64 `json:"exit_max_ms"`
	// An OOM kill in the container → unhealthy, for the pushed OOM
	// notification (from the killed process's end as its parent saw it).
	OOMKills     int     `json:"oom_kills"`
	OOMP50Millis float64 `json:"oom_p50_ms"`
	OOMP99Millis float64 `json:"oom_p99_ms"`
	OOMMaxMillis float64 `json:"oom_max_ms"`
}

// RunNodeMode measures what node mode costs per pod: a real agent binary
// (amf-agent --node-mode) against a real API server, N pods bound to its
// node whose broker containers are real cgroups (under a kubelet cgroup
// root of the benchmark's own, in the kubelet's layout) each holding a real
// process, sampled every second (the node rig, which bench signal's node
// mode runs on too). The agent runs first with the Deployment
// not opted in (no pipelines), then the annotation is set (no pod changes)
// and, once every pod is healthy in the agent's tracker, measured again.
// Needs root (cgroups) and the control plane (make k8s).
func RunNodeMode(ctx context.Context, cfg NodeModeConfig) (rep *NodeModeReport, err error) {
	if cfg.Pods <= 0 {
		cfg.Pods = 110
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 30 * time.Second
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	if cfg.Kills <= 0 {
		cfg.Kills = 20
	}
	if cfg.OOMKills <= 0 {
		cfg.OOMKills = 10
	}
	cfg.Kills = min(cfg.Kills, cfg.Pods)
	rig, err := startNodeRig(ctx, nodeRigConfig{Pods: cfg.Pods, Start: sleepProc, Bin: cfg.Bin, WorkDir: cfg.WorkDir, Progress: cfg.Progress})
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := rig.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	agent, pods, root := rig.agent, rig.pods, rig.root
	httpAddr := rig.httpAddr
	rep = &NodeModeReport{Pods: len(pods)}
	measure := func(label string) (cpuPct, rssMiB float64, err error) {
		fmt.Fprintf(cfg.Progress, "measuring the agent %s for %v\n", label, cfg.Duration)
		c0, _, err := proc.Usage(agent.PID())
		if err != nil {
			return 0, 0, err
		}
		t0 := time.Now()
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-agent.Done():
			return 0, 0, fmt.Errorf("the agent exited: %v (%s)", agent.Err(), proc.LogTail(filepath.Join(cfg.WorkDir, "agent.log"), 2000))
		case <-time.After(cfg.Duration):
		}
		c1, rss, err := proc.Usage(agent.PID())
		if err != nil {
			return 0, 0, err
		}
		return 100 * float64(c1-c0) / float64(time.Since(t0)), float64(rss) / (1 << 20), nil
	}
	if rep.BaseCPUPct, rep.BaseRSSMiB, err = measure("with no pod opted in"); err != nil {
		return nil, err
	}
	optedIn := time.Now()
	if err := rig.optIn(ctx); err != nil {
		return nil, err
	}
	if err := waitHealthy(ctx, "http://"+httpAddr+"/metrics", len(pods), 2*time.Minute); err != nil {
		return nil, err
	}
	rep.StartSeconds = time.Since(optedIn).Seconds()
	fmt.Fprintf(cfg.Progress, "opted in: %d pods healthy in the tracker %.2f s later\n", len(pods), rep.StartSeconds)
	if rep.CPUPct, rep.RSSMiB, err = measure(fmt.Sprintf("with %d pipelines", len(pods))); err != nil {
		return nil, err
	}
	rep.RSSMiBPerPod = (rep.RSSMiB - rep.BaseRSSMiB) / float64(len(pods))
	rep.CPUPctPerPod = (rep.CPUPct - rep.BaseCPUPct) / float64(len(pods))

	// Exits, one at a time: the pod's process killed, its unhealthy
	// transition awaited in the agent's log.
	await := func(name string) (transitionLine, error) {
		return rig.await(ctx, name, 30*time.Second, "unhealthy")
	}
	drain := rig.drain
	var lat []time.Duration
	for _, p := range pods[:cfg.Kills] {
		drain()
		killed := time.Now()
		p.proc.Kill()
		tl, err := await(p.pod.Name)
		if err != nil {
			return nil, err
		}
		lat = append(lat, tl.Received.Sub(killed))
		fmt.Fprintf(cfg.Progress, "kill %s: unhealthy %.1f ms later (%s)\n", p.pod.Name, millis(lat[len(lat)-1]), tl.Reason)
	}
	rep.Kills = len(lat)
	rep.ExitP50Millis, rep.ExitP99Millis, rep.ExitMaxMillis = percentiles(lat)
	fmt.Fprintf(cfg.Progress, "%d kills: unhealthy in the agent p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", rep.Kills, rep.ExitP50Millis, rep.ExitP99Millis, rep.ExitMaxMillis)

	// OOM kills, one at a time, in other pods: a memory limit on the
	// container, and a process started in it that allocates past it (the
	// lab's load generator); the kernel kills it, the pod's own process
	// stays. Timed from the killed process's end as its parent (this
	// benchmark) reaps it; on cgroup v1 the notification comes just before
	// the kill, so a time can be below zero.
	var oomLat []time.Duration
	for _, p := range pods[cfg.Kills:min(len(pods), cfg.Kills+cfg.OOMKills)] {
		drain()
		hog, err := root.startHog(p, cfg.Bin.Self, 64<<20)
		if err != nil {
			return nil, err
		}
		done := make(chan time.Time, 1)
		go func() { _ = hog.Wait(); done <- time.Now() }()
		tl, err := await(p.pod.Name)
		if err != nil {
			_ = hog.Process.Kill()
			<-done
			return nil, err
		}
		var ended time.Time
		select {
		case ended = <-done:
		case <-time.After(30 * time.Second):
			_ = hog.Process.Kill()
			<-done
			return nil, fmt.Errorf("node-mode bench: %s signalled %q but its hog was not killed within 30 s", p.pod.Name, tl.Reason)
		}
		oomLat = append(oomLat, tl.Received.Sub(ended))
		fmt.Fprintf(cfg.Progress, "OOM kill in %s: unhealthy %.1f ms from the kill (%s)\n", p.pod.Name, millis(oomLat[len(oomLat)-1]), tl.Reason)
	}
	rep.OOMKills = len(oomLat)
	if len(oomLat) > 0 {
		rep.OOMP50Millis, rep.OOMP99Millis, rep.OOMMaxMillis = percentiles(oomLat)
	}
	return rep, nil
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// percentiles returns the median, the 99th percentile (nearest rank) and the
// maximum of ds, in milliseconds.
func percentiles(ds []time.Duration) (p50, p99, maxMs float64) {
	ds = slices.Sorted(slices.Values(ds))
	return millis(ds[len(ds)/2]), millis(ds[min(len(ds)-1, int(math.Ceil(0.99*float64(len(ds))))-1)]), millis(ds[len(ds)-1])
}

// waitHealthy polls the agent's metrics (another process: nothing to
// await) until n pods are healthy in its tracker.
func waitHealthy(ctx context.Context, url string, n int, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for {
		got, err := healthyPods(ctx, url)
		if err == nil && got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node-mode bench: %d of %d pods healthy in the agent after %v (%v)", got, n, bound, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func healthyPods(ctx context.Context, url string) (int, error) {
	families, err := scrape.Families(ctx, url)
	if err != nil {
		return 0, err
	}
	for _, m := range families["amf_agent_pods"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "state" && l.GetValue() == "healthy" {
				return int(m.GetGauge().GetValue()), nil
			}
		}
	}
	return 0, nil
}

// PrintNodeMode writes the result; its last line is the report as JSON.
func PrintNodeMode(w io.Writer, r *NodeModeReport) error {
	fmt.Fprintf(w, "\nnode mode: %d pods, one pipeline each, sampled every 1 s\n", r.Pods)
	fmt.Fprintf(w, "agent without pipelines: %.2f %% of one core, RSS %.1f MiB\n", r.BaseCPUPct, r.BaseRSSMiB)
	fmt.Fprintf(w, "agent with %d pipelines: %.2f %% of one core, RSS %.1f MiB (all healthy %.2f s after the opt-in)\n", r.Pods, r.CPUPct, r.RSSMiB, r.StartSeconds)
	fmt.Fprintf(w, "per pod: %.3f MiB RSS, %.4f %% of one core\n", r.RSSMiBPerPod, r.CPUPctPerPod)
	fmt.Fprintf(w, "broker process killed → unhealthy in the agent (pushed exit, %d kills): p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", r.Kills, r.ExitP50Millis, r.ExitP99Millis, r.ExitMaxMillis)
	fmt.Fprintf(w, "OOM kill in the container → unhealthy in the agent (pushed OOM notification, %d kills): p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", r.OOMKills, r.OOMP50Millis, r.OOMP99Millis, r.OOMMaxMillis)
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}
