package contract

import (
	"bufio"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// TestNoDeps keeps the package standard-library only, so naming the
// vocabulary never links a broker or a Kubernetes client.
func TestNoDeps(t *testing.T) {
	for _, dep := range goListDeps(t, ".") {
		if strings.Contains(strings.SplitN(dep, "/", 2)[0], ".") && dep != "github.com/amf-edge/amf/contract" {
			t.Errorf("contract depends on %s; it must need only the standard library", dep)
		}
	}
}

// goListDeps returns `go list -deps pkg`, skipping where no go command runs
// (the arm64 test binaries under qemu).
func goListDeps(t *testing.T, pkg string) []string {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command on PATH: cannot list dependencies")
	}
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// TestFeatureNamesFile keeps feature_names.txt, which the Python side of
// training reads, equal to FeatureNames.
func TestFeatureNamesFile(t *testing.T) {
	f, err := os.Open("feature_names.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []string
	for sc := bufio.NewScanner(f); sc.Scan(); {
		got = append(got, sc.Text())
	}
	want := FeatureNames()
	if !slices.Equal(got, want[:]) {
		t.Fatalf("feature_names.txt has %q, FeatureNames %q: write FeatureNames one a line", got, want)
	}
}

// TestObjectNameRuleAgreesWithKubernetes checks that the restated DNS-1123
// rule accepts, refuses and explains names as apimachinery does.
func TestObjectNameRuleAgreesWithKubernetes(t *testing.T) {
	for _, name := range []string{
		"b", "broker-standby", "a.b.c", "0abc", "a-", "-a", "A", "B_b", "a..b", ".a", "a.", "",
		"ünicode", "a b", strings.Repeat("a", 253), strings.Repeat("a", 254), strings.Repeat("a.", 127) + "a",
		strings.Repeat("-", 300),
	} {
		if got, want := dns1123Subdomain(name), validation.IsDNS1123Subdomain(name); !slices.Equal(got, want) {
			t.Errorf("%q: contract says %q, apimachinery %q", name, got, want)
		}
	}
}
