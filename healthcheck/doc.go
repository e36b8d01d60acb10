// Package healthcheck is a watched broker's health surface: app-logic probes of
// the workload (the sidecar's of the broker beside it on loopback, node mode's of
// a pod's broker through its IP) and the HTTP endpoint that exposes what the
// sidecar knows.
//
// Probes answer one question — does the application logic work right now? — and
// report every answer through a callback the moment it is known:
//
//   - [MQTTProber] keeps one MQTT connection to the broker in the same pod,
//     publishes a unique token to a private topic on each interval and must
//     receive it back within a timeout. A lost connection is reported at once,
//     not at the next interval, which is what makes signal-based failure
//     detection faster than polling.
//   - [TCPProber] only checks that a TCP port accepts connections, for
//     workloads that are not MQTT brokers.
//
// [Server] serves /healthz (the sidecar itself), /readyz (the app-logic probe),
// /status (a JSON snapshot from the caller), /metrics (Prometheus, on a registry
// of its own, see [Metrics]) and POST /signal, through which the application
// reports its own health change from loopback.
//
// The package observes and reports; it never decides recovery. It depends on
// the wire contract in package signal only for the names of states and features.
package healthcheck
