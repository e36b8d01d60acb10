// Package manifests holds the Kubernetes manifests of AMF, as kustomize layouts:
//
//   - base: namespace amf-system, the agent's ServiceAccount, least-privilege
//     ClusterRoles and bindings (TokenReview for authentication, the actuation
//     rules of package actuate), and the agent DaemonSet;
//   - examples: an Eclipse Mosquitto edge broker with the sidecar injected as a
//     native sidecar, its cold standby and a Service;
//   - overlays/rpi-arm64: base and examples pinned to arm64 nodes, for
//     Raspberry Pi / MicroK8s clusters.
//
// The package has no Go API: its tests render every layout with the kubectl
// built with the test control plane (lab/controlplane) and apply the result to a
// real API server, first with server-side dry-run, then for real. See README.md.
package manifests
