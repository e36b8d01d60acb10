// Package actuate turns the health signals the agent receives into recovery on
// Kubernetes: make-before-break switchover from a primary Deployment to its
// standby when an anomaly is confirmed, and immediate failover when a primary
// crashes.
//
// It has two layers:
//
//   - Gate (gate.go) is a pure state machine: Step takes one input (a sample of
//     the primary's health, the standby's readiness, or the passing of time) at
//     an explicit instant and returns the actions to take. It does no I/O and
//     reads no clock, so every transition is table-tested with a fake clock.
//   - Actuator (actuator.go) drives one Gate per primary Deployment with
//     client-go: it maps a pod to its Deployment (pod → ReplicaSet →
//     Deployment ownerReferences, by lookups cached per pod; no informers, so
//     the agent neither lists every pod of the cluster into memory nor needs
//     list/watch on pods), writes the Gate's record to an annotation on the
//     primary with optimistic concurrency before acting (write-ahead, so an
//     agent restarted mid-way resumes), scales through the scale subresource,
//     watches the standby until it is Ready, emits events.k8s.io/v1 Events and
//     one JSON decision line per step, and patches the amf.io/healthy
//     readiness-gate condition of pods that declare it.
//
// Policy lives on the primary Deployment as annotations (see ParsePolicy):
//
//	amf.io/standby:       <deployment in the same namespace>   (required)
//	amf.io/redundancy:    cold | hot | none                     (default cold)
//	amf.io/threshold:     0.5     probability counted as anomalous
//	amf.io/debounce:      3       consecutive anomalous samples before deciding
//	amf.io/reconfirm:     3       anomalous samples after the standby is Ready
//	amf.io/hold:          15s     least time from decision to retiring the primary
//	amf.io/ready-timeout: 2m      standby must be Ready within this, else keep primary
//	amf.io/cooldown:      5m      at most one switchover per workload per cool-down
//	amf.io/abort-delay:   30s     a standby started for an anomaly that cleared is
//	                              scaled back (cold) after this
//
// Invalid policy gives a Warning Event on the Deployment and no action.
//
// Crash safety: the record (phase, standby, decision time, sample counts,
// last switchover) is written with a compare-and-swap on its previous value
// before the step's actions run (one JSON patch whose test op is the
// compare-and-swap; the first write, at load, a get and a patch carrying the
// resourceVersion read), and each action is idempotent (the scale is one
// update of the scale subresource without a resourceVersion). A restarted
// agent resumes a workload on its next signal, or at once for every
// in-progress record with Config.ResumeOnStart (amf-agent --resume-on-start).
// A failed action is tried again after 2 s while the phase is unchanged.
//
// The trade-off of ResumeOnStart: it needs list on Deployments
// (RulesWithResume), so the agent can read every Deployment in scope (specs,
// including literal env values; bind the rules per namespace with a Role to
// narrow that). Without it, a switchover whose primary no longer signals is
// not resumed: one stopped after the primary was scaled to 0 but before the
// roles were exchanged leaves the new primary without a policy (unprotected)
// until someone restarts the agent with it; every other phase resumes on the
// primary's next sample.
//
// Events are emitted after a step's cluster actions, so their round trip
// never delays a scale or a retirement.
//
// Evidence: an events.k8s.io/v1 Event per decision (reportingController
// amf.io/agent), one JSON line per step ("msg":"decision"), and the metrics
// amf_actuate_actions_total, amf_actuate_decisions_total,
// amf_actuate_action_seconds (each API action), amf_actuate_step_seconds (each
// persisted step, input to actions done, by phase entered) and
// amf_actuate_switchover_seconds (decision to standby_ready and to retired)
// on Config.Registerer.
//
// The invariant the package keeps: the agent never brings the Ready replicas of
// primary + standby to zero by its own action. The primary is scaled to zero
// only after the standby was observed Ready (the Gate only emits RetirePrimary
// then) and the Actuator re-reads the standby's status right before it does.
//
// StatefulSets are not supported yet: their pods' owner is the StatefulSet
// itself, and scaling one to zero has ordering semantics of its own.
package actuate
