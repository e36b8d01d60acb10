// Package controlplane is test infrastructure: it starts a real Kubernetes control
// plane on loopback for the tests of this repository. Product code never imports it.
//
// Start runs etcd, kube-apiserver (RBAC, Node+RBAC authorization, a static token
// file, ServiceAccount signing keys so TokenRequest and TokenReview work),
// kube-controller-manager (all default controllers, ServiceAccount credentials per
// controller), kube-scheduler and kwok (fake nodes; its stages mark pods Running
// and Ready) as child processes in a temporary directory, on free 127.0.0.1 ports.
// It returns when the API server is ready, every fake node is Ready and the
// "default" ServiceAccount exists, and stops everything (API server before etcd)
// in t.Cleanup. Each component logs to <Dir>/logs/<name>.log; the logs' tails are
// printed when the test fails.
//
// Shared is one control plane for the tests of a package (started by the
// first test that asks, stopped by TestMain), each test in a namespace of its
// own: the actuator's ten real-API tests spent 45 of their 116 s starting and
// stopping control planes.
//
// The binaries are built by `make k8s` (tools/k8s/build.sh) into
// ~/.cache/amf/k8s/<k8s-version>/bin (or $AMF_K8S_CACHE/<k8s-version>/bin);
// $AMF_K8S_BIN overrides the folder. When they are missing the test is skipped
// with one line saying to run `make k8s`; with AMF_REQUIRE_K8S=1 (CI) it fails.
package controlplane
