package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func runCLI(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(t.Context(), args, stdio{strings.NewReader(stdin), &out, &errb})
	return code, out.String(), errb.String()
}

// wantExit checks a command's exit code and that its stderr mentions each of
// mention.
func wantExit(t *testing.T, code int, stderr string, want int, mention ...string) {
	t.Helper()
	if code != want {
		t.Fatalf("exit code %d, want %d (stderr %q)", code, want, stderr)
	}
	for _, m := range mention {
		if !strings.Contains(stderr, m) {
			t.Errorf("stderr %q does not mention %q", stderr, m)
		}
	}
}

const hdr = "time,cpu_seconds_total,memory_bytes,memory_limit_bytes,network_bytes_total,disk_bytes_total\n"

func TestReplayCommand(t *testing.T) {
	file := filepath.Join(t.TempDir(), "in.csv")
	if err := os.WriteFile(file, []byte(hdr+"1,0,1,2,0,0\n2,1,1,2,5,0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		stdin      string
		args       []string
		code       int
		outLines   int
		errMention string
	}{
		{"file input", "", []string{"replay", "--in", file}, 0, 3, ""},
		{"standard input", hdr + "1,0,1,2,0,0\n", []string{"replay", "--in", "-"}, 0, 2, ""},
		{"bad value names line and column", hdr + "1,0,1,2,0,0\n2,x,1,2,0,0\n", []string{"replay", "--in", "-"}, 2, 2, "line 3, column cpu_seconds_total"},
		{"time backwards", hdr + "2,0,1,2,0,0\n1,0,1,2,0,0\n", []string{"replay", "--in", "-"}, 2, 2, "line 3, column time"},
		{"missing --in", "", []string{"replay"}, 2, 0, "--in FILE is required"},
		{"missing file", "", []string{"replay", "--in", filepath.Join(t.TempDir(), "nope.csv")}, 2, 0, "cannot open input"},
		{"bad window", "", []string{"replay", "--in", file, "--step", "0s"}, 2, 0, "step"},
		{"a predict window adds the projection", "", []string{"replay", "--in", file, "--predict-window", "1m", "--predict-horizon", "30s"}, 0, 3, ""},
		{"predict-linear's own projection", "", []string{"replay", "--in", file, "--model", "predict-linear"}, 0, 3, ""},
		{"a projection other than the model's is refused", "", []string{"replay", "--in", file, "--model", "predict-linear", "--predict-window", "1m", "--predict-horizon", "30s"}, 2, 0, "predict-linear) projects with 5m and 30s"},
		{"a horizon without a window is refused", "", []string{"replay", "--in", file, "--predict-horizon", "30s"}, 2, 0, "needs a predict window"},
		{"unknown command", "", []string{"frobnicate"}, 2, 0, "unknown command"},
		{"no command", "", nil, 2, 0, "Usage"},
		{"sample needs a target", "", []string{"sample"}, 2, 0, "exactly one of --pid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errs := runCLI(t, tt.stdin, tt.args...)
			if code != tt.code {
				t.Fatalf("exit code %d, want %d (stderr %q)", code, tt.code, errs)
			}
			if n := strings.Count(out, "\n"); n != tt.outLines {
				t.Fatalf("stdout has %d lines, want %d: %q", n, tt.outLines, out)
			}
			if !strings.Contains(errs, tt.errMention) {
				t.Fatalf("stderr %q does not mention %q", errs, tt.errMention)
			}
		})
	}
}

// The sidecar runs in every broker pod: it must stay small and never link the
// Kubernetes client (DESIGN.md, package table).
func TestSidecarDoesNotImportKubernetesClients(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "k8s.io/") || strings.HasPrefix(pkg, "sigs.k8s.io/") {
			t.Fatalf("amf-sidecar depends on %s", pkg)
		}
	}
}
