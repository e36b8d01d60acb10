// Package depcheck is the one test of what a package links: each binary's
// and inject's TestDeps call it. Only test files import it (it imports
// testing), so no product binary links it.
package depcheck

import (
	"os/exec"
	"strings"
	"testing"
)

// Forbid fails t for each dependency of the package in the current
// directory that is banned: equal to an entry, or under an entry that ends
// in "/". what names the package in the failure.
func Forbid(t testing.TB, what string, banned ...string) {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH: cannot list dependencies")
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, b := range banned {
			if dep == b || strings.HasSuffix(b, "/") && strings.HasPrefix(dep, b) {
				t.Errorf("%s links %s", what, dep)
			}
		}
	}
}
