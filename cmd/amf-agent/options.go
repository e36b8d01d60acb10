package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/amf-edge/amf/agent"
	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/detect"
	"github.com/amf-edge/amf/infer/model"
)

// options are amf-agent's flags; validate says whether they go together,
// before anything is started (node-problem-detector keeps its options the
// same way), so that run only wires.
type options struct {
	listen, httpAddr, tokenFile, kubeconfig, audience, nodeName, logLevel string
	observeOnly, actuation, resume, nodeMode                              bool
	maxClients, maxPending, perSource                                     int
	connTimeout, maxKeepalive, interval                                   time.Duration
	hostCgroup, kubeletRoot                                               string
	connkillSocket, stateListen, stateAdvertise, statePeerToken           string
	live                                                                  *livenessFlags
}

// addFlags registers the options on fs, with their defaults.
func addFlags(fs *flag.FlagSet) *options {
	o := &options{}
	fs.StringVar(&o.listen, "listen", agent.DefaultMQTTAddr, "control-plane MQTT `address`; in a pod use 0.0.0.0:1884 behind the DaemonSet's hostPort")
	fs.StringVar(&o.httpAddr, "http", agent.DefaultHTTPAddr, "`address` of /metrics and /healthz")
	fs.StringVar(&o.tokenFile, "token-file", "", "static token `file` (lines \"<token> <namespace>/<pod>\", mode 0600) instead of Kubernetes TokenReview")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig `path` for TokenReview; empty: in-cluster configuration")
	fs.StringVar(&o.audience, "audience", contract.Audience, "audience the sidecars' ServiceAccount tokens must carry")
	fs.StringVar(&o.nodeName, "node-name", "", "with TokenReview, accept only pods on this `node` (the DaemonSet passes spec.nodeName)")
	fs.BoolVar(&o.observeOnly, "observe-only", false, "never act on the cluster: with --actuate, log every decision it would take (\"msg\":\"decision\", \"dry_run\":true) and write nothing")
	fs.BoolVar(&o.actuation, "actuate", false, "act on confirmed anomalies and crashes: make-before-break switchover and failover of Deployments carrying amf.io/standby (package actuate); needs the Kubernetes API")
	fs.BoolVar(&o.resume, "resume-on-start", false, "with --actuate, list the Deployments once at start and resume every switchover recorded in progress, also one whose primary no longer signals (already scaled to 0), and adopt every cold standby left scaled up with nothing recorded (kept for the abort delay, then scaled back). Trade-off: needs list on deployments (actuate.RulesWithResume), i.e. reading every Deployment's spec in scope; without it a switchover resumes on the next signal of the primary or of the standby naming it in amf.io/primary (as inject --standby writes it)")
	fs.StringVar(&o.logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.IntVar(&o.maxClients, "max-clients", 256, "most authenticated MQTT sessions at once, one per pod (a pod's new session replaces its old one); connections not yet authenticated never take these")
	fs.IntVar(&o.maxPending, "max-pending", 256, "most MQTT connections not yet authenticated, all sources together; when full, a newcomer evicts an idle one from the source holding the most")
	fs.IntVar(&o.perSource, "max-pending-per-source", 8, "most MQTT connections not yet authenticated from one source address")
	fs.DurationVar(&o.connTimeout, "connect-timeout", 3*time.Second, "how long a new MQTT connection has to send CONNECT")
	fs.DurationVar(&o.maxKeepalive, "max-keepalive", 60*time.Second, "longest MQTT keepalive a sidecar may use")
	fs.BoolVar(&o.nodeMode, "node-mode", false, "node mode: also run the detection pipeline for every pod of --node-name whose Deployment carries amf.io/mode=node (package nodewatch); needs the Kubernetes API, list/watch on pods and list on deployments (manifests/overlays/node-mode), the host's cgroup tree and, for pushed exits and network counters, its PID namespace")
	fs.StringVar(&o.hostCgroup, "host-cgroup-root", "", "with --node-mode: where the host's /sys/fs/cgroup is mounted (default /sys/fs/cgroup; manifests/overlays/node-mode mounts it at /host/sys/fs/cgroup)")
	fs.StringVar(&o.kubeletRoot, "kubelet-cgroup-root", "", "with --node-mode: the kubelet's cgroup root (its --cgroup-root, e.g. /kubelet as kind sets it); default: found at /kubepods or by a bounded search")
	fs.DurationVar(&o.interval, "interval", time.Second, "with --node-mode: time between samples of each pod (at most the model's sample_interval, 5s for p1)")
	fs.StringVar(&o.connkillSocket, "connkill-socket", "", "the `socket` of amf-agent connkill beside this agent: when an endpoint of a managed broker turns terminating (a failover or a switchover retired its pod), end this node's connections to it at once, so its clients reconnect to the new primary now (package connkill); needs the Kubernetes API, list/watch on endpointslices")
	fs.StringVar(&o.stateListen, "state-listen", "", "with --actuate: `address` of the state hub, where the sidecars of stateful pairs (inject --state-dir) hand in their broker's final state and fetch one handed to them (package statehub); in a pod use 0.0.0.0:1886 behind the DaemonSet's hostPort. Empty: no state is carried, and a stateful pair's switchover says so in an Event")
	fs.StringVar(&o.stateAdvertise, "state-advertise", "", "with --state-listen and --state-peer-token: `host:port` at which the agents of other nodes reach this node's state hub (the DaemonSet: $(HOST_IP):1886, the hostPort), written on the standby of a stateful pair whose pod runs here, so that its primary's agent relays the primary's states here (a pair across two nodes)")
	fs.StringVar(&o.statePeerToken, "state-peer-token", "", "with --state-advertise: the `file` of this agent's projected ServiceAccount token for audience "+contract.StatePeerAudience+" (the DaemonSet mounts one), shown to other nodes' state hubs when relaying a state, and the account a relay to this hub must come from (checked by TokenReview). Empty: a stateful pair across two nodes carries no state, and says so in an Event")
	o.live = addLivenessFlags(fs)
	return o
}

// validate says what is wrong with the options, if anything, and returns
// the log level they give. Here is only what the command line combines;
// the values of each package's settings are checked by that package's
// Config.Validate (agent, actuate, nodewatch, liveness, statehub), which
// run calls before it starts anything.
func (o *options) validate() (slog.Level, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return 0, fmt.Errorf("--log-level: %w", err)
	}
	if err := o.live.check(o.actuation, o.nodeName); err != nil {
		return 0, err
	}
	switch {
	case o.nodeMode && o.tokenFile != "":
		return 0, errors.New("--node-mode needs the Kubernetes API (--kubeconfig or in-cluster), not --token-file")
	case o.nodeMode && o.nodeName == "":
		return 0, errors.New("--node-mode needs --node-name (the DaemonSet passes spec.nodeName): the agent watches only its own node's pods")
	case !o.nodeMode && (o.hostCgroup != "" || o.kubeletRoot != ""):
		return 0, errors.New("--host-cgroup-root and --kubelet-cgroup-root are for --node-mode")
	case o.resume && !o.actuation:
		return 0, errors.New("--resume-on-start needs --actuate")
	case o.stateListen != "" && !o.actuation:
		return 0, errors.New("--state-listen needs --actuate: the hub relays a state at a switchover, which only actuation makes")
	case (o.stateAdvertise != "") != (o.statePeerToken != ""):
		return 0, errors.New("--state-advertise and --state-peer-token go together: a hub that others relay to must prove its peers, and an agent that relays must say where it is reached")
	case o.stateAdvertise != "" && o.stateListen == "":
		return 0, errors.New("--state-advertise needs --state-listen: it is the address of that hub as other nodes reach it")
	case o.stateAdvertise != "" && !validHostPort(o.stateAdvertise):
		return 0, fmt.Errorf("--state-advertise %q: want host:port, e.g. 10.0.0.5:1886", o.stateAdvertise)
	case o.stateAdvertise != "" && o.nodeName == "":
		return 0, errors.New("--state-advertise needs --node-name: a relay goes to the standby's node, which the agents name by node")
	case o.actuation && o.tokenFile != "":
		return 0, errors.New("--actuate needs the Kubernetes API (--kubeconfig or in-cluster), not --token-file")
	case o.connkillSocket != "" && o.tokenFile != "":
		return 0, errors.New("--connkill-socket needs the Kubernetes API (--kubeconfig or in-cluster), not --token-file: it watches the EndpointSlices")
	case o.tokenFile != "" && (o.kubeconfig != "" || o.nodeName != ""):
		return 0, errors.New("--token-file excludes --kubeconfig and --node-name (TokenReview options)")
	}
	if o.nodeMode {
		// Node mode samples every --interval with the model a pod names,
		// by default the default one: an interval it cannot run at would
		// leave every pod that names none unwatched.
		m, err := model.Default()
		if err == nil {
			_, err = detect.FeatureConfig(m, o.interval)
		}
		if err != nil {
			return 0, fmt.Errorf("--interval: %w", err)
		}
	}
	return level, nil
}

// validHostPort reports whether s is host:port with a host and a TCP port.
func validHostPort(s string) bool {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" {
		return false
	}
	n, err := strconv.Atoi(port)
	return err == nil && n > 0 && n < 65536
}
