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
		})
	}
}
