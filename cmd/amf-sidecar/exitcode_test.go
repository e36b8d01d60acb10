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

// TestRunRefusesABadValueBeforeItServes: a wrong command line is a usage
// error before the health endpoint binds (its address is taken here, which
// would be a failure) or the agent is dialled.
func TestRunRefusesABadValueBeforeItServes(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, env := range []string{"POD_UID", "AMF_AGENT", "AMF_STATE_HUB"} {
		t.Setenv(env, "") // the flags' defaults, whatever runs the test
	}
	pid := strconv.Itoa(os.Getpid())
	for _, tt := range []struct {
		name string
		args []string
		say  string // on stderr
	}{
		{"a zero interval", []string{"--interval=0s"}, "amf-sidecar run: --interval must be positive"},
		{"an interval the default model cannot run at", []string{"--interval=10s"}, "amf-sidecar run: --interval: model"},
		{"no target", []string{"--pid=0"}, "amf-sidecar run: target: give exactly one of --pid"},
		{"two probes", []string{"--probe-mqtt=tcp://127.0.0.1:1883", "--probe-tcp=127.0.0.1:1883"}, "amf-sidecar run: give at most one of --probe-mqtt and --probe-tcp"},
		{"an agent URL of another scheme", []string{"--agent=foo://bar:1884", "--namespace=tod", "--pod=broker-0"}, "scheme must be tcp or mqtt"},
		{"a state file without its hub", []string{"--state-file=/data/mosquitto.db", "--state-hub="}, "amf-sidecar run: --state-file needs --state-hub"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"run", "--pid", pid, "--http", taken.Addr().String()}, tt.args...)
			var errb bytes.Buffer
			if got := run(context.Background(), args, stdio{strings.NewReader(""), &strings.Builder{}, &errb}); got != exitcode.Usage {
				t.Errorf("exit %d, want %d; stderr:\n%s", got, exitcode.Usage, errb.String())
			}
			if !strings.Contains(errb.String(), tt.say) {
				t.Errorf("stderr lacks %q:\n%s", tt.say, errb.String())
			}
			if strings.Contains(errb.String(), "serving") || strings.Contains(errb.String(), "sidecar started") {
				t.Errorf("refused after it started:\n%s", errb.String())
			}
		})
	}
}
