package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/amf-edge/amf/internal/exitcode"
)

// TestExitStatusesFollowTheConvention: 0 for help, 2 for a wrong command
// line or input, 1 for a failure while running (package exitcode).
func TestExitStatusesFollowTheConvention(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want int
	}{
		{"help", []string{"--help"}, exitcode.OK},
		{"a command's help", []string{"run", "-h"}, exitcode.OK},
		{"state's help", []string{"state", "save", "-h"}, exitcode.OK},
		{"no command", nil, exitcode.Usage},
		{"unknown command", []string{"serve"}, exitcode.Usage},
		{"unknown flag", []string{"score", "--bogus"}, exitcode.Usage},
		{"a bad agent URL", []string{"run", "--pid", "1", "--agent", "foo://bar"}, exitcode.Usage},
		{"an input that is not a state", []string{"state", "load", "--file", "/nonexistent/mosquitto.db"}, exitcode.Usage},
		{"no broker to save from", []string{"state", "save", "--file", "/tmp/mosquitto.db", "--process", "amf-no-such-broker"}, exitcode.Failure},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			if got := run(context.Background(), tt.args, stdio{strings.NewReader("x"), &out, &errb}); got != tt.want {
				t.Errorf("exit %d, want %d; stderr:\n%s", got, tt.want, errb.String())
			}
		})
	}
}
