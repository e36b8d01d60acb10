package main

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"

	"github.com/amf-edge/amf/podsignal"
)

const waitFor = 30 * time.Second

// TestBinaryLogsASignal runs the real amf-agent binary with a static token
// file and checks that a paho client's signal shows up as one JSON transition
// line on its stderr, that SIGHUP reloads the tokens, and that SIGTERM stops
// it cleanly.
func TestBinaryLogsASignal(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildAgent(t)
	const tokA, tokB = "binary-test-token-a-0001", "binary-test-token-b-0002"
	tokens := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(tokens, []byte(tokA+" tod/broker-a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	proc := startAgent(t, bin, []string{tokA, tokB}, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--token-file", tokens, "--observe-only")
	await := func(msg string, kv ...string) map[string]any {
		t.Helper()
		return proc.await(t, msg, kv...)
	}
	serving := await("agent serving")
	addr, _ := serving["mqtt_addr"].(string)
	if serving["observe_only"] != true || addr == "" {
		t.Fatalf("serving line = %v", serving)
	}

	connect := func(ns, pod, token string) paho.Client {
		t.Helper()
		id := ns + "/" + pod
		c := paho.NewClient(paho.NewClientOptions().AddBroker("tcp://" + addr).
			SetClientID(id).SetUsername(id).SetPassword(token).SetProtocolVersion(4).
			SetKeepAlive(5 * time.Second).SetAutoReconnect(false).SetConnectTimeout(waitFor))
		if tok := c.Connect(); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
			t.Fatalf("connect as %s: %v", id, tok.Error())
		}
		t.Cleanup(func() { c.Disconnect(0) })
		return c
	}
	send := func(c paho.Client, ns, pod string, state podsignal.State) {
		t.Helper()
		p := 0.97
		body, err := podsignal.Encode(&podsignal.Message{Version: podsignal.Version, Namespace: ns, Pod: pod,
			State: state, Probability: &p, Seq: 1, Time: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		if tok := c.Publish(podsignal.Topic(ns, pod), 1, true, body); !tok.WaitTimeout(waitFor) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}

	send(connect("tod", "broker-a", tokA), "tod", "broker-a", podsignal.Anomalous)
	line := await("transition", "pod", "broker-a")
	if line["namespace"] != "tod" || line["to"] != "anomalous" || line["probability"] != 0.97 || line["level"] != "INFO" {
		t.Errorf("transition line = %v", line)
	}

	// SIGHUP reloads the token file.
	if err := os.WriteFile(tokens, []byte(tokA+" tod/broker-a\n"+tokB+" tod/broker-b\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := proc.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if l := await("static token file reloaded"); l["tokens"] != 2.0 {
		t.Errorf("reload line = %v", l)
	}
	send(connect("tod", "broker-b", tokB), "tod", "broker-b", podsignal.Healthy)
	await("transition", "pod", "broker-b", "to", "healthy")

	proc.stop(t)
}

// buildAgent builds the amf-agent binary into a temporary folder.
func buildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "amf-agent")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// agentProcess is a running amf-agent binary whose stderr is read as JSON
// lines.
type agentProcess struct {
	cmd    *exec.Cmd
	lines  chan map[string]any
	exited chan error
}

// startAgent starts bin with args. A line that is not JSON, or that
// contains one of secrets, is reported by await and stop as an error.
func startAgent(t *testing.T, bin string, secrets []string, args ...string) *agentProcess {
	t.Helper()
	p := &agentProcess{cmd: exec.Command(bin, args...), lines: make(chan map[string]any, 256), exited: make(chan error, 1)}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		// Problems are passed on as lines: t must not be used after the test ends.
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				m = map[string]any{"msg": "BAD LINE", "problem": "not JSON", "line": sc.Text()}
			}
			for _, s := range secrets {
				if strings.Contains(sc.Text(), s) {
					m = map[string]any{"msg": "BAD LINE", "problem": "secret in the log", "line": sc.Text()}
				}
			}
			p.lines <- m
		}
		p.exited <- p.cmd.Wait()
	}()
	t.Cleanup(func() { _ = p.cmd.Process.Kill() })
	return p
}

// await returns the first line with the message and fields given.
func (p *agentProcess) await(t *testing.T, msg string, kv ...string) map[string]any {
	t.Helper()
	deadline := time.After(waitFor)
	var skipped []string // shown when the line never comes
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("amf-agent exited before logging %q; it logged:\n%s", msg, strings.Join(skipped, "\n"))
			}
			if b, err := json.Marshal(l); err == nil {
				skipped = append(skipped, string(b))
			}
			if l["msg"] == "BAD LINE" {
				t.Errorf("%s: %s", l["problem"], l["line"])
			}
			match := l["msg"] == msg
			for i := 0; match && i+1 < len(kv); i += 2 {
				match = l[kv[i]] == kv[i+1]
			}
			if match {
				return l
			}
		case <-deadline:
			t.Fatalf("no %q line within %v; it logged:\n%s", msg, waitFor, strings.Join(skipped, "\n"))
		}
	}
}

// stop sends SIGTERM and checks the agent logs its stop and exits cleanly.
func (p *agentProcess) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.await(t, "agent stopped")
	for l := range p.lines {
		if l["msg"] == "BAD LINE" {
			t.Errorf("%s: %s", l["problem"], l["line"])
		}
	}
	select {
	case err := <-p.exited:
		if err != nil {
			t.Errorf("amf-agent exited with %v after SIGTERM", err)
		}
	case <-time.After(waitFor):
		t.Fatal("amf-agent did not exit after SIGTERM")
	}
}

func TestRunRefusesBadFlags(t *testing.T) {
	dir := t.TempDir()
	open := filepath.Join(dir, "open-tokens")
	if err := os.WriteFile(open, []byte("0123456789abcdef tod/a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "") // not in a pod, whatever runs the test
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--token-file", open}, "chmod 600"},
		{[]string{"--token-file", open, "--kubeconfig", open}, "excludes --kubeconfig"},
		{[]string{}, "--token-file outside Kubernetes"},
		{[]string{"--kubeconfig", filepath.Join(dir, "missing")}, "--kubeconfig"},
		{[]string{"--log-level", "loud"}, "--log-level"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"--liveness", "--kubeconfig", open}, "--liveness needs --actuate"},
		{[]string{"--liveness", "--actuate", "--kubeconfig", open}, "--liveness needs --node-name"},
		{[]string{"--liveness", "--actuate", "--node-name", "n0", "--kubeconfig", open}, "--liveness-advertise"},
		{[]string{"--liveness", "--actuate", "--node-name", "n0", "--liveness-advertise", "10.0.0.5", "--kubeconfig", open}, "want host:port"},
		{[]string{"--liveness", "--actuate", "--node-name", "n0", "--liveness-advertise", "10.0.0.5:http", "--kubeconfig", open}, "not a TCP port"},
		{[]string{"--liveness", "--actuate", "--node-name", "n0", "--liveness-advertise", "10.0.0.5:1885", "--liveness-lost", "1s", "--kubeconfig", open}, "fence"},
		{[]string{"--node-mode", "--token-file", open}, "--node-mode needs the Kubernetes API"},
		{[]string{"--node-mode", "--kubeconfig", open}, "--node-mode needs --node-name"},
		{[]string{"--host-cgroup-root", "/host/sys/fs/cgroup", "--kubeconfig", open}, "are for --node-mode"},
		{[]string{"--actuate", "--state-listen", ":1886", "--state-advertise", "10.0.0.5:1886", "--kubeconfig", open}, "go together"},
		{[]string{"--actuate", "--state-advertise", "10.0.0.5:1886", "--state-peer-token", open, "--kubeconfig", open}, "needs --state-listen"},
		{[]string{"--actuate", "--node-name", "n0", "--state-listen", ":1886", "--state-advertise", "10.0.0.5", "--state-peer-token", open, "--kubeconfig", open}, "want host:port"},
		{[]string{"--actuate", "--state-listen", ":1886", "--state-advertise", "10.0.0.5:1886", "--state-peer-token", open, "--kubeconfig", open}, "needs --node-name"},
	} {
		err := run(tt.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("run(%q) = %v, want an error mentioning %q", tt.args, err, tt.want)
		}
	}
}
