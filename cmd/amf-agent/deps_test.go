package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps keeps what the binary links in bounds: no package testing in a product binary (it registers test flags).
func TestDeps(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH: cannot list dependencies")
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"testing"} {
			if dep == banned || strings.HasSuffix(banned, "/") && strings.HasPrefix(dep, banned) {
				t.Errorf("%s links %s", "amf-agent", dep)
			}
		}
	}
}
