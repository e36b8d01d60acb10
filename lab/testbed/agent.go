package testbed

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/utils/ptr"

	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/proc"
)

// Agent identity, as manifests/base creates it.
const (
	AgentNamespace      = "amf-system"
	AgentServiceAccount = "amf-agent"
)

// baseFiles are manifests/base without the DaemonSet: in the lab the agent runs
// as a local process (the lab node does not provide in-cluster configuration),
// under the same ServiceAccount and ClusterRoles.
var baseFiles = []string{"namespace.yaml", "serviceaccount.yaml", "clusterrole-authn.yaml", "clusterrole-actuate.yaml", "clusterrolebindings.yaml"}

// ApplyAgentRBAC applies manifests/base (without the DaemonSet) from repo and
// writes a kubeconfig for the amf-agent ServiceAccount to path.
func ApplyAgentRBAC(ctx context.Context, cp *controlplane.ControlPlane, repo, path string) error {
	args := []string{"apply", "--server-side"}
	for _, f := range baseFiles {
		args = append(args, "-f", filepath.Join(repo, "manifests", "base", f))
	}
	if out, err := cp.Kubectl(ctx, nil, args...); err != nil {
		return fmt.Errorf("apply the agent's RBAC: %w: %s", err, out)
	}
	if err := cp.WaitServiceAccount(ctx, AgentNamespace, AgentServiceAccount); err != nil {
		return err
	}
	token, err := cp.ServiceAccountToken(ctx, AgentNamespace, AgentServiceAccount, authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](24 * 3600)})
	if err != nil {
		return fmt.Errorf("token for %s/%s: %w", AgentNamespace, AgentServiceAccount, err)
	}
	return cp.WriteKubeconfig(path, AgentServiceAccount, token)
}

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
	Deployment  string    `json:"deployment"`
	Action      string    `json:"action"`
	Phase       string    `json:"phase"`
	DryRun      bool      `json:"dry_run"`
	Error       string    `json:"error"`
}

// Agent is an amf-agent process and what it logged.
type Agent struct {
	Addr string // MQTT listener, host:port
	Proc *proc.Proc

	mu    sync.Mutex
	lines []AgentLine
	subs  []chan AgentLine
}

// AgentOptions configure StartAgent.
type AgentOptions struct {
	Bin         string // amf-agent binary
	Kubeconfig  string
	Node        string
	Actuate     bool
	ObserveOnly bool
	LogPath     string
}

// StartAgent starts amf-agent on free loopback ports with debug logging (each
// signal, with its probability, is a line).
func StartAgent(ctx context.Context, o AgentOptions) (*Agent, error) {
	addr, err := proc.FreeAddr()
	if err != nil {
		return nil, err
	}
	httpAddr, err := proc.FreeAddr()
	if err != nil {
		return nil, err
	}
	args := []string{"--listen", addr, "--http", httpAddr, "--kubeconfig", o.Kubeconfig, "--log-level", "debug"}
	if o.Node != "" {
		args = append(args, "--node-name", o.Node)
	}
	if o.Actuate {
		args = append(args, "--actuate")
	}
	if o.ObserveOnly {
		args = append(args, "--observe-only")
	}
	a := &Agent{Addr: addr}
	a.Proc, err = proc.Start("amf-agent", o.LogPath, a.onLine, o.Bin, args...)
	if err != nil {
		return nil, err
	}
	if err := proc.WaitListening(ctx, a.Proc, addr, 20*time.Second); err != nil {
		a.Proc.Stop(time.Second)
		return nil, err
	}
	return a, nil
}

func (a *Agent) onLine(s string) {
	var l AgentLine
	if json.Unmarshal([]byte(s), &l) != nil || l.Msg == "" {
		return
	}
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
func (a *Agent) Lines() []AgentLine {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]AgentLine(nil), a.lines...)
}

// Subscribe returns the lines logged from now on (buffered; a slow reader loses
// lines here, never in Lines) and a function that ends the subscription.
func (a *Agent) Subscribe() (<-chan AgentLine, func()) {
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

// Stop ends the agent.
func (a *Agent) Stop() { a.Proc.Stop(10 * time.Second) }

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
