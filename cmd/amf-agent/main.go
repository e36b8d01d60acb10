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
// Exit status (package exitcode): 2 for a wrong command line, flags that do
// not go together (options.validate) or a value a package refuses (each
// package Config's Validate, which run calls before anything listens or
// connects); 1 for a failure while running.
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
	"github.com/amf-edge/amf/internal/exitcode"
	"github.com/amf-edge/amf/liveness"
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

// run is the agent: the options are checked (options.validate), then every
// package's Config is built from them and checked by its Validate, so that
// a bad value is a usage error before anything listens or connects; then
// the parts start, and run waits for them once the broker stops.
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

	auth, err := chooseAuthenticator(o, log)
	if err != nil {
		return err
	}
	acfg := o.agentConfig(auth.Authenticator, log)
	if err := acfg.Validate(); err != nil {
		return exitcode.UsageErr(err)
	}
	a, err := agent.New(acfg) // binds nothing yet
	if err != nil {
		return err
	}
	p, err := configure(o, auth, a, log)
	if err != nil {
		return err
	}
	if err := p.validate(); err != nil {
		return exitcode.UsageErr(err)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if auth.tokens != nil {
		go reloadOnHangup(ctx, auth.tokens, o.tokenFile, log)
	}
	waits, err := p.start(ctx, a, log)
	if err != nil {
		return err
	}
	err = a.Run(ctx)
	cancel()
	return waitAll(err, waits)
}

// authenticator is how the agent proves the sidecars' identities: a static
// token file, or TokenReview on the Kubernetes API whose configuration the
// agent's other clients share.
type authenticator struct {
	agent.Authenticator
	tokens  *agent.StaticTokens // with --token-file, reloaded on SIGHUP
	kubeCfg *rest.Config        // without it
}

// chooseAuthenticator loads --token-file, or sets up TokenReview.
func chooseAuthenticator(o *options, log *slog.Logger) (authenticator, error) {
	if o.tokenFile != "" {
		tokens, err := agent.LoadStaticTokens(o.tokenFile)
		if err != nil {
			return authenticator{}, err
		}
		log.Info("static token file loaded", slog.String("path", o.tokenFile), slog.Int("tokens", tokens.Len()))
		return authenticator{Authenticator: tokens, tokens: tokens}, nil
	}
	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return authenticator{}, err
	}
	// Many sidecars reconnect at once when the agent restarts; client-go's
	// default of 5 requests/s would admit 110 of them in 22 s.
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return authenticator{}, fmt.Errorf("TokenReview client: %w", err)
	}
	auth := agent.NewTokenReviewAuthenticator(cluster.NewKube(client), agent.TokenReviewOptions{Audience: o.audience, NodeName: o.nodeName})
	log.Info("authenticating with TokenReview", slog.String("api_server", cfg.Host), slog.String("audience", o.audience), slog.String("node", o.nodeName))
	return authenticator{Authenticator: auth, kubeCfg: cfg}, nil
}

// agentConfig is the control plane's configuration (package agent).
func (o *options) agentConfig(auth agent.Authenticator, log *slog.Logger) agent.Config {
	return agent.Config{
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
	}
}

// parts are what the agent runs beside its broker, each as its flags ask:
// configured by configure and checked by validate before any starts.
type parts struct {
	kubeCfg        *rest.Config
	connkillSocket string            // "": no connkill watch
	node           *nodewatch.Config // nil without --node-mode
	act            *actuation        // nil without --actuate
}

// configure builds the configuration of every part the options ask for;
// a is the control plane they feed and act for. Nothing is started.
func configure(o *options, auth authenticator, a *agent.Server, log *slog.Logger) (*parts, error) {
	p := &parts{kubeCfg: auth.kubeCfg, connkillSocket: o.connkillSocket}
	var err error
	if o.nodeMode {
		if p.node, err = nodewatchConfig(auth.kubeCfg, a, o, log.With("component", "nodewatch")); err != nil {
			return nil, err
		}
	}
	if o.actuation {
		if p.act, err = configureActuation(o, auth, a, log); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// validate checks each part's configuration with its package's Validate.
func (p *parts) validate() error {
	if p.node != nil {
		if err := p.node.Validate(); err != nil {
			return err
		}
	}
	if p.act != nil {
		return p.act.validate()
	}
	return nil
}

// start starts the parts: the connkill watch, node mode, then actuation.
// waits return once each has stopped (after ctx ends), in the order their
// errors count (waitAll).
func (p *parts) start(ctx context.Context, a *agent.Server, log *slog.Logger) (waits []func() error, err error) {
	waitConnkill, waitNode := noWait, noWait
	if p.connkillSocket != "" {
		if waitConnkill, err = startConnkill(ctx, p.kubeCfg, p.connkillSocket, log.With("component", "connkill")); err != nil {
			return nil, err
		}
	}
	if p.node != nil {
		if waitNode, err = startNodeMode(ctx, *p.node, log); err != nil {
			return nil, err
		}
	}
	if p.act != nil {
		if waits, err = p.act.start(ctx, a, log); err != nil {
			return nil, err
		}
	}
	// The watches' errors count after the actuation's.
	return append(waits, func() error { return errors.Join(waitNode(), waitConnkill()) }), nil
}

// noWait is the wait of a part not started.
func noWait() error { return nil }

// waitAll waits for every part in order and returns err, else the first
// part's error: the first to say why the agent stopped.
func waitAll(err error, waits []func() error) error {
	for _, wait := range waits {
		if werr := wait(); werr != nil && err == nil {
			err = werr
		}
	}
	return err
}

// actuation is --actuate's part: the actuator, with --liveness the node-loss
// peer that works with it, and with --state-listen the state hub.
type actuation struct {
	cfg  actuate.Config
	live *liveness.PeerConfig // nil without --liveness
	hub  *stateHub            // nil without --state-listen
}

// configureActuation builds the actuator's configuration and its parts'.
func configureActuation(o *options, auth authenticator, a *agent.Server, log *slog.Logger) (*actuation, error) {
	cs, err := kubernetes.NewForConfig(auth.kubeCfg)
	if err != nil {
		return nil, fmt.Errorf("actuation client: %w", err)
	}
	ac := &actuation{cfg: actuate.Config{Client: cs, Logger: log.With("component", "actuate"), DryRun: o.observeOnly, Instance: o.nodeName,
		ResumeOnStart: o.resume, Registerer: a.MetricsRegisterer()}}
	if o.live.on {
		ac.live = o.live.config(cs, o.nodeName, log.With("component", "liveness"), a.MetricsRegisterer())
	}
	if o.nodeMode {
		ac.cfg.DeleteRetiredOn = o.nodeName
	}
	if o.stateListen != "" {
		if ac.hub, err = configureStateHub(o, auth, a.MetricsRegisterer(), log.With("component", "statehub")); err != nil {
			return nil, err
		}
	}
	return ac, nil
}

// validate checks the actuator's, the peer's and the hub's configurations.
func (ac *actuation) validate() error {
	if err := ac.cfg.Validate(); err != nil {
		return err
	}
	if ac.live != nil {
		if err := ac.live.Validate(); err != nil {
			return fmt.Errorf("--liveness: %w", err)
		}
	}
	if ac.hub != nil {
		return ac.hub.cfg.Validate()
	}
	return nil
}

// start binds the liveness probe address and the state hub, then starts the
// actuator on a's tracker and the liveness peer beside it. waits return
// once each has stopped (after ctx ends): the actuator's, the hub's, the
// peer's.
func (ac *actuation) start(ctx context.Context, a *agent.Server, log *slog.Logger) (waits []func() error, err error) {
	nl, err := listenLiveness(ac.live)
	if err != nil {
		return nil, err
	}
	waitState := noWait
	if ac.hub != nil {
		if waitState, err = ac.hub.serve(ctx, &ac.cfg); err != nil {
			return nil, err
		}
	}
	nl.configure(&ac.cfg, a.Command)
	act, err := actuate.New(ac.cfg)
	if err != nil {
		return nil, err
	}
	log.Info("actuation on", slog.Bool("dry_run", ac.cfg.DryRun), slog.Bool("resume_on_start", ac.cfg.ResumeOnStart))
	wait := agent.StartActuation(ctx, a.Tracker(), act)
	return []func() error{wait, waitState, nl.start(ctx, act)}, nil
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

// nodewatchConfig is --node-mode's watcher (package nodewatch) of the pods
// of --node-name, feeding a's tracker.
func nodewatchConfig(cfg *rest.Config, a *agent.Server, o *options, log *slog.Logger) (*nodewatch.Config, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("node mode client: %w", err)
	}
	md, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("node mode metadata client: %w", err)
	}
	var opts []cgroup.Option
	if o.hostCgroup != "" {
		opts = append(opts, cgroup.WithCgroupRoot(o.hostCgroup))
	}
	if o.kubeletRoot != "" {
		opts = append(opts, cgroup.WithKubeletCgroupRoot(o.kubeletRoot))
	}
	return &nodewatch.Config{
		Client: cs, Metadata: md, NodeName: o.nodeName, Interval: o.interval, Cgroup: opts, Log: log,
		Begin: func(id podsignal.PodID) nodewatch.Session {
			if s := a.Tracker().BeginLocal(id); s != nil {
				return s
			}
			return nil // not a nil *LocalSession in an interface
		},
	}, nil
}

// startNodeMode starts the node-mode watcher; wait returns once it stopped
// (after ctx ends).
func startNodeMode(ctx context.Context, cfg nodewatch.Config, log *slog.Logger) (wait func() error, err error) {
	w, err := nodewatch.New(cfg)
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	log.Info("node mode on", slog.String("node", cfg.NodeName), slog.String("interval", cfg.Interval.String()))
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
