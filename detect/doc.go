// Package detect is one pod's detection pipeline, the same online and
// offline: a cgroup reading becomes a feature sample, the features are
// computed with the windows of the model's manifest (FeatureConfig), put on
// the model's scale (Normalise), scored, and judged by the health state
// machine (Machine), whose verdicts become the signal messages to send
// (Pipeline). The offline commands use the same code: Replay computes the
// features of recorded samples, ScoreCSV scores feature rows.
//
// A Pipeline does no I/O beyond its Source and holds no goroutine or lock: the
// caller (the sidecar's loop, or a node agent running one per pod) owns it
// and decides where messages go.
package detect
