// Package sidecar is the per-pod half of AMF: it samples the broker container's
// cgroup, keeps the feature windows, and (with its subpackages) finds the target.
// It must never import client-go: the sidecar binary stays small.
package sidecar
