package bench

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/amf-edge/amf/podsignal"

	"github.com/amf-edge/amf/lab/proc"
	"github.com/amf-edge/amf/lab/scrape"
)

// AgentLoadConfig configures the agent load benchmark.
type AgentLoadConfig struct {
	Sidecars int           // simulated sidecars; 110 is kubelet's default pod limit per node
	Period   time.Duration // each publishes one signal per period
	Duration time.Duration
	Bin      Binaries
	WorkDir  string
	Progress io.Writer
}

// AgentLoadReport is what the agent load benchmark measured.
type AgentLoadReport struct {
	Sidecars   int
	Messages   int64
	AgentCPU   float64 // share of one core
	AgentRSS   int64
	IntakeP99  time.Duration // upper bound of the histogram bucket holding the p99
	IntakeMean time.Duration
}

// RunAgentLoad starts a real agent process and drives it with simulated sidecars:
// real MQTT clients, each authenticated with its own token, publishing valid
// signals (alternating healthy and anomalous, so every message is a transition).
func RunAgentLoad(ctx context.Context, cfg AgentLoadConfig) (*AgentLoadReport, error) {
	if cfg.Sidecars <= 0 {
		cfg.Sidecars = 110
	}
	if cfg.Period <= 0 {
		cfg.Period = time.Second
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 30 * time.Second
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	ta, err := startTokenAgent(ctx, cfg.Bin.Agent, cfg.WorkDir, "load", cfg.Sidecars)
	if err != nil {
		return nil, err
	}
	defer ta.proc.Stop(3 * time.Second)
	agent, mqttAddr, httpAddr, tokens := ta.proc, ta.mqttAddr, ta.httpAddr, ta.tokens

	clients := make([]mqtt.Client, cfg.Sidecars)
	defer func() {
		for _, c := range clients {
			if c != nil {
				c.Disconnect(100)
			}
		}
	}()
	for i := range clients {
		opts := mqtt.NewClientOptions().AddBroker("tcp://" + mqttAddr).
			SetClientID(fmt.Sprintf("load/sidecar-%d/sim", i)).SetUsername(fmt.Sprintf("load/sidecar-%d", i)).
			SetPassword(tokens[i]).SetProtocolVersion(4).SetAutoReconnect(false).SetKeepAlive(30 * time.Second)
		c := mqtt.NewClient(opts)
		if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			return nil, fmt.Errorf("simulated sidecar %d cannot connect: %v", i, tok.Error())
		}
		clients[i] = c
	}
	fmt.Fprintf(cfg.Progress, "%d simulated sidecars connected; publishing every %v for %v\n", cfg.Sidecars, cfg.Period, cfg.Duration)

	cpu0, _, err := proc.Usage(agent.PID())
	if err != nil {
		return nil, err
	}
	start := time.Now()
	var sent atomic.Int64
	var wg sync.WaitGroup
	lctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	for i, c := range clients {
		wg.Go(func() {
			// Spread the sidecars over the period, as independent pods are.
			offset := cfg.Period * time.Duration(i) / time.Duration(len(clients))
			select {
			case <-lctx.Done():
				return
			case <-time.After(offset):
			}
			tick := time.NewTicker(cfg.Period)
			defer tick.Stop()
			topic := podsignal.Topic("load", fmt.Sprintf("sidecar-%d", i))
			for seq := uint64(1); ; seq++ {
				st := podsignal.Healthy
				p := 0.1
				if seq%2 == 0 {
					st, p = podsignal.Anomalous, 0.9
				}
				msg := podsignal.Message{Version: podsignal.Version, Namespace: "load", Pod: fmt.Sprintf("sidecar-%d", i),
					State: st, Probability: &p, Seq: seq, Time: time.Now()}
				payload, err := podsignal.Encode(&msg)
				if err == nil {
					c.Publish(topic, 1, true, payload).WaitTimeout(time.Second)
					sent.Add(1)
				}
				select {
				case <-lctx.Done():
					return
				case <-tick.C:
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu1, rss, err := proc.Usage(agent.PID())
	if err != nil {
		return nil, err
	}
	rep := &AgentLoadReport{Sidecars: cfg.Sidecars, Messages: sent.Load(), AgentCPU: float64(cpu1-cpu0) / float64(elapsed), AgentRSS: rss}
	if err := intakeLatency(ctx, "http://"+httpAddr+"/metrics", rep); err != nil {
		return nil, err
	}
	return rep, nil
}

// tokenAgent is a real amf-agent process with a static token for each of
// pods pods, named <namespace>/sidecar-<i>, listening on free loopback ports.
type tokenAgent struct {
	proc               *proc.Proc
	mqttAddr, httpAddr string
	tokens             []string // tokens[i] is <namespace>/sidecar-<i>'s
}

// startTokenAgent writes the token file into workDir and starts the agent
// observe-only; the caller stops it.
func startTokenAgent(ctx context.Context, bin, workDir, namespace string, pods int) (*tokenAgent, error) {
	a := &tokenAgent{tokens: make([]string, pods)}
	var lines strings.Builder
	for i := range a.tokens {
		b := make([]byte, 24)
		if _, err := crand.Read(b); err != nil {
			return nil, err
		}
		a.tokens[i] = hex.EncodeToString(b)
		fmt.Fprintf(&lines, "%s %s/sidecar-%d\n", a.tokens[i], namespace, i)
	}
	tokenFile := filepath.Join(workDir, "tokens")
	if err := os.WriteFile(tokenFile, []byte(lines.String()), 0o600); err != nil {
		return nil, err
	}
	var err error
	if a.mqttAddr, err = proc.FreeAddr(); err != nil {
		return nil, err
	}
	if a.httpAddr, err = proc.FreeAddr(); err != nil {
		return nil, err
	}
	a.proc, err = proc.Start("amf-agent", filepath.Join(workDir, "agent.log"), nil, bin,
		"--listen", a.mqttAddr, "--http", a.httpAddr, "--token-file", tokenFile, "--observe-only", "--log-level", "warn")
	if err != nil {
		return nil, err
	}
	if err := proc.WaitListening(ctx, a.proc, a.mqttAddr, 10*time.Second); err != nil {
		a.proc.Stop(3 * time.Second)
		return nil, err
	}
	return a, nil
}

// intakeLatency reads the agent's decode+ACL+state-update histogram.
func intakeLatency(ctx context.Context, url string, rep *AgentLoadReport) error {
	families, err := scrape.Families(ctx, url)
	if err != nil {
		return fmt.Errorf("agent metrics: %w", err)
	}
	fam, ok := families["amf_agent_intake_seconds"]
	if !ok || len(fam.GetMetric()) == 0 {
		return fmt.Errorf("agent metrics: no amf_agent_intake_seconds")
	}
	h := fam.GetMetric()[0].GetHistogram()
	n := h.GetSampleCount()
	if n == 0 {
		return fmt.Errorf("agent metrics: no message went through intake")
	}
	rep.IntakeMean = time.Duration(h.GetSampleSum() / float64(n) * float64(time.Second))
	rep.IntakeP99 = time.Duration(math.MaxInt64) // beyond the last bucket
	for _, b := range h.GetBucket() {
		if float64(b.GetCumulativeCount()) >= 0.99*float64(n) {
			rep.IntakeP99 = time.Duration(b.GetUpperBound() * float64(time.Second))
			break
		}
	}
	return nil
}

// PrintAgentLoad writes the agent load result.
func PrintAgentLoad(w io.Writer, r *AgentLoadReport) {
	fmt.Fprintf(w, "\nagent load: %d sidecars, %d messages\n", r.Sidecars, r.Messages)
	fmt.Fprintf(w, "agent CPU %.2f %% of one core, RSS %.1f MiB\n", 100*r.AgentCPU, float64(r.AgentRSS)/(1<<20))
	fmt.Fprintf(w, "decode+ACL+state update: mean %v, p99 ≤ %v\n", r.IntakeMean.Round(time.Microsecond), r.IntakeP99)
}
