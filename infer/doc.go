// Package infer turns a target's raw counters and gauges into the six features the
// anomaly model reads, with the exact semantics of the Prometheus pipeline the model
// was trained on (rate over 5m, deriv over a 10m subquery). Subpackage model
// loads and scores the model that reads them.
//
// It knows nothing of MQTT or Kubernetes: callers feed it samples and read vectors.
package infer
