// Package sidecar is the per-pod process of AMF around one detect.Pipeline:
// the sample loop on a ticker, the target search, the health endpoint (with
// package healthcheck), and a Publisher for the pipeline's signals (the MQTT
// Signaller to the node agent; Recorder as a fake). Subpackage cgroup finds
// and reads the broker container's cgroup.
// It must never import client-go: the sidecar binary stays small.
package sidecar
