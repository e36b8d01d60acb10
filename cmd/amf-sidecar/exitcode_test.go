package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"strconv"
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

// TestTheFirstLogLineSaysWhereTheSidecarServes: before anything can go
// wrong; here the address is taken, so the sidecar then stops with exit 1.
func TestTheFirstLogLineSaysWhereTheSidecarServes(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	var errb bytes.Buffer
	code := run(context.Background(), []string{"run", "--pid", strconv.Itoa(os.Getpid()), "--http", taken.Addr().String()}, stdio{strings.NewReader(""), &strings.Builder{}, &errb})
	if code != exitcode.Failure {
		t.Errorf("exit %d with the endpoint's address taken, want %d", code, exitcode.Failure)
	}
	first, _, _ := strings.Cut(errb.String(), "\n")
	var line struct{ Msg, HTTP string }
	if err := json.Unmarshal([]byte(first), &line); err != nil || line.Msg != "sidecar starting" || line.HTTP != taken.Addr().String() {
		t.Errorf("first log line %q, want \"sidecar starting\" with http %s", first, taken.Addr())
	}
}
