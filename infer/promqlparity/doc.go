// Package promqlparity holds only tests: it loads the same randomised series into
// Prometheus' own TSDB and PromQL engine and into infer.Engine, and checks that the
// six features agree at every evaluation time. It is a separate Go module so that the
// product's go.mod never depends on Prometheus.
//
//	go test ./...                                   # fixed seeds, edge cases, fuzz corpus
//	go test -run TestFeaturesMatchPrometheus -seed=N -v   # explore another seed (or AMF_PARITY_SEED=N)
//	go test -run '^$' -fuzz FuzzFeaturesMatchPrometheus -fuzztime 2m
//
// When the root module's go.mod changes, run go mod tidy here (the replace directive
// makes the root's requirements part of this module's graph).
package promqlparity
