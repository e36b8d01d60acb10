// Package experiment is `amf-lab experiment`: the paper's availability experiment
// on one machine. It starts the real control plane (lab/controlplane) and a real
// node (lab/kubenode: kubelet + containerd, the lab's images from lab/images),
// the RDS and OBU Mosquitto brokers, the agent DaemonSet and the edge broker
// Deployments (lab/testbed), the E2E outage probe (lab/probe), and for each run
// injects the paper's staged fault into the primary edge broker's container
// (amf-lab stress, exec'd through the API server, the kubelet and the runtime),
// then records what happened: onset, detection,
// confirmation, standby Ready, primary retired, OOM, restarts, healthy-window
// jitter and the end-to-end service outage. Modes:
//
//   - reactive: the broker alone, as plain Kubernetes runs it (no sidecar, no
//     agent); consecutive injections into the same Deployment, so the restart
//     back-off grows as in the paper;
//   - observe: sidecar and agent detect and log decisions (--observe-only) but do
//     not act: detection latency and lead time to the OOM;
//   - amf: the full loop, make-before-break switchover to the cold standby,
//     the pair a stateful one (Mosquitto with persistence on, inject
//     --standby --state-dir): real clients put retained messages,
//     persistent sessions and queued QoS 1 messages into the primary
//     before the fault, and the new primary is checked for them after the
//     run (what was lost, what came twice), beside when the agent handed
//     the state on and when the new primary served on it;
//   - healthy: the full loop under normal traffic with no fault, to count false
//     switchovers.
//
// The sidecars run Config.Model (an embedded name, or a model file copied to
// a host folder the pods mount); each run records it, its sha256 and what the
// primary's sidecar reported in /status.
//
// Results (JSON, a summary table beside the paper's figures, SVG plots) go to a
// results folder. Test infrastructure; product code never imports it.
package experiment
