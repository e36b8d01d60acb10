// Package experiment is `amf-lab experiment`: the paper's availability experiment
// on one machine. It starts the real control plane (lab/controlplane), a lab node
// that runs the edge broker's pods as local processes in real cgroups (lab/node),
// the RDS and OBU Mosquitto brokers and the edge broker Deployments
// (lab/testbed), the E2E outage probe (lab/probe), and for each run injects the
// paper's staged fault into the primary edge broker's container (amf-lab stress,
// exec'd into its cgroup), then records what happened: onset, detection,
// confirmation, standby Ready, primary retired, OOM, restarts, healthy-window
// jitter and the end-to-end service outage. Modes:
//
//   - reactive: the broker alone, as plain Kubernetes runs it (no sidecar, no
//     agent); consecutive injections into the same Deployment, so the restart
//     back-off grows as in the paper;
//   - observe: sidecar and agent detect and log decisions (--observe-only) but do
//     not act: detection latency and lead time to the OOM;
//   - amf: the full loop, make-before-break switchover to the cold standby;
//   - healthy: the full loop under normal traffic with no fault, to count false
//     switchovers.
//
// The sidecars run Config.Model (an embedded name, or a model file copied
// where the pods can read it); each run records it, its sha256 and what the
// primary's sidecar reported in /status.
//
// Results (JSON, a summary table beside the paper's figures, SVG plots) go to a
// results folder. Test infrastructure; product code never imports it.
package experiment
