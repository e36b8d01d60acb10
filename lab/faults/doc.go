// Package faults holds the tests of AMF's switchover under faults of the
// node it runs on (issue 13, item 6): the agent's container killed, the
// kubelet restarted, containerd restarted, each at a chosen step of a
// make-before-break switchover on a real kubelet + containerd node
// (lab/kubenode), with the agent as manifests/base's DaemonSet and the
// paper's edge broker Deployments (lab/testbed) carrying the E2E probe's
// messages. Each test checks what must hold whatever the timings: the
// switchover completes or aborts cleanly, the service is never without a
// Ready broker, the switchover record ends in a terminal phase, no pod,
// process, cgroup or address leaks, and no message is lost.
//
// Test infrastructure: product code never imports it.
package faults
