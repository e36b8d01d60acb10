// Package testbed builds the paper's service path on one machine: the RDS and OBU
// Mosquitto brokers (plain processes in a real node's network namespace,
// standing for the two remote clusters), the edge broker's configuration and
// Deployments (the primary with the AMF sidecar injected by package inject, and
// its cold standby with its own bridge client IDs), the agent DaemonSet as
// manifests/base installs it, and the reading of the agent's JSON log (through
// the API server, as kubectl logs -f). A real node (lab/kubenode) runs the pods.
//
// Test infrastructure; product code never imports it.
package testbed
