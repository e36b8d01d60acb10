package sidecar

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/podsignal"
)

// TestAgentsFencePausesTheBrokerUntilLiftedOrStopped: a busy broker
// stand-in in a real cgroup; the agent's retained fence, published before
// the sidecar even connects, stops it; the lift resumes it; fenced again,
// a SIGTERM (the kubelet stopping the container) is let through and it
// ends. Each change is awaited with wait4 on the child, not polled.
func TestAgentsFencePausesTheBrokerUntilLiftedOrStopped(t *testing.T) {
	dir, procs := oomCgroup(t)
	busy := selfCommand()
	busy.Env = append(os.Environ(), busyEnv+"=1")
	busy.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	pid := busy.Process.Pid
	ended := false
	t.Cleanup(func() {
		if !ended {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			_ = syscall.Kill(pid, syscall.SIGCONT)
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &ws, 0, nil)
		}
	})
	for _, p := range procs {
		if err := os.WriteFile(p, []byte(strconv.Itoa(pid)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// wait4 for the child's next change (stopped, continued or ended).
	next := func(what string) syscall.WaitStatus {
		t.Helper()
		got := make(chan syscall.WaitStatus, 1)
		go func() {
			var ws syscall.WaitStatus
			if _, err := syscall.Wait4(pid, &ws, syscall.WUNTRACED|syscall.WCONTINUED, nil); err != nil {
				t.Errorf("wait4: %v", err)
			}
			got <- ws
		}()
		select {
		case ws := <-got:
			return ws
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no change of the broker within 30 s", what)
			return 0
		}
	}

	srv, broker := startBroker(t)
	cmdTopic := podsignal.CommandTopic("tod", "broker-0")
	command := func(fence bool) {
		t.Helper()
		b, err := podsignal.EncodeCommand(&podsignal.Command{Version: podsignal.Version, Namespace: "tod", Pod: "broker-0",
			Fence: fence, Time: time.Now(), Reason: "test"})
		if err != nil {
			t.Fatal(err)
		}
		if err := srv.Publish(cmdTopic, b, true, 1); err != nil {
			t.Fatal(err)
		}
	}
	command(true) // retained: the sidecar gets it when it connects

	src, err := cgroup.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Embedded(model.PaperName)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := NewSignaller(SignallerConfig{Broker: broker, Namespace: "tod", Pod: "broker-0", Token: "t", KeepAlive: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := New(Config{Source: src, Interval: 100 * time.Millisecond, Model: m, Publisher: sig, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sc.Run(t.Context()) }()
	t.Cleanup(func() { <-done })

	if ws := next("the retained fence"); !ws.Stopped() {
		t.Fatalf("broker %v, want stopped by the fence", ws)
	}
	if st := sc.Status(); !st.Fenced || !strings.Contains(st.Fence, "paused") {
		t.Errorf("status fenced %v %q, want fenced and paused", st.Fenced, st.Fence)
	}
	command(false)
	if ws := next("the lift"); !ws.Continued() {
		t.Fatalf("broker %v, want resumed by the lift", ws)
	}
	command(true)
	if ws := next("the second fence"); !ws.Stopped() {
		t.Fatalf("broker %v, want stopped again", ws)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil { // as the kubelet would
		t.Fatal(err)
	}
	for {
		ws := next("the SIGTERM while fenced")
		if ws.Continued() {
			continue // resumed to end
		}
		if !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
			t.Fatalf("broker %v, want ended by its SIGTERM", ws)
		}
		ended = true
		break
	}
	if st := sc.Status(); !st.Fenced || !strings.Contains(st.Fence, "being stopped") {
		t.Errorf("status fenced %v %q, want fenced and the stop let through", st.Fenced, st.Fence)
	}
}
