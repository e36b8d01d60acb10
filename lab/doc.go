// Package lab is AMF's testbed on one machine: real brokers, real sidecar and agent
// processes, fault injection and measurement. It is test infrastructure; product
// code never imports it.
package lab
