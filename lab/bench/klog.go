package bench

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// probeFailure is one failed probe as the kubelet logs it (at --v=1, the
// lab node's level): the kubelet's own time of each failure, to the
// microsecond. Its Events carry whole seconds only, and its spam filter
// drops a pod's events past 25, so the log is the precise record.
type probeFailure struct {
	Time      time.Time
	Type      string // Liveness, Readiness, Startup
	Pod       string // namespace/name
	Container string
	Output    string
}

// probeFailures returns the failed liveness probes of pod's container
// logged in [from, to) in the kubelet's log at path.
func probeFailures(path string, from, to time.Time, pod, container string) ([]probeFailure, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("the kubelet's log: %w", err)
	}
	defer f.Close()
	var out []probeFailure
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		pf, ok := parseProbeFailure(sc.Text(), to, time.Local)
		if ok && pf.Type == "Liveness" && pf.Pod == pod && pf.Container == container && !pf.Time.Before(from) && pf.Time.Before(to) {
			out = append(out, pf)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("the kubelet's log %s: %w", path, err)
	}
	return out, nil
}

// parseProbeFailure reads a klog line such as
//
//	I1201 14:52:03.123456    4567 prober.go:122] "Probe failed" probeType="Liveness" pod="ns/p" podUID="…" containerName="mosquitto" probeResult="failure" output="…"
//
// ("Probe errored" too: the kubelet counts an error as a failure). klog
// writes local time without a year: the year is near's, or the one before
// when that would put the line in the future.
func parseProbeFailure(line string, near time.Time, loc *time.Location) (probeFailure, bool) {
	if len(line) < 22 || (line[0] != 'I' && line[0] != 'W' && line[0] != 'E') {
		return probeFailure{}, false
	}
	_, rest, ok := strings.Cut(line, "] ")
	if !ok {
		return probeFailure{}, false
	}
	msg, kv, ok := quoted(rest)
	if !ok || (msg != "Probe failed" && msg != "Probe errored") {
		return probeFailure{}, false
	}
	near = near.In(loc)
	t, err := time.ParseInLocation("2006 0102 15:04:05.000000", strconv.Itoa(near.Year())+" "+line[1:21], loc)
	if err != nil {
		return probeFailure{}, false
	}
	if t.After(near.Add(24 * time.Hour)) {
		t = t.AddDate(-1, 0, 0)
	}
	pf := probeFailure{Time: t}
	for kv = strings.TrimSpace(kv); kv != ""; kv = strings.TrimSpace(kv) {
		key, val, ok := strings.Cut(kv, "=")
		if !ok {
			break
		}
		var v string
		if v, kv, ok = quoted(val); !ok { // an unquoted value: up to the next space
			v, kv, _ = strings.Cut(val, " ")
		}
		switch key {
		case "probeType":
			pf.Type = v
		case "pod":
			pf.Pod = v
		case "containerName":
			pf.Container = v
		case "output", "err":
			pf.Output = v
		}
	}
	return pf, pf.Type != "" && pf.Pod != ""
}

// quoted splits a Go-quoted string off the front of s.
func quoted(s string) (val, rest string, ok bool) {
	q, err := strconv.QuotedPrefix(s)
	if err != nil {
		return "", s, false
	}
	val, err = strconv.Unquote(q)
	return val, s[len(q):], err == nil
}
