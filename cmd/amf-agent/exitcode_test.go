package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/amf-edge/amf/internal/exitcode"
)

// TestExitStatusesFollowTheConvention: the agent and inject say 0 for help,
// 2 for a wrong command line or input (nothing done), 1 for a failure while
// running (package exitcode; the README's "Exit status").
func TestExitStatusesFollowTheConvention(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte("s3cret-token-of-a-test ns/pod\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kubeconfig := unreachableKubeconfig(t)
	for _, tt := range []struct {
		name  string
		args  []string
		stdin string
		want  int
		say   string // on stderr
	}{
		{"agent help", []string{"--help"}, "", exitcode.OK, "-listen"},
		{"agent unknown flag", []string{"--bogus"}, "", exitcode.Usage, "flag provided but not defined: -bogus"},
		{"agent stray argument", []string{"serve"}, "", exitcode.Usage, `unexpected arguments ["serve"]`},
		{"agent bad log level", []string{"--log-level=loud"}, "", exitcode.Usage, "--log-level"},
		{"agent flags that exclude each other", []string{"--resume-on-start"}, "", exitcode.Usage, "--resume-on-start needs --actuate"},
		// A package's Config.Validate refuses the value before anything
		// binds: the taken address would say "address already in use".
		{"agent setting its package refuses", []string{"--token-file", tokens, "--max-clients=-1", "--listen", taken.Addr().String(), "--http", "127.0.0.1:0"}, "", exitcode.Usage, "agent: MaxClients -1, want at least 1"},
		{"agent keepalive its package refuses", []string{"--token-file", tokens, "--max-keepalive=500ms", "--listen", taken.Addr().String(), "--http", "127.0.0.1:0"}, "", exitcode.Usage, "agent: MaxKeepalive 500ms"},
		// ... and before anything connects: the API server of kubeconfig
		// is unreachable, and the probe address is the taken one.
		{"agent liveness setting its package refuses", []string{"--kubeconfig", kubeconfig, "--actuate", "--liveness", "--node-name=n1", "--liveness-advertise=10.0.0.5:1885",
			"--lease-namespace=", "--liveness-listen", taken.Addr().String(), "--listen", taken.Addr().String(), "--http", "127.0.0.1:0"}, "", exitcode.Usage, "--liveness: liveness: an agent needs a cluster, the Leases' namespace, its node, the address it answers probes at and the one it advertises (missing: Namespace)"},
		{"agent node mode at an interval its model cannot run at", []string{"--kubeconfig", kubeconfig, "--node-mode", "--node-name=n1", "--interval=-1s", "--listen", taken.Addr().String()}, "", exitcode.Usage, "amf-agent: --interval: model (embedded leadtime)"},
		{"agent listen address taken", []string{"--token-file", tokens, "--listen", taken.Addr().String(), "--http", "127.0.0.1:0"}, "", exitcode.Failure, "address already in use"},
		{"inject help", []string{"inject", "--help"}, "", exitcode.OK, "Usage: amf-agent inject"},
		{"inject unknown flag", []string{"inject", "--bogus"}, "", exitcode.Usage, "flag provided but not defined: -bogus"},
		{"inject stray argument", []string{"inject", "d.yaml"}, "", exitcode.Usage, "unexpected arguments"},
		{"inject missing file", []string{"inject", "-f", filepath.Join(t.TempDir(), "none.yaml")}, "", exitcode.Usage, "no such file"},
		{"inject refused document", []string{"inject"}, "kind: [Deployment\n", exitcode.Usage, "document 1: not YAML"},
		{"inject nothing to inject", []string{"inject"}, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", exitcode.Usage, "no apps/v1 Deployment in the input"},
		{"connkill help", []string{"connkill", "--help"}, "", exitcode.OK, "Usage: amf-agent connkill"},
		{"connkill without its socket", []string{"connkill"}, "", exitcode.Usage, "--socket is required"},
		{"inject admission with an image", []string{"inject", "--admission", "--sidecar-image", "x:1"}, "", exitcode.Usage, "the admission policy writes the image of its ConfigMap"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if got := mainCode(tt.args, strings.NewReader(tt.stdin), &out, &errb); got != tt.want {
				t.Errorf("exit %d, want %d; stderr:\n%s", got, tt.want, errb.String())
			}
			if !strings.Contains(errb.String(), tt.say) {
				t.Errorf("stderr lacks %q:\n%s", tt.say, errb.String())
			}
			if tt.want == exitcode.Usage && strings.Contains(errb.String(), "serving") {
				t.Errorf("refused after something started serving:\n%s", errb.String())
			}
		})
	}
}

// unreachableKubeconfig writes a kubeconfig whose API server nothing
// answers at: a test that uses it shows the agent gave up before it
// connected.
func unreachableKubeconfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	const cfg = `apiVersion: v1
kind: Config
clusters:
- name: nowhere
  cluster: {server: "https://127.0.0.1:1"}
users:
- name: test
  user: {token: not-a-real-token}
contexts:
- name: test
  context: {cluster: nowhere, user: test}
current-context: test
`
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
