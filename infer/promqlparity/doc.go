// Package promqlparity holds only tests: it loads the same randomised series into
// Prometheus' own TSDB and PromQL engine and into infer.Engine, and checks that the
// six features agree at every evaluation time. It is a separate Go module so that the
// product's go.mod never depends on Prometheus.
package promqlparity
