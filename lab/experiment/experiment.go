package experiment

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/amf-edge/amf/lab/bench"
	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/testbed"
)

// Mode is what runs beside the broker.
type Mode string

// Modes; see the package comment.
const (
	Reactive Mode = "reactive"
	Observe  Mode = "observe"
	AMF      Mode = "amf"
	Healthy  Mode = "healthy"
	// AMFNode is amf in node mode: no sidecar, the agent (overlays/node-mode)
	// runs the pipeline for the annotated Deployments' pods.
	AMFNode Mode = "amf-node"
	// AMFResize is amf with a memory ceiling on the primary
	// (amf.io/memory-ceiling, Config.ResizeCeiling): the agent raises the
	// broker's limit in place before it would switch over.
	AMFResize Mode = "amf-resize"
	// AMFResizeLeak is amf-resize under a leak no ceiling absorbs (Leak
	// instead of the staged fault): the room a resize gives would be used up
	// before a switchover completes, so the agent switches over.
	AMFResizeLeak Mode = "amf-resize-leak"
	// AMFResizeNoRoom is amf-resize on a node without the room: a pod
	// requests all the node's memory but 20 Mi, so the kubelet answers
	// Deferred, the old size goes back and the agent switches over.
	AMFResizeNoRoom Mode = "amf-resize-noroom"
)

// resizes reports whether a mode runs with a memory ceiling.
func (m Mode) resizes() bool { return m == AMFResize || m == AMFResizeLeak || m == AMFResizeNoRoom }

// ParseMode checks a --mode value.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case Reactive, Observe, AMF, Healthy, AMFNode, AMFResize, AMFResizeLeak, AMFResizeNoRoom:
		return m, nil
	}
	return "", fmt.Errorf("unknown mode %q: use reactive, observe, amf, amf-node, amf-resize, amf-resize-leak, amf-resize-noroom or healthy", s)
}

// Config configures Run.
type Config struct {
	Modes []Mode // run in this order, sharing one control plane
	Runs  int    // runs per mode (healthy: one long run)
	// ReactiveRuns, if set, is the reactive mode's number of runs instead of Runs.
	ReactiveRuns int
	Fault        Fault // default PaperFault
	// Healthy is the length of a healthy run (default 30 min).
	Healthy time.Duration
	// Tail is how long a run goes on after its outage to measure it (default 30 s,
	// the paper's window per event).
	Tail   time.Duration
	Bridge testbed.Bridge // default testbed.DefaultBridge
	Out    string         // results folder (created)
	// Work holds the control plane's data and the processes' logs (default
	// <Out>/work).
	Work string
	Repo string // the repository (manifests/); default: found from the working directory
	Bin  bench.Binaries
	// Policy overrides of the agent's gates on the primary (annotations).
	Policy map[string]string
	// ResizeCeiling is amf.io/memory-ceiling in the amf-resize modes
	// (default 512Mi: the staged fault's 160 Mi fits, and the room it gives
	// outlasts a switchover to the cold standby at the fault's slope).
	ResizeCeiling string
	// Leak is the fault of amf-resize-leak (default LeakFault).
	Leak Leak
	// Model is the sidecars' --model (modes observe, amf, healthy): an
	// embedded model's name, or a model file path (copied with its manifest
	// where the pods can read it). Default: the paper's model, p1
	// (resolveModel says why).
	Model    string
	Log      *slog.Logger
	Progress io.Writer // one line per step for the person watching
}

func (c *Config) defaults() error {
	if len(c.Modes) == 0 {
		return errors.New("experiment: no mode")
	}
	if c.Runs <= 0 {
		c.Runs = 1
	}
	if c.Fault.Stress == 0 {
		c.Fault = PaperFault
	}
	if c.ResizeCeiling == "" {
		c.ResizeCeiling = "512Mi"
	}
	if c.Leak == (Leak{}) {
		c.Leak = LeakFault
	}
	if c.Healthy <= 0 {
		c.Healthy = 30 * time.Minute
	}
	if c.Tail <= 0 {
		c.Tail = 30 * time.Second
	}
	if c.Bridge == (testbed.Bridge{}) {
		c.Bridge = testbed.DefaultBridge
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Repo == "" {
		repo, err := testbed.RepoRoot()
		if err != nil {
			return err
		}
		c.Repo = repo
	}
	if c.Out == "" {
		return errors.New("experiment: no results folder")
	}
	if c.Bin.Mosquitto == "" {
		c.Bin.Mosquitto = testbed.MosquittoPath
	}
	for _, p := range []string{c.Bin.Sidecar, c.Bin.Agent, c.Bin.Self, c.Bin.Mosquitto} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("experiment: %w (make build; Mosquitto: apt-get install mosquitto)", err)
		}
	}
	return nil
}

// CanRun says what this machine lacks to run the experiment: a real node
// (root, containerd, runc, the CNI plugins, cgroup v1; kubenode.Check).
func CanRun() error { return kubenode.Check() }

// Run runs the experiment and writes its results (results.json, summary.md,
// plots) to cfg.Out. It returns the results even when a run failed (that run
// carries its error).
func Run(ctx context.Context, cfg Config) (*Results, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	sm, err := resolveModel(cfg.Model)
	if err != nil {
		return nil, err
	}
	if err := CanRun(); err != nil {
		return nil, fmt.Errorf("experiment: %w", err)
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, err
	}
	res := &Results{Started: time.Now().UTC(), Fault: cfg.Fault, Bridge: cfg.Bridge}
	if slices.ContainsFunc(cfg.Modes, Mode.resizes) {
		res.ResizeCeiling, res.Leak = cfg.ResizeCeiling, &cfg.Leak
	}
	if slices.ContainsFunc(cfg.Modes, Mode.stateful) {
		// Before the node starts: the plan's MQTT 5 session is Debian's client's.
		if _, err := brokerstate.MosquittoSub(); err != nil {
			return nil, fmt.Errorf("experiment: the amf mode seeds an MQTT 5 session: %w", err)
		}
		res.StatePlan = planText(statePlan)
	}
	env, err := setup(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	defer env.close()
	res.Node = NodeInfo{Name: env.node.Name, Kubelet: env.node.KubeletVersion, Runtime: env.node.RuntimeVersion}
	res.Node.Cgroup, res.Node.CgroupDriver = env.node.CgroupMode()
	if err := sm.stage(env.podDir); err != nil {
		return nil, err
	}
	env.model = sm
	for _, m := range cfg.Modes {
		runs, err := env.mode(ctx, m)
		res.Runs = append(res.Runs, runs...)
		if err != nil {
			res.Error = err.Error()
			env.keepState = true
			break
		}
	}
	res.Finished = time.Now().UTC()
	if err := res.write(cfg.Out); err != nil {
		return res, err
	}
	if res.Error != "" {
		return res, errors.New(res.Error)
	}
	return res, nil
}

func (e *env) progress(format string, args ...any) {
	fmt.Fprintf(e.cfg.Progress, "%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}
