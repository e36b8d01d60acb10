package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/detect"
	"github.com/amf-edge/amf/healthcheck"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/internal/exitcode"
	"github.com/amf-edge/amf/podsignal"
	"github.com/amf-edge/amf/sidecar"
	"github.com/amf-edge/amf/sidecar/handover"
	"github.com/amf-edge/amf/statehub"
)

// targetFlags are the three ways to name the broker container (DESIGN.md, "Finding
// the broker's cgroup from a sidecar").
type targetFlags struct {
	pid         int
	cgroupPath  string
	podUID      string
	containerID string
	container   string
	logDir      string
	podName     string
	namespace   string
	cgroupRoot  string
	kubeletRoot string
}

func (t *targetFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&t.pid, "pid", 0, "process mode: the broker's PID")
	fs.StringVar(&t.cgroupPath, "cgroup-path", "", "explicit cgroup directory of the broker")
	fs.StringVar(&t.podUID, "pod-uid", os.Getenv("POD_UID"), "pod mode: this pod's UID (downward API; env POD_UID)")
	fs.StringVar(&t.containerID, "container-id", "", "pod mode: the broker container's ID (a restarted container has a new one: prefer --container)")
	fs.StringVar(&t.container, "container", "", "pod mode: the broker container's name in the pod spec, looked up in --host-container-logs (default, or when those say nothing of this pod: the one container that is neither this sidecar nor the pause container)")
	fs.StringVar(&t.logDir, "host-container-logs", "", "pod mode: where the host's "+cgroup.ContainerLogDir+" (the kubelet's container log symlinks, which map container names to IDs) is mounted read-only")
	fs.StringVar(&t.cgroupRoot, "host-cgroup-root", "", "pod mode: where the host's /sys/fs/cgroup is mounted read-only (default /sys/fs/cgroup)")
	fs.StringVar(&t.kubeletRoot, "kubelet-cgroup-root", "", "pod mode: the kubelet's cgroup root (its --cgroup-root or cgroupRoot, e.g. /kubelet as kind sets it); default: found, at /kubepods, on this sidecar's own cgroup path, or by a bounded search for kubepods directories")
}

// open returns the source and, for pod mode, a way to find the container
// again (restarted, or not found yet). In pod mode a target that is not found
// is not an error: the sidecar starts, says why in its log and /status, and
// looks again at every sample, since a native sidecar starts before its
// broker. The error is then returned with find non-nil.
func (t *targetFlags) open() (detect.Source, func(context.Context) (detect.Source, error), error) {
	n := 0
	for _, set := range []bool{t.pid != 0, t.cgroupPath != "", t.podUID != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		return nil, nil, fmt.Errorf("give exactly one of --pid, --cgroup-path, --pod-uid (or POD_UID)")
	}
	if t.podUID == "" && (t.container != "" || t.containerID != "" || t.logDir != "" || t.kubeletRoot != "" || t.cgroupRoot != "") {
		return nil, nil, fmt.Errorf("--container, --container-id, --host-container-logs, --host-cgroup-root and --kubelet-cgroup-root are for pod mode (--pod-uid or POD_UID)")
	}
	if t.container != "" && t.containerID != "" {
		return nil, nil, fmt.Errorf("give at most one of --container and --container-id")
	}
	switch {
	case t.pid != 0:
		r, err := cgroup.ForPID(t.pid)
		return r, nil, err
	case t.cgroupPath != "":
		r, err := cgroup.Open(t.cgroupPath)
		return r, nil, err
	}
	// The pod's containers share one network namespace, so the sidecar's own
	// /proc/<pid>/net/dev counts the broker's traffic.
	opts := []cgroup.Option{cgroup.WithPID(os.Getpid())}
	if t.cgroupRoot != "" {
		opts = append(opts, cgroup.WithCgroupRoot(t.cgroupRoot))
	}
	if t.kubeletRoot != "" {
		opts = append(opts, cgroup.WithKubeletCgroupRoot(t.kubeletRoot))
	}
	q := cgroup.PodQuery{UID: t.podUID, ContainerID: t.containerID,
		Name: t.container, LogDir: t.logDir, PodName: t.podName, Namespace: t.namespace}
	find := func(context.Context) (detect.Source, error) { return cgroup.OpenPod(q, opts...) }
	r, err := find(context.Background())
	return r, find, err
}

// runFlags are amf-sidecar run's flags.
type runFlags struct {
	target    targetFlags
	windows   *windowFlags
	memoryRef *memoryReferenceFlag
	interval  time.Duration
	modelPath string
	httpAddr  string
	logLevel  string
	// The app-logic probe.
	probeMQTT, probeTCP         string
	probeInterval, probeTimeout time.Duration
	// The signals to the node agent.
	agent, tokenFile string
	keepAlive        time.Duration
	// The broker's state.
	stateFile, stateHub, stateProcess string
	stateEvery                        time.Duration
	stateRate                         int64
}

func registerRunFlags(fs *flag.FlagSet) *runFlags {
	f := &runFlags{}
	f.target.register(fs)
	fs.DurationVar(&f.interval, "interval", time.Second, intervalHelp)
	fs.StringVar(&f.modelPath, "model", "", modelHelp()+" to run on; the feature windows come from its manifest. An unusable one (unknown name, bad file, or a feature spec this build cannot compute at --interval) is refused, and the sidecar runs on the default model and says so")
	f.windows = registerWindowFlags(fs)
	fs.StringVar(&f.httpAddr, "http", healthcheck.DefaultAddr, "health endpoint address (/healthz /readyz /status /metrics, POST /signal from loopback); empty disables it")
	fs.StringVar(&f.probeMQTT, "probe-mqtt", "", "app-logic probe: MQTT broker beside the sidecar, e.g. tcp://127.0.0.1:1883")
	fs.StringVar(&f.probeTCP, "probe-tcp", "", "app-logic probe for non-MQTT apps: host:port to connect to")
	fs.DurationVar(&f.probeInterval, "probe-interval", healthcheck.DefaultInterval, "time between app-logic probes")
	fs.DurationVar(&f.probeTimeout, "probe-timeout", healthcheck.DefaultTimeout, "app-logic probe timeout")
	fs.StringVar(&f.agent, "agent", os.Getenv("AMF_AGENT"), "node agent's control-plane broker, e.g. tcp://$(NODE_IP):1884 (env AMF_AGENT); empty: no signals")
	fs.StringVar(&f.target.namespace, "namespace", os.Getenv("POD_NAMESPACE"), "this pod's namespace (env POD_NAMESPACE)")
	fs.StringVar(&f.target.podName, "pod", os.Getenv("POD_NAME"), "this pod's name (env POD_NAME)")
	fs.StringVar(&f.tokenFile, "token-file", "/var/run/secrets/amf/token", "projected ServiceAccount token (audience amf-agent), or a static token file")
	fs.DurationVar(&f.keepAlive, "keepalive", 5*time.Second, "MQTT keep-alive to the agent: bounds how long a frozen sidecar goes unnoticed")
	fs.StringVar(&f.stateFile, "state-file", "", "the broker's persistence file as this sidecar sees it (Mosquitto's persistence_location + persistence_file, on the data volume inject --state-dir mounts here): its final state is handed to the node agent, and a state the agent hands this pod is put in; empty: the broker's state is not carried")
	fs.StringVar(&f.stateHub, "state-hub", os.Getenv("AMF_STATE_HUB"), "the node agent's state hub, e.g. http://$(NODE_IP):1886 (env AMF_STATE_HUB); needed with --state-file")
	fs.DurationVar(&f.stateEvery, "state-snapshot-every", time.Second, "with --state-file: how often the broker writes its state (SIGUSR1) to be handed to the node agent when it changed, for a failover to restart the standby on (a crashed broker writes no final state); what it took in since is lost. Mosquitto writes its whole state each time. 0: none")
	fs.Int64Var(&f.stateRate, "state-snapshot-rate", 1<<20, "with --state-file: the most bytes a second the snapshots may write: after a state of n bytes the next waits n/rate seconds when that is longer than --state-snapshot-every (a 10 MiB state every 10 s at the default 1 MiB/s). 0: no bound")
	fs.StringVar(&f.stateProcess, "state-process", handover.DefaultComm, "with --state-file: the broker's process `name` in the pod's shared process namespace")
	f.memoryRef = registerMemoryReference(fs)
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	return f
}

// runRun is the sidecar: its configuration is built from the flags and
// checked by sidecar.Config.Validate, so that a bad value is a usage error
// before the health endpoint binds or the agent is dialled; then it runs.
func runRun(ctx context.Context, args []string, io stdio) int {
	fs := newFlagSet("run", io)
	f := registerRunFlags(fs)
	if err := fs.Parse(args); err != nil {
		return exitcode.ForParse(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(io.err, "amf-sidecar run: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		fmt.Fprintf(io.err, "amf-sidecar run: --log-level: %v\n", err)
		return exitUsage
	}
	log := slog.New(slog.NewJSONHandler(io.err, &slog.HandlerOptions{Level: level}))
	// First, so that whoever reads the log learns where to look before
	// anything can go wrong ("health endpoint serving" follows once bound).
	log.Info("sidecar starting", "http", f.httpAddr)

	cfg, err := f.config(log)
	if err == nil {
		err = exitcode.UsageErr(cfg.Validate())
	}
	if err != nil {
		fmt.Fprintf(io.err, "amf-sidecar run: %v\n", err)
		return exitcode.Of(err)
	}
	sc, err := sidecar.New(cfg)
	if err != nil {
		fmt.Fprintf(io.err, "amf-sidecar run: %v\n", err)
		return exitFail
	}
	started := []any{"target", sc.Status().Target, "model", cfg.Model.Source(), "interval", cfg.Interval}
	if cfg.TargetError != "" {
		started = append(started, "target_error", cfg.TargetError)
	}
	log.Info("sidecar started", started...)
	if err := sc.Run(ctx); err != nil {
		fmt.Fprintf(io.err, "amf-sidecar run: %v\n", err)
		return exitFail
	}
	return exitOK
}

// config builds the sidecar's configuration from the flags, in the order
// the checks were always made: the interval and the model first (what the
// model needs decides whether the command line works), then the target,
// the probe, the signaller and the state. An error marked
// exitcode.UsageErr is the command line's; any other a failure.
func (f *runFlags) config(log *slog.Logger) (sidecar.Config, error) {
	if f.interval <= 0 {
		return sidecar.Config{}, exitcode.Usagef("--interval must be positive")
	}
	m, warning, err := sidecar.ChooseModel(f.modelPath, f.interval)
	if err == nil {
		_, err = f.windows.forModel(m, f.interval)
	}
	if errors.Is(err, model.ErrFeatureSpec) || errors.Is(err, detect.ErrWindowGiven) {
		return sidecar.Config{}, exitcode.UsageErr(err)
	}
	if err != nil {
		return sidecar.Config{}, err
	}
	src, rediscover, openErr := f.target.open()
	targetErr := ""
	switch {
	case openErr != nil && rediscover == nil:
		return sidecar.Config{}, exitcode.Usagef("target: %w", openErr)
	case openErr != nil:
		targetErr = openErr.Error()
	}
	probe, err := f.probe()
	if err != nil {
		return sidecar.Config{}, err
	}
	pub, err := f.publisher(log)
	if err != nil {
		return sidecar.Config{}, err
	}
	state, err := f.state()
	if err != nil {
		return sidecar.Config{}, err
	}
	return sidecar.Config{
		Source: src, Rediscover: rediscover, TargetError: targetErr, MemoryReference: f.memoryRef.ref, Interval: f.interval,
		Model: m, ModelWarning: warning, Probe: probe, Publisher: pub,
		HTTPAddr: f.httpAddr, Log: log, State: state,
	}, nil
}

// probe is the app-logic probe of --probe-mqtt or --probe-tcp; nil: none.
func (f *runFlags) probe() (healthcheck.Prober, error) {
	var (
		probe healthcheck.Prober
		err   error
	)
	switch {
	case f.probeMQTT != "" && f.probeTCP != "":
		return nil, exitcode.Usagef("give at most one of --probe-mqtt and --probe-tcp")
	case f.probeMQTT != "":
		probe, err = healthcheck.NewMQTTProber(healthcheck.MQTTConfig{Broker: f.probeMQTT, Interval: f.probeInterval, Timeout: f.probeTimeout})
	case f.probeTCP != "":
		probe, err = healthcheck.NewTCPProber(healthcheck.TCPConfig{Address: f.probeTCP, Interval: f.probeInterval, Timeout: f.probeTimeout})
	}
	if err != nil {
		return nil, exitcode.Usagef("probe: %w", err)
	}
	return probe, nil
}

// publisher is the signaller to --agent; without one, nil (not a nil
// *Signaller), and the sidecar only serves its endpoint.
func (f *runFlags) publisher(log *slog.Logger) (sidecar.Publisher, error) {
	if f.agent == "" {
		log.Warn("no --agent given: health is served locally but not signalled to a node agent")
		return nil, nil
	}
	sig, err := sidecar.NewSignaller(sidecar.SignallerConfig{
		Broker: f.agent, Namespace: f.target.namespace, Pod: f.target.podName, TokenFile: f.tokenFile,
		KeepAlive: f.keepAlive, Log: log,
	})
	if err != nil {
		return nil, exitcode.UsageErr(err)
	}
	return sig, nil
}

// state is how the broker's state is carried (--state-file); nil: it is not.
func (f *runFlags) state() (*sidecar.StateConfig, error) {
	if f.stateFile == "" {
		return nil, nil
	}
	if err := statehub.CheckURL(f.stateHub); err != nil {
		return nil, exitcode.Usagef("--state-file needs --state-hub (or AMF_STATE_HUB): %w", err)
	}
	return &sidecar.StateConfig{
		Broker:        handover.Broker{File: f.stateFile, Comm: f.stateProcess},
		SnapshotEvery: f.stateEvery,
		SnapshotRate:  f.stateRate,
		Hub:           &statehub.Client{URL: f.stateHub, Pod: podsignal.PodID{Namespace: f.target.namespace, Pod: f.target.podName}, TokenFile: f.tokenFile},
	}, nil
}

// intervalHelp says why the sampling interval may be shorter than the model's
// training interval but not longer (model.Windows.CheckInterval).
const intervalHelp = "time between samples; with a model, at most its manifest's sample_interval (1s for the default model leadtime, 5s for p1). Faster is fine, hence the default: rate and deriv over fixed windows are defined at any finer sampling, and the agent's gates count samples, so they confirm sooner"
