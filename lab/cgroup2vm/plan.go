package cgroup2vm

import (
	"fmt"
	"strings"
	"time"
)

// planPath is where the initramfs holds the plan the guest runs.
const planPath = "/amf/plan.json"

// srcRoot is where the initramfs mirrors the repository: a test binary and
// its testdata sit in srcRoot/<package dir>, its working directory, as under
// go test.
const srcRoot = "/amf/src"

// plan is what the guest runs, written by the host into the initramfs.
type plan struct {
	// Disk is the scratch block device mounted at /tmp (ext4).
	Disk string `json:"disk"`
	// Env is added to every test binary's environment.
	Env []string `json:"env"`
	// Runs are the test binaries, run one after the other.
	Runs []run `json:"runs"`
	// Timeout bounds each test binary (its -test.timeout).
	Timeout time.Duration `json:"timeout"`
}

// run is one test binary.
type run struct {
	Package string   `json:"package"` // package directory, e.g. "cgroup"
	Binary  string   `json:"binary"`  // path in the guest
	Args    []string `json:"args"`
}

// The guest's console lines that the host reads: one per test binary and one
// at the end, so that a guest that dies half-way (kernel panic, test binary
// hanging past the host's timeout) never looks like a pass.
const (
	markerRun    = "AMF-GUEST-RUN:"    // "AMF-GUEST-RUN: ok|FAIL <package> <duration> [<why>]"
	markerLeft   = "AMF-GUEST-LEFT:"   // "AMF-GUEST-LEFT: <what>": something outlived the tests
	markerError  = "AMF-GUEST-ERROR:"  // "AMF-GUEST-ERROR: <what>": the guest could not set up or run
	markerResult = "AMF-GUEST-RESULT:" // "AMF-GUEST-RESULT: PASS|FAIL"
)

// Summary is what the host made of the guest's console.
type Summary struct {
	Passed, Failed, Skipped []string // test names from -test.v's "--- PASS/FAIL/SKIP: name" lines
	Binaries                []string // the AMF-GUEST-RUN lines, without the marker
	Left                    []string // what outlived the tests
	Errors                  []string // what kept the guest from running the tests
	Result                  string   // "PASS", "FAIL", or "" when the guest never said
	Kernel                  string   // the guest's "Linux version" line, when printed
}

// OK reports whether the guest said PASS, ran at least one test, and
// reported no failure, error or leftover.
func (s *Summary) OK() bool {
	return s.Result == "PASS" && len(s.Passed) > 0 && len(s.Failed) == 0 && len(s.Left) == 0 && len(s.Errors) == 0
}

// line takes one console line into the summary.
func (s *Summary) line(l string) {
	l = strings.TrimRight(l, "\r")
	t := strings.TrimSpace(l)
	for _, m := range []struct {
		prefix string
		to     *[]string
	}{{"--- PASS: ", &s.Passed}, {"--- FAIL: ", &s.Failed}, {"--- SKIP: ", &s.Skipped}} {
		if rest, ok := strings.CutPrefix(t, m.prefix); ok {
			name, _, _ := strings.Cut(rest, " (")
			*m.to = append(*m.to, name)
			return
		}
	}
	switch {
	case strings.HasPrefix(t, markerRun):
		s.Binaries = append(s.Binaries, strings.TrimSpace(strings.TrimPrefix(t, markerRun)))
	case strings.HasPrefix(t, markerLeft):
		s.Left = append(s.Left, strings.TrimSpace(strings.TrimPrefix(t, markerLeft)))
	case strings.HasPrefix(t, markerError):
		s.Errors = append(s.Errors, strings.TrimSpace(strings.TrimPrefix(t, markerError)))
	case strings.HasPrefix(t, markerResult):
		s.Result = strings.TrimSpace(strings.TrimPrefix(t, markerResult))
	case s.Kernel == "" && strings.Contains(t, "Linux version "):
		_, v, _ := strings.Cut(t, "Linux version ")
		s.Kernel = v
	}
}

// String is the summary printed at the end of a run.
func (s *Summary) String() string {
	var b strings.Builder
	if s.Kernel != "" {
		k, _, _ := strings.Cut(s.Kernel, " ")
		fmt.Fprintf(&b, "guest kernel: %s\n", k)
	}
	fmt.Fprintf(&b, "guest result: %s; tests: %d passed, %d failed, %d skipped\n", orNone(s.Result), len(s.Passed), len(s.Failed), len(s.Skipped))
	for _, r := range s.Binaries {
		fmt.Fprintf(&b, "  %s\n", r)
	}
	for _, f := range s.Failed {
		fmt.Fprintf(&b, "  FAIL %s\n", f)
	}
	for _, f := range s.Skipped {
		fmt.Fprintf(&b, "  skipped %s\n", f)
	}
	for _, l := range s.Left {
		fmt.Fprintf(&b, "  left behind: %s\n", l)
	}
	for _, e := range s.Errors {
		fmt.Fprintf(&b, "  guest error: %s\n", e)
	}
	return b.String()
}

func orNone(s string) string {
	if s == "" {
		return "none (the guest never printed its final line)"
	}
	return s
}
