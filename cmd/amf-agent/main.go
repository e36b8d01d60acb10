// Command amf-agent is the AMF node agent: it embeds the node-local MQTT
// control-plane broker that the sidecars signal to, authenticates them
// (ServiceAccount tokens via TokenReview, or a static token file outside
// Kubernetes), enforces the per-pod ACL and keeps every pod's latest health
// state. See package agent for the rules. With --actuate it also acts on them
// (package actuate); --observe-only then logs the decisions without acting.
//
// Logs are JSON lines on stderr; one line with "msg":"transition" per change
// of a pod's state.
//
// Signals: SIGINT/SIGTERM stop it; SIGHUP reloads --token-file.
//
// `amf-agent inject` writes Deployments with the sidecar injected (see inject.go).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	authnv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/amf-edge/amf/actuate"
	"github.com/amf-edge/amf/agent"
	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/detect"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/internal/exitcode"
	"github.com/amf-edge/amf/nodewatch"
)

func main() {
	os.Exit(mainCode(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// parseErr is a FlagSet's Parse error as run returns it: flag.ErrHelp as it
// is (the usage was printed, exit 0), any other a usage error.
func parseErr(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return exitcode.UsageErr(err)
}

// mainCode runs the agent or inject and returns the exit status, as package
// exitcode says: 0 done (-h included), 2 a wrong command line or input, 1 a
// failure while running.
func mainCode(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var err error
	if len(args) > 0 && args[0] == "inject" {
		err = runInject(args[1:], stdin, stdout, stderr)
	} else {
		err = run(args, stderr)
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(stderr, "amf-agent:", err)
	}
	return exitcode.Of(err)
}

func run(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("amf-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		listen       = fs.String("listen", agent.DefaultMQTTAddr, "control-plane MQTT `address`; in a pod use 0.0.0.0:1884 behind the DaemonSet's hostPort")
		httpAddr     = fs.String("http", agent.DefaultHTTPAddr, "`address` of /metrics and /healthz")
		tokenFile    = fs.String("token-file", "", "static token `file` (lines \"<token> <namespace>/<pod>\", mode 0600) instead of Kubernetes TokenReview")
		kubeconfig   = fs.String("kubeconfig", "", "kubeconfig `path` for TokenReview; empty: in-cluster configuration")
		audience     = fs.String("audience", contract.Audience, "audience the sidecars' ServiceAccount tokens must carry")
		nodeName     = fs.String("node-name", "", "with TokenReview, accept only pods on this `node` (the DaemonSet passes spec.nodeName)")
		observeOnly  = fs.Bool("observe-only", false, "never act on the cluster: with --actuate, log every decision it would take (\"msg\":\"decision\", \"dry_run\":true) and write nothing")
		actuation    = fs.Bool("actuate", false, "act on confirmed anomalies and crashes: make-before-break switchover and failover of Deployments carrying amf.io/standby (package actuate); needs the Kubernetes API")
		resume       = fs.Bool("resume-on-start", false, "with --actuate, list the Deployments once at start and resume every switchover recorded in progress, also one whose primary no longer signals (already scaled to 0), and adopt every cold standby left scaled up with nothing recorded (kept for the abort delay, then scaled back). Trade-off: needs list on deployments (actuate.RulesWithResume), i.e. reading every Deployment's spec in scope; without it a switchover resumes on the next signal of the primary or of the standby naming it in amf.io/primary (as inject --standby writes it)")
		logLevel     = fs.String("log-level", "info", "log `level`: debug, info, warn or error")
		maxClients   = fs.Int("max-clients", 256, "most authenticated MQTT sessions at once, one per pod (a pod's new session replaces its old one); connections not yet authenticated never take these")
		maxPending   = fs.Int("max-pending", 256, "most MQTT connections not yet authenticated, all sources together; when full, a newcomer evicts an idle one from the source holding the most")
		perSource    = fs.Int("max-pending-per-source", 8, "most MQTT connections not yet authenticated from one source address")
		connTimeout  = fs.Duration("connect-timeout", 3*time.Second, "how long a new MQTT connection has to send CONNECT")
		maxKeepalive = fs.Duration("max-keepalive", 60*time.Second, "longest MQTT keepalive a sidecar may use")
		nodeMode     = fs.Bool("node-mode", false, "node mode: also run the detection pipeline for every pod of --node-name whose Deployment carries amf.io/mode=node (package nodewatch); needs the Kubernetes API, list/watch on pods and list on deployments (manifests/overlays/node-mode), the host's cgroup tree and, for pushed exits and network counters, its PID namespace")
		hostCgroup   = fs.String("host-cgroup-root", "", "with --node-mode: where the host's /sys/fs/cgroup is mounted (default /sys/fs/cgroup; manifests/overlays/node-mode mounts it at /host/sys/fs/cgroup)")
		kubeletRoot  = fs.String("kubelet-cgroup-root", "", "with --node-mode: the kubelet's cgroup root (its --cgroup-root, e.g. /kubelet as kind sets it); default: found at /kubepods or by a bounded search")
		interval     = fs.Duration("interval", time.Second, "with --node-mode: time between samples of each pod (at most the model's sample_interval, 5s for p1)")
		live         = addLivenessFlags(fs)
	)
	if err := fs.Parse(args); err != nil {
		return parseErr(err)
	}
	if fs.NArg() > 0 {
		return exitcode.Usagef("unexpected arguments %q", fs.Args())
	}
	if err := live.check(*actuation, *nodeName); err != nil {
		return exitcode.UsageErr(err)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return exitcode.Usagef("--log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	// client-go logs through klog (throttling, retries); keep those lines JSON too.
	klog.SetSlogLogger(log.With("component", "client-go"))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	var (
		auth    agent.Authenticator
		kubeCfg *rest.Config
	)
	switch {
	case *nodeMode && *tokenFile != "":
		return exitcode.UsageErr(errors.New("--node-mode needs the Kubernetes API (--kubeconfig or in-cluster), not --token-file"))
	case *nodeMode && *nodeName == "":
		return exitcode.UsageErr(errors.New("--node-mode needs --node-name (the DaemonSet passes spec.nodeName): the agent watches only its own node's pods"))
	case !*nodeMode && (*hostCgroup != "" || *kubeletRoot != ""):
		return exitcode.UsageErr(errors.New("--host-cgroup-root and --kubelet-cgroup-root are for --node-mode"))
	case *resume && !*actuation:
		return exitcode.UsageErr(errors.New("--resume-on-start needs --actuate"))
	case *actuation && *tokenFile != "":
		return exitcode.UsageErr(errors.New("--actuate needs the Kubernetes API (--kubeconfig or in-cluster), not --token-file"))
	case *tokenFile != "" && (*kubeconfig != "" || *nodeName != ""):
		return exitcode.UsageErr(errors.New("--token-file excludes --kubeconfig and --node-name (TokenReview options)"))
	case *tokenFile != "":
		tokens, err := agent.LoadStaticTokens(*tokenFile)
		if err != nil {
			return err
		}
		log.Info("static token file loaded", slog.String("path", *tokenFile), slog.Int("tokens", tokens.Len()))
		go reloadOnHangup(ctx, tokens, *tokenFile, log)
		auth = tokens
	default:
		cfg, err := restConfig(*kubeconfig)
		if err != nil {
			return err
		}
		// Many sidecars reconnect at once when the agent restarts; client-go's
		// default of 5 requests/s would admit 110 of them in 22 s.
		cfg.QPS, cfg.Burst = 50, 100
		client, err := authnv1client.NewForConfig(cfg)
		if err != nil {
			return fmt.Errorf("TokenReview client: %w", err)
		}
		auth = agent.NewTokenReviewAuthenticator(client.TokenReviews(), agent.TokenReviewOptions{Audience: *audience, NodeName: *nodeName})
		log.Info("authenticating with TokenReview", slog.String("api_server", cfg.Host), slog.String("audience", *audience), slog.String("node", *nodeName))
		kubeCfg = cfg
	}

	a, err := agent.New(agent.Config{
		MQTTAddr:      *listen,
		HTTPAddr:      *httpAddr,
		Authenticator: auth,
		Logger:        log,
		ObserveOnly:   *observeOnly,
		MaxClients:    *maxClients,
		MaxPending:    *maxPending,
		MaxKeepalive:  *maxKeepalive,

		MaxPendingPerSource: *perSource,
		ConnectTimeout:      *connTimeout,
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waitWatch := func() error { return nil }
	if *nodeMode {
		if waitWatch, err = startNodeMode(ctx, kubeCfg, a, nodewatchFlags{node: *nodeName, cgroupRoot: *hostCgroup, kubeletRoot: *kubeletRoot, interval: *interval}, log); err != nil {
			return err
		}
	}
	if !*actuation {
		err := a.Run(ctx)
		cancel()
		if werr := waitWatch(); werr != nil && err == nil {
			err = werr
		}
		return err
	}
	cs, err := kubernetes.NewForConfig(kubeCfg)
	if err != nil {
		return fmt.Errorf("actuation client: %w", err)
	}
	var nl *nodeLiveness
	if live.on {
		if nl, err = listenLiveness(live, cs, *nodeName, log.With("component", "liveness"), a.MetricsRegisterer()); err != nil {
			return err
		}
	}
	acfg := actuate.Config{Client: cs, Logger: log.With("component", "actuate"), DryRun: *observeOnly, Instance: *nodeName, ResumeOnStart: *resume, Registerer: a.MetricsRegisterer()}
	nl.configure(&acfg, *nodeName, a.Command)
	act, err := actuate.New(acfg)
	if err != nil {
		return err
	}
	log.Info("actuation on", slog.Bool("dry_run", *observeOnly), slog.Bool("resume_on_start", *resume))
	wait := agent.StartActuation(ctx, a.Tracker(), act)
	waitLiveness := nl.start(ctx, act)
	err = a.Run(ctx)
	cancel()
	if aerr := wait(); aerr != nil && err == nil {
		err = aerr
	}
	if lerr := waitLiveness(); lerr != nil && err == nil {
		err = lerr
	}
	if werr := waitWatch(); werr != nil && err == nil {
		err = werr
	}
	return err
}

// nodewatchFlags are --node-mode's settings.
type nodewatchFlags struct {
	node, cgroupRoot, kubeletRoot string
	interval                      time.Duration
}

// startNodeMode starts the node-mode watcher (package nodewatch) feeding
// a's tracker; wait returns once it stopped (after ctx ends).
func startNodeMode(ctx context.Context, cfg *rest.Config, a *agent.Agent, f nodewatchFlags, log *slog.Logger) (wait func() error, err error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("node mode client: %w", err)
	}
	md, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("node mode metadata client: %w", err)
	}
	m, err := model.Default()
	if err == nil {
		_, err = detect.FeatureConfig(m, f.interval)
	}
	if err != nil {
		return nil, fmt.Errorf("--interval: %w", err)
	}
	var opts []cgroup.Option
	if f.cgroupRoot != "" {
		opts = append(opts, cgroup.WithCgroupRoot(f.cgroupRoot))
	}
	if f.kubeletRoot != "" {
		opts = append(opts, cgroup.WithKubeletCgroupRoot(f.kubeletRoot))
	}
	w, err := nodewatch.New(nodewatch.Config{
		Client: cs, Metadata: md, NodeName: f.node, Interval: f.interval, Cgroup: opts,
		Log: log.With("component", "nodewatch"),
		Begin: func(id agent.Identity) nodewatch.Session {
			if s := a.Tracker().BeginLocal(id); s != nil {
				return s
			}
			return nil // not a nil *LocalSession in an interface
		},
	})
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	log.Info("node mode on", slog.String("node", f.node), slog.String("interval", f.interval.String()))
	return func() error { return <-done }, nil
}

// restConfig loads a kubeconfig, or the in-cluster configuration when path is empty.
func restConfig(path string) (*rest.Config, error) {
	if path != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig: %w", err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("not in a pod (%w): give --kubeconfig, or --token-file outside Kubernetes", err)
	}
	return cfg, nil
}

// reloadOnHangup re-reads the token file on each SIGHUP until ctx ends.
func reloadOnHangup(ctx context.Context, tokens *agent.StaticTokens, path string, log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if err := tokens.Reload(); err != nil {
				log.Error("token file not reloaded; the previous tokens stay in force", slog.String("path", path), slog.String("error", err.Error()))
				continue
			}
			log.Info("static token file reloaded", slog.String("path", path), slog.Int("tokens", tokens.Len()))
		}
	}
}
