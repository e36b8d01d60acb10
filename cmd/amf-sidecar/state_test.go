package main

import (
	"bytes"
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/sidecar/handover"
)

func stateMosquitto(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts real Mosquitto brokers")
	}
	for _, p := range []string{"/usr/sbin/mosquitto", "mosquitto"} {
		if bin, err := exec.LookPath(p); err == nil {
			return bin
		}
	}
	t.Skip("mosquitto not installed (make deps)")
	return ""
}

// TestStateSaveAndLoadMoveABrokersStateToAnother: what an operator does with
// kubectl exec, on real brokers: save from one, load into another, whose
// broker is killed to be started again on it; a 3.1.1 client then finds its
// session and what was queued for it, and the retained messages are there.
func TestStateSaveAndLoadMoveABrokersStateToAnother(t *testing.T) {
	bin := stateMosquitto(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	from, err := brokerstate.StartMosquitto(ctx, bin, t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(from.Kill)
	to, err := brokerstate.StartMosquitto(ctx, bin, t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(to.Kill)
	plan := brokerstate.Plan{Retained: 20, Sessions: 1, Queued: 3}
	if err := brokerstate.Seed(ctx, from.Addr, plan); err != nil {
		t.Fatal(err)
	}

	var state, errb bytes.Buffer
	if code := run(ctx, []string{"state", "save", "--file", from.File, "--pid", strconv.Itoa(from.PID())}, stdio{strings.NewReader(""), &state, &errb}); code != exitOK {
		t.Fatalf("state save: exit %d: %s", code, errb.String())
	}
	if want := "20 retained messages, 1 persistent sessions, 3 messages queued"; !strings.Contains(errb.String(), want) {
		t.Errorf("state save said %q, want %q", errb.String(), want)
	}
	errb.Reset()
	if code := run(ctx, []string{"state", "load", "--file", to.File, "--pid", strconv.Itoa(to.PID())}, stdio{&state, &strings.Builder{}, &errb}); code != exitOK {
		t.Fatalf("state load: exit %d: %s", code, errb.String())
	}
	if !strings.Contains(errb.String(), "broker restarting on a snapshot") {
		t.Errorf("state load said %q", errb.String())
	}
	if err := to.WaitExit(ctx); err == nil {
		t.Fatal("the broker loaded into ended cleanly: it must be killed, or it saves its own state over the file")
	}
	if err := to.Start(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := brokerstate.Check(ctx, to.Addr, plan)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Lossless() || res.RetainedFound != 20 || res.QueuedFound != 3 {
		t.Errorf("after load: %v", res)
	}
}

func TestStateRefusesWhatItCannotDo(t *testing.T) {
	for _, tt := range []struct {
		name  string
		args  []string
		stdin string
		code  int
		want  string
	}{
		{"no verb", []string{"state"}, "", exitUsage, "amf-sidecar state save"},
		{"unknown verb", []string{"state", "copy"}, "", exitUsage, "amf-sidecar state load"},
		{"stray argument", []string{"state", "save", "x"}, "", exitUsage, `unexpected arguments ["x"]`},
		{"not a state", []string{"state", "load", "--file", "/nonexistent/mosquitto.db"}, "hello", exitUsage, "refused state: mosquittodb: not a whole Mosquitto persistence file"},
		{"a state over what the sidecar holds", []string{"state", "load"}, strings.Repeat("x", handover.MaxStateBytes+1), exitUsage, "more than the sidecar holds in memory"},
		{"no broker to save from", []string{"state", "save", "--file", "/tmp/mosquitto.db", "--process", "amf-no-such-broker"}, "", exitFail, `no process named "amf-no-such-broker"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(context.Background(), tt.args, stdio{strings.NewReader(tt.stdin), &out, &errb})
			if code != tt.code || !strings.Contains(errb.String(), tt.want) {
				t.Errorf("exit %d, stderr %q; want %d and %q", code, errb.String(), tt.code, tt.want)
			}
			if out.Len() > 0 {
				t.Errorf("wrote %d bytes to standard output", out.Len())
			}
		})
	}
}
