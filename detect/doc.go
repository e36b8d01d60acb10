// Package detect is one pod's detection pipeline, the same online and
// offline: a cgroup reading becomes a feature sample, the features are
// computed with the windows of the model's manifest (FeatureConfig), put on
// the model's scale (Normalise), scored, and judged by the health state
// machine (Machine), whose verdicts become the signal messages to send
// (Pipeline). The offline commands use the same code: Replay computes the
// features of recorded samples, ScoreCSV scores feature rows.
//
// A Pipeline does no I/O beyond its Source and holds no goroutine or lock.
// Runner is the one loop around it, run by the sidecar and by node mode (one
// per pod): the tick, the target found (again), the ends pushed for it, the
// probe's answers. What differs between the two is behind Finder (where the
// target comes from) and Sink (where the verdicts go).
package detect
