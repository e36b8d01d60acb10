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
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/amf-edge/amf/actuate"
	"github.com/amf-edge/amf/agent"
	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/cluster"
	"github.com/amf-edge/amf/connkill"
	"github.com/amf-edge/amf/detect"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/internal/exitcode"
	"github.com/amf-edge/amf/nodewatch"
	"github.com/amf-edge/amf/podsignal"
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

// mainCode runs the agent, inject or connkill and returns the exit status, as package
// exitcode says: 0 done (-h included), 2 a wrong command line or input, 1 a
// failure while running.
func mainCode(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var err error
	switch {
	case len(args) > 0 && args[0] == "inject":
		err = runInject(args[1:], stdin, stdout, stderr)
	case len(args) > 0 && args[0] == "connkill":
		err = runConnkill(args[1:], stderr)
	default:
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
	o := addFlags(fs)
	if err := fs.Parse(args); err != nil {
		return parseErr(err)
	}
	if fs.NArg() > 0 {
		return exitcode.Usagef("unexpected arguments %q", fs.Args())
	}
	level, err := o.validate()
	if err != nil {
		return exitcode.UsageErr(err)
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
	if o.tokenFile != "" {
		tokens, err := agent.LoadStaticTokens(o.tokenFile)
		if err != nil {
			return err
		}
		log.Info("static token file loaded", slog.String("path", o.tokenFile), slog.Int("tokens", tokens.Len()))
		go reloadOnHangup(ctx, tokens, o.tokenFile, log)
		auth = tokens
	} else {
		cfg, err := restConfig(o.kubeconfig)
		if err != nil {
			return err
		}
		// Many sidecars reconnect at once when the agent restarts; client-go's
		// default of 5 requests/s would admit 110 of them in 22 s.
		cfg.QPS, cfg.Burst = 50, 100
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return fmt.Errorf("TokenReview client: %w", err)
		}
		auth = agent.NewTokenReviewAuthenticator(cluster.NewKube(client), agent.TokenReviewOptions{Audience: o.audience, NodeName: o.nodeName})
		log.Info("authenticating with TokenReview", slog.String("api_server", cfg.Host), slog.String("audience", o.audience), slog.String("node", o.nodeName))
		kubeCfg = cfg
	}

	a, err := agent.New(agent.Config{
		MQTTAddr:      o.listen,
		HTTPAddr:      o.httpAddr,
		Authenticator: auth,
		Logger:        log,
		ObserveOnly:   o.observeOnly,
		MaxClients:    o.maxClients,
		MaxPending:    o.maxPending,
		MaxKeepalive:  o.maxKeepalive,

		MaxPendingPerSource: o.perSource,
		ConnectTimeout:      o.connTimeout,
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waitWatch := func() error { return nil }
	if o.connkillSocket != "" {
		if waitWatch, err = startConnkill(ctx, kubeCfg, o.connkillSocket, log.With("component", "connkill")); err != nil {
			return err
		}
	}
	if o.nodeMode {
		waitConnkill := waitWatch
		waitNode, err := startNodeMode(ctx, kubeCfg, a, nodewatchFlags{node: o.nodeName, cgroupRoot: o.hostCgroup, kubeletRoot: o.kubeletRoot, interval: o.interval}, log)
		if err != nil {
			return err
		}
		waitWatch = func() error { return errors.Join(waitNode(), waitConnkill()) }
	}
	if !o.actuation {
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
	if o.live.on {
		if nl, err = listenLiveness(o.live, cs, o.nodeName, log.With("component", "liveness"), a.MetricsRegisterer()); err != nil {
			return err
		}
	}
	acfg := actuate.Config{Client: cs, Logger: log.With("component", "actuate"), DryRun: o.observeOnly, Instance: o.nodeName, ResumeOnStart: o.resume, Registerer: a.MetricsRegisterer()}
	waitState := func() error { return nil }
	if o.stateListen != "" {
		peers := stateHubPeers{advertise: o.stateAdvertise, tokenFile: o.statePeerToken}
		if o.statePeerToken != "" {
			reviews, err := kubernetes.NewForConfig(kubeCfg)
			if err != nil {
				return fmt.Errorf("TokenReview client: %w", err)
			}
			peers.reviews = cluster.NewKube(reviews)
		}
		if acfg.States, waitState, err = serveStateHub(ctx, o.stateListen, auth, peers, &acfg, a.MetricsRegisterer(), log.With("component", "statehub")); err != nil {
			return err
		}
	}
	nl.configure(&acfg, o.nodeName, a.Command)
	act, err := actuate.New(acfg)
	if err != nil {
		return err
	}
	log.Info("actuation on", slog.Bool("dry_run", o.observeOnly), slog.Bool("resume_on_start", o.resume))
	wait := agent.StartActuation(ctx, a.Tracker(), act)
	waitLiveness := nl.start(ctx, act)
	err = a.Run(ctx)
	cancel()
	if aerr := wait(); aerr != nil && err == nil {
		err = aerr
	}
	if serr := waitState(); serr != nil && err == nil {
		err = serr
	}
	if lerr := waitLiveness(); lerr != nil && err == nil {
		err = lerr
	}
	if werr := waitWatch(); werr != nil && err == nil {
		err = werr
	}
	return err
}

// startConnkill starts the EndpointSlice watch of --connkill-socket; wait
// returns once it stopped (after ctx ends).
func startConnkill(ctx context.Context, cfg *rest.Config, socket string, log *slog.Logger) (wait func() error, err error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("connkill client: %w", err)
	}
	w := &connkill.Watcher{Client: cs, Kill: connkill.Client{Socket: socket}.Kill, Log: log}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return func() error { return <-done }, nil
}

// nodewatchFlags are --node-mode's settings.
type nodewatchFlags struct {
	node, cgroupRoot, kubeletRoot string
	interval                      time.Duration
}

// startNodeMode starts the node-mode watcher (package nodewatch) feeding
// a's tracker; wait returns once it stopped (after ctx ends).
func startNodeMode(ctx context.Context, cfg *rest.Config, a *agent.Server, f nodewatchFlags, log *slog.Logger) (wait func() error, err error) {
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
		Begin: func(id podsignal.PodID) nodewatch.Session {
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
