package cgroup2vm

import (
	"slices"
	"strings"
	"testing"
)

func TestSummaryReadsTheConsole(t *testing.T) {
	tests := []struct {
		name    string
		console string
		ok      bool
		result  string
		passed  []string
		failed  []string
		skipped []string
	}{
		{name: "every binary passed",
			console: "SeaBIOS\n=== RUN   TestA\n--- PASS: TestA (0.01s)\n    --- PASS: TestA/sub (0.00s)\n--- SKIP: TestV1 (0.00s)\nPASS\nAMF-GUEST-RUN: ok sidecar 1s\nAMF-GUEST-RESULT: PASS\r\n",
			ok:      true, result: "PASS", passed: []string{"TestA", "TestA/sub"}, skipped: []string{"TestV1"}},
		{name: "a failed test",
			console: "--- PASS: TestA (0.01s)\n--- FAIL: TestB (0.01s)\nAMF-GUEST-RUN: FAIL sidecar 1s (exit status 1)\nAMF-GUEST-RESULT: FAIL\n",
			result:  "FAIL", passed: []string{"TestA"}, failed: []string{"TestB"}},
		{name: "a guest that died before its final line",
			console: "--- PASS: TestA (0.01s)\n[    3.1] Kernel panic - not syncing\n",
			passed:  []string{"TestA"}},
		{name: "a PASS with nothing run is no pass",
			console: "AMF-GUEST-RESULT: PASS\n", result: "PASS"},
		{name: "a guest error fails a pass",
			console: "--- PASS: TestA (0.01s)\nAMF-GUEST-ERROR: set-up: mount cgroup2: busy\nAMF-GUEST-RESULT: PASS\n",
			result:  "PASS", passed: []string{"TestA"}},
		{name: "something left behind fails a pass",
			console: "--- PASS: TestA (0.01s)\nAMF-GUEST-LEFT: after sidecar: process 7 (x)\nAMF-GUEST-RESULT: PASS\n",
			result:  "PASS", passed: []string{"TestA"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var s Summary
			for _, l := range strings.Split(tc.console, "\n") {
				s.line(l)
			}
			if s.OK() != tc.ok || s.Result != tc.result || !slices.Equal(s.Passed, tc.passed) || !slices.Equal(s.Failed, tc.failed) || !slices.Equal(s.Skipped, tc.skipped) {
				t.Errorf("summary %+v (OK %v)\nwant OK %v, result %q, passed %v, failed %v, skipped %v", s, s.OK(), tc.ok, tc.result, tc.passed, tc.failed, tc.skipped)
			}
		})
	}
}
