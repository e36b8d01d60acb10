// Package brokerstatetest has what tests that run Debian's Mosquitto share;
// only tests import it, so that no binary links package testing.
package brokerstatetest

import (
	"os"
	"os/exec"
	"testing"
)

// RequireMosquitto returns Debian's Mosquitto broker, or skips the test
// without it; under AMF_REQUIRE_MOSQUITTO=1 (.ci/run, after make deps) it
// fails it. The cgroup v2 guest (make test-cgroup2) has no Mosquitto, and
// does not set it.
func RequireMosquitto(t testing.TB) string {
	t.Helper()
	for _, p := range []string{"mosquitto", "/usr/sbin/mosquitto"} {
		if bin, err := exec.LookPath(p); err == nil {
			return bin
		}
	}
	if os.Getenv("AMF_REQUIRE_MOSQUITTO") == "1" {
		t.Fatal("mosquitto not installed (make deps)")
	}
	t.Skip("mosquitto not installed (make deps)")
	return ""
}
