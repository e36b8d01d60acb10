// Package testbed builds the paper's service path on one machine: the RDS and OBU
// Mosquitto brokers (plain local processes, standing for the two remote
// clusters), the edge broker's configuration and Deployments (the primary with
// the AMF sidecar injected by package inject, and its cold standby with its own
// bridge client IDs), the agent process with the manifests' RBAC, and the
// reading of the agent's JSON log. The lab node (lab/node) runs the edge pods.
//
// Test infrastructure; product code never imports it.
package testbed
