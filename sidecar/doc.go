// Package sidecar is the per-pod process of AMF around one detect.Runner (the
// loop node mode runs too): its target search, the health endpoint (with
// package healthcheck), and a Publisher for the pipeline's signals (the MQTT
// Signaller to the node agent; Recorder as a fake), and the fence the agent
// commands (with package pause). Package cgroup finds and reads the broker
// container's cgroup; subpackage handover moves the broker's state.
// It must never import client-go: the sidecar binary stays small.
package sidecar
