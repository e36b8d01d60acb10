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
//   - Actuator (actuator.go) drives one Gate per primary Deployment through
//     Cluster, its part of the agent's one seam to the API server (package
//     cluster: client-go in production, clusterfake in the tests): it maps
//     a pod to its Deployment (pod → ReplicaSet → Deployment
//     ownerReferences, by lookups cached per pod; no informers, so
//     the agent neither lists every pod of the cluster into memory nor needs
//     list/watch on pods), writes the Gate's record to an annotation on the
//     primary with optimistic concurrency (write-ahead, so an agent
//     restarted mid-way resumes; see the write order below), scales through
//     the scale subresource, watches the standby (Ready, scaled up, drained),
//     emits events.k8s.io/v1 Events and one JSON decision line per step, and
//     patches the amf.io/healthy readiness-gate condition of pods that
//     declare it.
//
// Policy lives on the primary Deployment as annotations (see contract.ParsePolicy):
//
//	amf.io/standby:       <deployment in the same namespace>   (required)
//	amf.io/redundancy:    cold | hot | none                     (default cold)
//	                      cold: the standby sits at 0 replicas; the agent
//	                      scales it 0→1 for a switchover and back after an
//	                      abort. hot: it runs all along and is never scaled
//	                      for a switchover; after one, the retired old
//	                      primary comes back (0→1, a fresh pod, once the
//	                      retired one is gone) as the new hot standby.
//	amf.io/threshold:     0.5     probability counted as anomalous
//	amf.io/debounce:      3       consecutive anomalous samples before deciding
//	amf.io/reconfirm:     3       anomalous samples after the standby is Ready
//	amf.io/hold:          15s     least time from decision to retiring the primary
//	amf.io/ready-timeout: 2m      standby must be Ready within this, else keep primary
//	amf.io/cooldown:      5m      at most one switchover per workload per cool-down
//	amf.io/abort-delay:   30s     a standby started for an anomaly that cleared is
//	                              scaled back (cold) after this
//	amf.io/memory-ceiling: (none) the most memory a resize in place may give the
//	                              broker container before a switchover (resize.go);
//	                              none: never resized
//	amf.io/resize-timeout: 20s    a resize must be in effect within this, else
//	                              the old size back and a switchover
//
// Invalid policy gives a Warning Event on the Deployment at every signal of
// its pods (one Event series, see Events below) and no action.
//
// Crash safety: the record (phase, standby, decision time, sample counts,
// last switchover) is written with a compare-and-swap on its previous value
// (one JSON patch whose test op is the compare-and-swap; the first write, at
// load, a get and a patch carrying the resourceVersion read), and each action
// is idempotent (the scale is one update of the scale subresource without a
// resourceVersion). A restarted agent resumes a workload on its next signal,
// or on the next signal of a standby that names it (amf.io/primary, which
// inject --standby and every role exchange write), or at once with
// Config.ResumeOnStart (amf-agent --resume-on-start). A failed action is
// tried again after 2 s while the phase is unchanged.
//
// The write order. A step's record is written before its actions, with one
// exception: the standby's scale-up of a decision (switchover or failover)
// is sent while the record is written, so decision → scale request on the
// wire does not wait for the record's round trip to etcd. The scale-up only
// adds Ready replicas, so no stop can break the invariant on either side:
//
//   - record written, scale-up lost: the record (WaitReady, Failover) makes
//     the restarted agent send it again.
//   - scale-up done, record lost (the agent stopped in between, or the
//     record was refused because another agent changed it): a cold standby
//     scaled up while its primary records no switchover is an orphan. The
//     agent that loads the primary (on its next signal, at once with
//     ResumeOnStart, or on the reload after a refused record) adopts it: a
//     Warning Event OrphanedStandby and the record Aborted, which keeps the
//     standby for abort-delay, so an anomaly that persists (debounced again)
//     switches over to it without scaling it again and a crash fails over to
//     it at once; otherwise it is scaled back. The same rule catches a stop
//     between an abort's record (Idle) and its scale-back. It also adopts a
//     cold standby that someone else scaled up: a cold standby belongs to the
//     agent (use hot to keep one running). Within one agent, a record write
//     that fails after the scale-up went out keeps the Gate's step (the
//     cluster has it) and writes the record with the next step.
//   - every later step is recorded before it is taken: above all Retiring
//     before the primary is scaled to 0, so a stop there always resumes the
//     retirement and the role exchange. A scale back to 0 is also recorded
//     first, and taken only while the primary is Ready right now.
//   - the role exchange writes the new primary first: a stop before the old
//     primary's write leaves both with a policy, the old one Retiring. The
//     agent that loads the new one finishes the old one's retirement first
//     (exchangeUnfinished), before the new one's Record.Restore could bring
//     back a Deployment that is still a primary.
//
// gate_test and writeorder_test check this on every input sequence up to
// length 6 with a stop at every write point; restart_k8s_test stops a real
// agent at each of them, the orphan cases included, and
// nodeloss_restart_test and nodeloss_restart_k8s_test at each write of a
// node-loss failover.
//
// The trade-off of ResumeOnStart: it needs list on Deployments
// (RulesWithResume), so the agent can read every Deployment in scope (specs,
// including literal env values; bind the rules per namespace with a Role to
// narrow that). Without it, a switchover stopped after the primary was
// scaled to 0 but before the roles were exchanged (the primary has no pod
// left to signal, the standby serves without a policy) resumes on the
// standby's next signal, which its sidecar sends whenever it reconnects to
// the restarted agent; a standby that does not name its primary in
// amf.io/primary leaves it unprotected until an agent with ResumeOnStart
// runs. Every other phase resumes on the primary's next sample.
//
// Events are queued after a step's cluster actions and written by a
// goroutine of their own, so their round trips never hold up the loop that
// decides for every workload. An identical Event (same object, type, reason,
// action and note) repeated within 6 minutes creates no new object: it counts
// in the first one's series (count, lastObservedTime), as client-go's event
// broadcaster does, written at the first repeat and then at most every 10 s
// (and when Run ends); this needs patch on events.
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
// then) and the Actuator re-reads the standby's status right before it does;
// a standby is scaled back only while the primary is Ready, read right before.
//
// StatefulSets are not supported yet: their pods' owner is the StatefulSet
// itself, and scaling one to zero has ordering semantics of its own.
package actuate
