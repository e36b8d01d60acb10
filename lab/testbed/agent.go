package testbed

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// Agent identity, as manifests/base creates it.
const (
	AgentNamespace      = "amf-system"
	AgentServiceAccount = "amf-agent"
)

// AgentLine is one JSON log line of the agent that the experiment reads:
// "transition" and "signal" (a pod's health), "decision" (package actuate).
type AgentLine struct {
	Time        time.Time `json:"time"`
	Level       string    `json:"level"`
	Msg         string    `json:"msg"`
	Namespace   string    `json:"namespace"`
	Pod         string    `json:"pod"`
	From        string    `json:"from"`
	To          string    `json:"to"`
	Probability *float64  `json:"probability"`
	Reason      string    `json:"reason"`
	SampleTime  time.Time `json:"sample_time"`
	// Received is when the agent's broker took the signal in (its intake
	// hook, before the state and the log): the moment the agent has it.
	Received   time.Time `json:"received"`
	Source     string    `json:"source"`
	Deployment string    `json:"deployment"`
	Action     string    `json:"action"`
	Phase      string    `json:"phase"`
	DryRun     bool      `json:"dry_run"`
	Error      string    `json:"error"`
	// Explanation is what drove the score (a signal) or the switchover (a
	// decision).
	Explanation string `json:"explanation"`
	// Note is an Event's text, as the agent logs each Event it records.
	Note string `json:"note"`
	// Node is the node of the agent's liveness lines ("guarded node lost",
	// "fence").
	Node string `json:"node"`
	// Raw is the whole line, as logged.
	Raw string `json:"-"`
}

// AgentPod is the agent DaemonSet's pod on a node (DeployAgent) and what it logged.
type AgentPod struct {
	Addr string // MQTT listener, host:port (the node's IP, the DaemonSet's hostPort)
	Pod  string

	stop     context.CancelFunc // ends following the log
	followed chan struct{}
	// reconnect ends the current log stream (Reconnect), so a new one
	// starts where it left off.
	reconnect chan struct{}

	mu    sync.Mutex
	lines []AgentLine
	subs  []chan AgentLine
}

// onLine passes on a JSON log line (others are ignored).
func (a *AgentPod) onLine(s string) {
	var l AgentLine
	if json.Unmarshal([]byte(s), &l) != nil || l.Msg == "" {
		return
	}
	l.Raw = s
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lines = append(a.lines, l)
	for _, c := range a.subs {
		select {
		case c <- l:
		default: // a slow reader still has Lines
		}
	}
}

// Lines returns a copy of every line logged so far.
func (a *AgentPod) Lines() []AgentLine {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]AgentLine(nil), a.lines...)
}

// Subscribe returns the lines logged from now on (buffered; a slow reader loses
// lines here, never in Lines) and a function that ends the subscription.
func (a *AgentPod) Subscribe() (<-chan AgentLine, func()) {
	c := make(chan AgentLine, 1024)
	a.mu.Lock()
	a.subs = append(a.subs, c)
	a.mu.Unlock()
	return c, func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		for i, s := range a.subs {
			if s == c {
				a.subs = append(a.subs[:i], a.subs[i+1:]...)
				break
			}
		}
	}
}

// SubscribeAll merges the lines of agents from now on into one channel:
// what a reader of a pair across nodes reads, where which agent says what
// is the product's to choose. Like Subscribe, a slow reader loses lines
// here, never in each agent's Lines. The function ends it.
func SubscribeAll(agents ...*AgentPod) (<-chan AgentLine, func()) {
	out := make(chan AgentLine, 4096)
	done := make(chan struct{})
	var wg sync.WaitGroup
	var unsubs []func()
	for _, ag := range agents {
		in, unsub := ag.Subscribe()
		unsubs = append(unsubs, unsub)
		wg.Go(func() {
			for {
				select {
				case l := <-in:
					select {
					case out <- l:
					default:
					}
				case <-done:
					return
				}
			}
		})
	}
	return out, func() {
		close(done)
		wg.Wait()
		for _, u := range unsubs {
			u()
		}
	}
}

// Reconnect ends the log stream being read, and a new one starts where it
// left off: after a power cut or a partition of the agent's node the old
// stream hangs (no reset ever came) until TCP gives up, minutes later.
func (a *AgentPod) Reconnect() {
	select {
	case a.reconnect <- struct{}{}:
	default:
	}
}

// Stop stops following the pod's log (the pod stays until its namespace goes).
func (a *AgentPod) Stop() {
	a.stop()
	<-a.followed
}

// RepoRoot finds the repository (the folder with go.mod and manifests/) from the
// working directory upwards.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "manifests", "base", "kustomization.yaml")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no AMF repository (manifests/base) above %s: run from the repository or pass its path", dir)
		}
	}
}
