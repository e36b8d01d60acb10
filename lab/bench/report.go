package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
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

// PrintSignal writes the table and the final JSON line.
func PrintSignal(w io.Writer, r *SignalReport) error {
	fmt.Fprintf(w, "\nbroker: %s\n", r.Broker)
	fmt.Fprintf(w, "%-60s %4s %10s %10s %10s %10s\n", "case (detection latency)", "n", "min", "median", "p99", "max")
	for _, c := range []Case{r.BrokerCrash, r.Poller, r.SidecarCrash, r.SidecarFreeze} {
		s := Summarise(c.Samples)
		fmt.Fprintf(w, "%-60s %4d %10s %10s %10s %10s\n", c.Name, s.N, msf(s.Min), msf(s.Median), msf(s.P99), msf(s.Max))
	}
	if r.SidecarRSS > 0 {
		fmt.Fprintf(w, "sidecar steady state: CPU %.2f %% of one core, RSS %.1f MiB\n", 100*r.SidecarCPU, float64(r.SidecarRSS)/(1<<20))
	}
	scm, pcm := Summarise(r.BrokerCrash.Samples).P99, Summarise(r.Poller.Samples).P99
	line := struct {
		SCM   float64 `json:"scm_p99_ms"`
		PCM   float64 `json:"pcm_p99_ms"`
		Ratio float64 `json:"ratio"`
	}{msv(scm), msv(pcm), 0}
	if scm > 0 {
		line.Ratio = math.Round(float64(pcm)/float64(scm)*10) / 10
	}
	b, err := json.Marshal(line)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func msv(d time.Duration) float64 { return math.Round(float64(d)/float64(time.Millisecond)*100) / 100 }

func msf(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
