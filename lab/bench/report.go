package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Summary is min, median, p99 and max of a sample set.
type Summary struct {
	N                     int
	Min, Median, P99, Max time.Duration
}

// Summarise computes a summary; percentiles use the nearest-rank method, so with
// fewer than 100 samples p99 is the maximum.
func Summarise(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rank := func(q float64) time.Duration {
		i := int(math.Ceil(q*float64(len(s)))) - 1
		return s[max(i, 0)]
	}
	return Summary{N: len(s), Min: s[0], Median: rank(0.5), P99: rank(0.99), Max: s[len(s)-1]}
}

// SignalRow is one row of the signal benchmark's table: a case in a mode.
type SignalRow struct {
	Mode string
	Case Case
}

// Rows are the report's cases, one per (mode, case), in the order the
// modes ran: the cases both modes share first, then sidecar mode's own.
func (r *SignalReport) Rows() []SignalRow {
	modes := r.Modes
	if modes == nil {
		modes = []string{ModeSidecar}
	}
	var rows []SignalRow
	for _, m := range modes {
		switch {
		case m == ModeSidecar:
			rows = append(rows, SignalRow{m, r.BrokerCrash})
			if r.OOMSkipped == "" {
				rows = append(rows, SignalRow{m, r.OOM})
			}
			rows = append(rows, SignalRow{m, r.Poller}, SignalRow{m, r.SidecarCrash}, SignalRow{m, r.SidecarFreeze})
		case m == ModeNode && r.Node != nil:
			rows = append(rows, SignalRow{m, r.Node.BrokerCrash}, SignalRow{m, r.Node.OOM})
		}
	}
	return rows
}

// SignalLine is the signal benchmark's last line. scm_p99_ms, pcm_p99_ms
// and ratio are sidecar mode's broker crash against the poller, as before
// node mode was measured; the rest are per mode, absent for a mode that did
// not run (and sidecar's OOM where it could not).
type SignalLine struct {
	SCM   float64  `json:"scm_p99_ms"`
	PCM   float64  `json:"pcm_p99_ms"`
	Ratio float64  `json:"ratio"`
	Modes []string `json:"modes,omitempty"`
	Runs  int      `json:"runs,omitempty"`

	SidecarCrashP50 *float64 `json:"sidecar_crash_p50_ms,omitempty"`
	SidecarCrashP99 *float64 `json:"sidecar_crash_p99_ms,omitempty"`
	SidecarOOMP50   *float64 `json:"sidecar_oom_p50_ms,omitempty"`
	SidecarOOMP99   *float64 `json:"sidecar_oom_p99_ms,omitempty"`
	NodeCrashP50    *float64 `json:"node_crash_p50_ms,omitempty"`
	NodeCrashP99    *float64 `json:"node_crash_p99_ms,omitempty"`
	NodeOOMP50      *float64 `json:"node_oom_p50_ms,omitempty"`
	NodeOOMP99      *float64 `json:"node_oom_p99_ms,omitempty"`
}

// Line computes the report's last line.
func (r *SignalReport) Line() SignalLine {
	scm, pcm := Summarise(r.BrokerCrash.Samples).P99, Summarise(r.Poller.Samples).P99
	l := SignalLine{SCM: msv(scm), PCM: msv(pcm), Modes: r.Modes, Runs: r.Runs}
	if scm > 0 {
		l.Ratio = math.Round(float64(pcm)/float64(scm)*10) / 10
	}
	p := func(c Case) (p50, p99 *float64) {
		if len(c.Samples) == 0 {
			return nil, nil
		}
		s := Summarise(c.Samples)
		a, b := msv(s.Median), msv(s.P99)
		return &a, &b
	}
	if slices.Contains(r.Modes, ModeSidecar) {
		l.SidecarCrashP50, l.SidecarCrashP99 = p(r.BrokerCrash)
		l.SidecarOOMP50, l.SidecarOOMP99 = p(r.OOM)
	}
	if r.Node != nil {
		l.NodeCrashP50, l.NodeCrashP99 = p(r.Node.BrokerCrash)
		l.NodeOOMP50, l.NodeOOMP99 = p(r.Node.OOM)
	}
	return l
}

// PrintSignal writes the table, one row per (mode, case), and the final
// JSON line.
func PrintSignal(w io.Writer, r *SignalReport) error {
	fmt.Fprintf(w, "\nbroker: %s\n", r.Broker)
	fmt.Fprintf(w, "%-8s %-60s %4s %10s %10s %10s %10s\n", "mode", "case (detection latency)", "n", "min", "median", "p99", "max")
	for _, row := range r.Rows() {
		s := Summarise(row.Case.Samples)
		fmt.Fprintf(w, "%-8s %-60s %4d %10s %10s %10s %10s\n", row.Mode, row.Case.Name, s.N, msf(s.Min), msf(s.Median), msf(s.P99), msf(s.Max))
	}
	if r.OOMSkipped != "" {
		fmt.Fprintf(w, "sidecar mode's OOM kill not measured: %s\n", r.OOMSkipped)
	}
	if r.SidecarRSS > 0 {
		fmt.Fprintf(w, "sidecar steady state: CPU %.2f %% of one core, RSS %.1f MiB\n", 100*r.SidecarCPU, float64(r.SidecarRSS)/(1<<20))
	}
	b, err := json.Marshal(r.Line())
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func msv(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Millisecond)*100) / 100 }

func msf(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// NodeLine is the last line of `amf-lab bench signal --node`: p99s in ms,
// pcm = the kubelet's side; ratios are pcm / scm of the p99s.
type NodeLine struct {
	SCM       float64 `json:"scm_p99_ms"`
	PCM       float64 `json:"pcm_p99_ms"`
	Ratio     float64 `json:"ratio"`
	HangSCM   float64 `json:"hang_scm_p99_ms"`
	HangPCM   float64 `json:"hang_pcm_p99_ms"` // the kubelet's decision (exec liveness)
	HangRatio float64 `json:"hang_ratio"`
	// HangPCMStatus is the hung broker's end in the pod status (after the
	// grace period).
	HangPCMStatus float64 `json:"hang_pcm_status_p99_ms"`
	HangTCPSeen   int     `json:"hang_tcp_detected"` // hangs a tcpSocket liveness probe failed on at all
	FalseRestarts int     `json:"false_restarts"`    // the kubelet restarted a loaded, working broker
	FalseSignals  int     `json:"false_signals"`     // unhealthy at the agent for a loaded, working broker
}

// Line computes the report's last line.
func (r *NodeReport) Line() NodeLine {
	p99 := func(c Case) time.Duration { return Summarise(c.Samples).P99 }
	ratio := func(pcm, scm time.Duration) float64 {
		if scm <= 0 {
			return 0
		}
		return math.Round(float64(pcm)/float64(scm)*10) / 10
	}
	l := NodeLine{
		SCM: msv(p99(r.CrashSignal)), PCM: msv(p99(r.CrashStatus)), Ratio: ratio(p99(r.CrashStatus), p99(r.CrashSignal)),
		HangSCM: msv(p99(r.HangSignal)), HangPCM: msv(p99(r.HangDecided)), HangRatio: ratio(p99(r.HangDecided), p99(r.HangSignal)),
		HangPCMStatus: msv(p99(r.HangStatus)), HangTCPSeen: r.HangTCPSeen,
	}
	for _, lr := range r.LoadRuns {
		l.FalseRestarts += lr.Restarts
		l.FalseSignals += lr.FalseSignals
	}
	return l
}

// PrintNode writes the node benchmark's table and its final JSON line.
func PrintNode(w io.Writer, r *NodeReport) error {
	lv := r.Liveness
	fmt.Fprintf(w, "\nnode: kubelet %s, %s; broker: Mosquitto (%s), limits 500m CPU, 100 Mi; sidecar injected, agent DaemonSet observing\n", r.Kubelet, r.Runtime, "amf.lab/mosquitto:2.0.11-debian")
	fmt.Fprintf(w, "liveness (as the API server defaulted it): period %d s, timeout %d s, failureThreshold %d; exec %q vs tcpSocket on mqtt; terminationGracePeriodSeconds %d\n",
		lv.PeriodSeconds, lv.TimeoutSeconds, lv.FailureThreshold, strings.Join(LivenessCommand, " "), r.GracePeriod)
	fmt.Fprintf(w, "%-78s %4s %10s %10s %10s %10s\n", "case (latency from the fault)", "n", "min", "median", "p99", "max")
	for _, c := range []Case{
		{Name: "(a) broker crash (SIGKILL) → agent has unhealthy (both pods)", Samples: r.CrashSignal.Samples},
		{Name: "(a) broker crash → kubelet shows it: termination on a pod watch (both pods)", Samples: r.CrashStatus.Samples},
		{Name: "(b) broker hung (SIGSTOP) → agent has unhealthy (both pods)", Samples: r.HangSignal.Samples},
		{Name: "(b) broker hung → kubelet decides: 3rd failed exec liveness probe (its log)", Samples: r.HangDecided.Samples},
		{Name: fmt.Sprintf("(b) broker hung → termination on a pod watch (SIGKILL after %d s grace)", r.GracePeriod), Samples: r.HangStatus.Samples},
		{Name: "(b) broker hung, tcpSocket liveness: hung this long, not detected", Samples: r.HangTCPWatch.Samples},
	} {
		s := Summarise(c.Samples)
		fmt.Fprintf(w, "%-78s %4d %10s %10s %10s %10s\n", c.Name, s.N, msf(s.Min), msf(s.Median), msf(s.P99), msf(s.Max))
	}
	fmt.Fprintf(w, "(a) finishedAt in the pod status (whole seconds) at the kill's second or the next: %d of %d\n", r.CrashFinishedSameSecond, len(r.CrashStatus.Samples))
	fmt.Fprintf(w, "(b) tcpSocket liveness failed on %d of %d hangs\n", r.HangTCPSeen, r.HangTCPRuns)
	fmt.Fprintf(w, "(c) load: amf-lab stress cpu=N (N busy threads) in each 500m broker container, MQTT traffic through each:\n")
	for _, lr := range r.LoadRuns {
		fmt.Fprintf(w, "    cpu=%-3g %-9s liveness: %d × %v, broker container at %s cores, throttled in %s of CFS periods; %d failed liveness probes, %d kubelet restarts; %d false unhealthy signals (%d more while the test's own traffic went as unanswered), %d anomalous; MQTT every %v: max round trip %s, %d of %d lost\n",
			lr.Load.CPU, lr.Kind, lr.Runs, lr.Load.Duration, span(lr.Cores, 1, "%.2f"), span(lr.Throttled, 100, "%.0f %%"), lr.LivenessFailures, lr.Restarts,
			lr.FalseSignals, lr.SlowSignals, lr.Anomalous, lr.Load.Traffic, msf(lr.MaxLatency), lr.Lost, lr.Sent)
		for _, reason := range lr.Reasons {
			fmt.Fprintf(w, "        false unhealthy: %s\n", reason)
		}
	}
	b, err := json.Marshal(r.Line())
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// span writes the range of vs (each times scale) in format, or "—".
func span(vs []float64, scale float64, format string) string {
	if len(vs) == 0 {
		return "—"
	}
	lo, hi := slices.Min(vs)*scale, slices.Max(vs)*scale
	if a, b := fmt.Sprintf(format, lo), fmt.Sprintf(format, hi); a != b {
		return a + "–" + b
	}
	return fmt.Sprintf(format, lo)
}
