package actuate

import (
	"fmt"
	"time"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
)

// Phase is where a primary is in a switchover.
type Phase string

// The phases. Every phase but Suspect is recorded before its actions are
// taken, except the standby's scale-up, which goes out while the record is
// written (see early). Suspect is not persisted: after a restart the
// debounce starts over, which errs towards not acting.
const (
	// Idle: nothing in progress.
	PhaseIdle Phase = "Idle"
	// Suspect: anomalous samples are being counted (debounce).
	PhaseSuspect Phase = "Suspect"
	// WaitReady: the switchover was decided; the standby is being brought up.
	PhaseWaitReady Phase = "WaitReady"
	// Confirm: the standby is Ready; re-confirming and holding.
	PhaseConfirm Phase = "Confirm"
	// Failover: the primary crashed; the standby is being brought up and the
	// primary is retired as soon as the standby is Ready.
	PhaseFailover Phase = "Failover"
	// Retiring: the primary is being scaled to zero and the roles exchanged.
	PhaseRetiring Phase = "Retiring"
	// Aborted: the anomaly cleared; a cold standby is scaled back at AbortAt.
	PhaseAborted Phase = "Aborted"
	// Resizing: a predicted memory exhaustion is being answered by raising
	// the broker container's memory limit in place (resize.go); it ends in
	// Idle once the kubelet and the sidecar both see the new limit, else in
	// a switchover.
	PhaseResizing Phase = "Resizing"
)

// Record is the state of a Gate, persisted as JSON in the primary's
// amf.io/switchover annotation so a restarted agent resumes from it.
type Record struct {
	Phase   Phase  `json:"phase"`
	Standby string `json:"standby,omitempty"`
	// Decision is when the switchover or failover was decided.
	Decision time.Time `json:"decision,omitzero"`
	// Anomalous counts consecutive anomalous samples (debounce).
	Anomalous int `json:"anomalous,omitempty"`
	// Confirmed counts anomalous samples since the standby became Ready.
	Confirmed int `json:"confirmed,omitempty"`
	// StandbyReady is the latest readiness observed of the standby.
	StandbyReady bool `json:"standbyReady,omitempty"`
	// AbortAt is when an aborted cold standby is scaled back.
	AbortAt time.Time `json:"abortAt,omitzero"`
	// LastSwitch is when the latest switchover retired a primary (flap guard).
	LastSwitch time.Time `json:"lastSwitch,omitzero"`
	// Failover reports that the decision was a failover (crash), not a prediction.
	Failover bool `json:"failover,omitempty"`
	// FlapGuarded reports that a decision was refused by the flap guard and
	// warned about once, so the warning is not repeated every sample.
	FlapGuarded bool `json:"flapGuarded,omitempty"`
	// Why is what drove the decision of a switchover: the explanation the
	// confirming sample carried (its top features, or predict_linear's time
	// to the limit); "" for a failover, whose cause is the primary's state,
	// and for a sidecar that sent none.
	Why string `json:"why,omitempty"`
	// Restore reports that the standby is a hot pair's old primary, retired
	// by the switchover that made this Deployment the primary: it is scaled
	// back to 1 (a fresh pod, the new hot standby) once its old pods are
	// gone. Cleared once the standby is seen scaled up.
	Restore bool `json:"restore,omitempty"`
	// Resize is the resize in place in progress (PhaseResizing).
	Resize Resize `json:"resize,omitzero"`
	// LastResize is when the latest resize in place took effect: at most
	// one per cool-down, so an anomaly a resize did not cure switches over.
	LastResize time.Time `json:"lastResize,omitzero"`
	// SidecarGone is when the primary's sidecar went away without a word:
	// unless its pod speaks again within the policy's SidecarGrace, the
	// primary is failed over as a crash then.
	SidecarGone time.Time `json:"sidecarGone,omitzero"`
}

// Active reports whether a switchover is in progress (the standby may be up).
func (r Record) Active() bool {
	switch r.Phase {
	case PhaseWaitReady, PhaseConfirm, PhaseFailover, PhaseRetiring, PhaseAborted:
		return true
	}
	return false
}

// InputKind says what an Input carries.
type InputKind int

// The inputs of a Gate.
const (
	// InSample is a health observation of a pod of the primary.
	InSample InputKind = iota + 1
	// InStandby is an observation of the standby's readiness.
	InStandby
	// InTick is the passing of time (for hold, deadlines and cool-downs).
	InTick
	// InOrphan reports that the driver found the cold standby scaled up while
	// no switchover is recorded: the scale-up of a decision, which is sent
	// while its record is written, reached the server and the record did
	// not (the agent stopped in between, or the write was refused).
	InOrphan
	// InNodeLost reports that the primary's node is lost (package liveness:
	// its agent's heartbeats and its probes are gone while the guard's own
	// view is current), observed by the guard, the agent of the hot
	// standby's node. It is a crash of the primary: failover at once.
	InNodeLost
	// InResize is the kubelet's answer to a resize in place, as the driver
	// read it from the pod (resize.go).
	InResize
)

// Input is one observation fed to a Gate.
type Input struct {
	Kind InputKind
	At   time.Time
	// InSample: the pod's state and, for anomalous samples, the model's score
	// (nil: counted as anomalous, the sidecar decided) and what drove it.
	State podsignal.State
	// InSample: where the state came from; a gone from the sidecar's Last
	// Will or its session's end is its silence, not its broker's crash.
	Source      podsignal.Source
	Probability *float64
	Why         string
	// InStandby: readyReplicas >= 1 at the standby's current generation.
	Ready bool
	// InStandby: spec.replicas >= 1.
	Scaled bool
	// InStandby: spec.replicas == 0 and no pod of it left, at its current
	// generation (a retired Deployment whose old pods are gone).
	Drained bool
	// InNodeLost: the lost node.
	Node string
	// InSample: the signalling pod, and what its message says of the
	// broker's memory (resize.go): the container's limit read from its
	// cgroup (0: none or not said), memory_percent and memory_growth_rate
	// (bytes per second; nil: not defined yet).
	Pod           string
	MemoryLimit   float64
	MemoryPercent *float64
	MemoryGrowth  *float64
	// MemorySlope is the memory's current slope, bytes per second (the
	// message's memory_slope_bytes_per_second); nil from a sidecar that
	// does not send it, when MemoryGrowth stands in.
	MemorySlope *float64
	// InResize: the kubelet's answer to a resize in place: applied (the
	// pod's status has the new limit), or Refused says why not.
	Applied bool
	Refused string
}

// Sample returns an InSample input.
func Sample(at time.Time, st podsignal.State, prob *float64) Input {
	return Input{Kind: InSample, At: at, State: st, Probability: prob}
}

// Observed returns the InSample input of a pod's observation, with the
// explanation its message carries.
func Observed(o podsignal.Observation) Input {
	in := Sample(o.Received, o.State, o.Probability())
	in.Why = o.Explanation()
	in.Pod = o.Pod
	in.Source = o.Source
	if m := o.Message; m != nil {
		if m.MemoryLimitBytes != nil {
			in.MemoryLimit = *m.MemoryLimitBytes
		}
		in.MemorySlope = m.MemorySlopeBytesPerSecond
		if f := m.Features; f != nil {
			in.MemoryPercent, in.MemoryGrowth = f.MemoryPercent, f.MemoryGrowthRate
		}
	}
	return in
}

// StandbyReadiness returns an InStandby input of a scaled-up standby that is
// Ready or not.
func StandbyReadiness(at time.Time, ready bool) Input {
	return Input{Kind: InStandby, At: at, Ready: ready, Scaled: true}
}

// StandbyStatus returns an InStandby input with every observed field.
func StandbyStatus(at time.Time, ready, scaled, drained bool) Input {
	return Input{Kind: InStandby, At: at, Ready: ready, Scaled: scaled, Drained: drained}
}

// Orphaned returns an InOrphan input.
func Orphaned(at time.Time) Input { return Input{Kind: InOrphan, At: at} }

// NodeLost returns an InNodeLost input: the primary's node was declared
// lost at at.
func NodeLost(at time.Time, node string) Input { return Input{Kind: InNodeLost, At: at, Node: node} }

// Tick returns an InTick input.
func Tick(at time.Time) Input { return Input{Kind: InTick, At: at} }

// ActionKind names what the driver must do.
type ActionKind string

// The actions.
const (
	// ActScaleStandby sets the standby's replicas (scale subresource) to Replicas.
	ActScaleStandby ActionKind = "ScaleStandby"
	// ActRetirePrimary scales the primary to 0 and exchanges the roles. The
	// driver checks the standby is Ready right before (the invariant).
	ActRetirePrimary ActionKind = "RetirePrimary"
	// ActEvent reports a decision: a Normal Event, or Warning when Warning.
	ActEvent ActionKind = "Event"
	// ActResize sets the memory limit of the broker container of the pod
	// Rec.Resize names to Memory bytes, in place (the pod's resize
	// subresource), its request by the same difference.
	ActResize ActionKind = "ResizeInPlace"
	// ActKeepSize records that the broker needed Memory bytes
	// (contract.AnnMemorySize) on both Deployments of the pair, and gives
	// it to the template of the one that runs no pod (resize_kube.go).
	ActKeepSize ActionKind = "KeepSize"
)

// Action is one thing the driver must do, in order.
type Action struct {
	Kind     ActionKind
	Replicas int32  // ActScaleStandby
	Warning  bool   // ActEvent
	Reason   string // ActEvent: CamelCase reason
	Message  string // ActEvent
	Memory   int64  // ActResize: the new limit, bytes
	Pod      string // ActResize: the pod whose broker container it is
}

// Gate is the switchover state machine of one primary. It is pure: Step reads
// no clock and does no I/O, so the driver owns time and the cluster.
type Gate struct {
	Policy contract.Policy
	Rec    Record
}

// NewGate returns a Gate for a primary with policy p, resuming from rec (the
// zero Record for a fresh start).
func NewGate(p contract.Policy, rec Record) *Gate {
	if rec.Phase == "" {
		rec.Phase = PhaseIdle
	}
	rec.Standby = p.Standby
	return &Gate{Policy: p, Rec: rec}
}

// class is how the Gate reads a sample.
type class int

const (
	classIgnore class = iota // starting, stopping: say nothing about trouble
	classClear               // healthy, or anomalous below the threshold
	classAnomalous
	classCrash // unhealthy or gone: trouble is here
)

func (g *Gate) classify(in Input) class {
	switch in.State {
	case podsignal.Healthy:
		return classClear
	case podsignal.Anomalous:
		if in.Probability != nil && *in.Probability < g.Policy.Gates.Threshold {
			return classClear
		}
		return classAnomalous
	case podsignal.Unhealthy, podsignal.Gone:
		return classCrash
	}
	return classIgnore
}

func (g *Gate) cold() bool { return g.Policy.Redundancy == contract.Cold }

func event(reason, format string, args ...any) Action {
	return Action{Kind: ActEvent, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

func warning(reason, format string, args ...any) Action {
	a := event(reason, format, args...)
	a.Warning = true
	return a
}

// Resume returns the actions to repeat after the Gate was loaded from a
// persisted record: every action is idempotent, so re-issuing the current
// phase's request is safe whether or not it had been done before the restart.
func (g *Gate) Resume() []Action {
	switch g.Rec.Phase {
	case PhaseWaitReady, PhaseFailover:
		if g.cold() {
			return []Action{{Kind: ActScaleStandby, Replicas: 1}}
		}
	case PhaseRetiring:
		return []Action{{Kind: ActRetirePrimary}}
	case PhaseResizing:
		return []Action{{Kind: ActResize, Memory: g.Rec.Resize.To, Pod: g.Rec.Resize.Pod}}
	}
	return nil
}

// Deadline returns when the Gate next needs a Tick, if ever.
func (g *Gate) Deadline() (time.Time, bool) {
	r := g.Rec
	if g.graced() {
		d := r.SidecarGone.Add(g.Policy.Gates.SidecarGrace)
		if r.Phase == PhaseAborted && r.AbortAt.Before(d) {
			return r.AbortAt, true
		}
		return d, true
	}
	switch r.Phase {
	case PhaseWaitReady, PhaseFailover:
		return r.Decision.Add(g.Policy.Gates.ReadyTimeout), true
	case PhaseConfirm:
		// Not before the standby is known Ready (after a resume it is
		// learned again from the watch): a tick could not retire, and a
		// past deadline would only wake the driver again at once.
		if r.Confirmed >= g.Policy.Gates.Reconfirm && r.StandbyReady {
			return r.Decision.Add(g.Policy.Gates.Hold), true
		}
	case PhaseAborted:
		return r.AbortAt, true
	case PhaseResizing:
		return r.Decision.Add(g.Policy.Gates.ResizeTimeout), true
	}
	return time.Time{}, false
}

// Step applies one input and returns the actions to take, in order. The
// driver persists Rec (when Persist says so) before carrying them out, but
// for a scale-up of the standby, which it sends while the record is written
// (see early).
func (g *Gate) Step(in Input) []Action {
	if g.Policy.Redundancy == contract.None {
		return nil
	}
	switch in.Kind {
	case InSample:
		return g.sample(in)
	case InStandby:
		return g.standby(in)
	case InTick:
		return g.tick(in.At)
	case InOrphan:
		return g.orphan(in.At)
	case InNodeLost:
		return g.crash(in.At, "lost with its node "+in.Node)
	case InResize:
		return g.resized(in)
	}
	return nil
}

// early reports whether the driver may send act while the step's record is
// being written instead of after it: only a scale-up of the standby. It adds
// Ready replicas and removes none, so a stop on either side of the record
// cannot break the invariant: a lost record leaves a cold standby scaled up
// with nothing recorded, which a restarted driver reports as InOrphan; a
// lost scale-up is repeated from its record (WaitReady, Failover) by Resume.
// Everything else waits for the record: the retirement above all.
func early(act Action) bool { return act.Kind == ActScaleStandby && act.Replicas >= 1 }

func (g *Gate) sample(in Input) []Action {
	r := &g.Rec
	c := g.classify(in)
	if silent(in) && g.Policy.Gates.SidecarGrace > 0 && g.mayGrace() {
		if !r.SidecarGone.IsZero() {
			return nil
		}
		r.SidecarGone = in.At
		return []Action{event("SidecarSilent", "the sidecar of primary pod %s went away without a word: failing over unless it speaks again within %v",
			in.Pod, g.Policy.Gates.SidecarGrace)}
	}
	// Any word from the pod ends the silence.
	r.SidecarGone = time.Time{}
	switch r.Phase {
	case PhaseIdle, PhaseSuspect:
		switch c {
		case classClear:
			r.Phase, r.Anomalous, r.FlapGuarded = PhaseIdle, 0, false
		case classAnomalous:
			r.Anomalous++
			r.Phase = PhaseSuspect
			if r.Anomalous >= g.Policy.Gates.Debounce {
				return g.decide(in)
			}
		case classCrash:
			return g.crash(in.At, string(in.State))
		}
	case PhaseWaitReady, PhaseConfirm:
		switch c {
		case classClear:
			return g.abort(in.At)
		case classAnomalous:
			if r.Phase == PhaseConfirm {
				r.Confirmed++
				return g.maybeRetire(in.At)
			}
		case classCrash:
			return g.crash(in.At, string(in.State))
		}
	case PhaseAborted:
		switch c {
		case classClear:
			r.Anomalous = 0
		case classAnomalous:
			r.Anomalous++
			if r.Anomalous >= g.Policy.Gates.Debounce {
				return g.decide(in)
			}
		case classCrash:
			return g.crash(in.At, string(in.State))
		}
	case PhaseResizing:
		if c == classCrash {
			return g.crash(in.At, string(in.State))
		}
		return g.resizeSeen(in)
	case PhaseFailover, PhaseRetiring:
		// Committed: a primary that crashed is retired even if Kubernetes
		// restarted it meanwhile; we stop depending on its restart.
	}
	return nil
}

// silent says whether in is a sidecar's silence: gone, from its Last Will
// or its session's end (not node mode's pushed exit, which is the broker's).
func silent(in Input) bool {
	return in.State == podsignal.Gone && (in.Source == podsignal.SourceWill || in.Source == podsignal.SourceDisconnect)
}

// mayGrace says whether a silent sidecar may be waited for in the current
// phase: not once a switchover is under way, which a crash ends at once.
func (g *Gate) mayGrace() bool {
	switch g.Rec.Phase {
	case PhaseIdle, PhaseSuspect, PhaseAborted:
		return true
	}
	return false
}

// graced says whether a silent sidecar is being waited for.
func (g *Gate) graced() bool { return !g.Rec.SidecarGone.IsZero() && g.mayGrace() }

// crash handles trouble that is here (the primary unhealthy, gone, or lost
// with its node; why says which) in every phase: a failover at once, or,
// during a switchover, retiring the primary as soon as the standby is Ready.
// Committed phases (Failover, Retiring) go on as they are.
func (g *Gate) crash(now time.Time, why string) []Action {
	r := &g.Rec
	switch r.Phase {
	case PhaseIdle, PhaseSuspect, PhaseAborted, PhaseResizing:
		return g.failover(now, why)
	case PhaseWaitReady, PhaseConfirm:
		if r.Phase == PhaseConfirm && r.StandbyReady {
			r.Failover = true
			return append([]Action{event("Failover", "primary %s while the standby %s is Ready: retiring it now", why, r.Standby)}, g.retire()...)
		}
		r.Phase, r.Failover = PhaseFailover, true
		return []Action{event("Failover", "primary %s during the switchover: retiring it as soon as the standby %s is Ready", why, r.Standby)}
	}
	return nil
}

// decide answers a debounced anomaly (in is the sample that confirmed it):
// a resize in place when it can cure it (resize.go), else a switchover.
func (g *Gate) decide(in Input) []Action {
	acts, noResize := g.resize(in)
	if acts != nil {
		return acts
	}
	return g.switchover(in.At, in.Why, noResize)
}

// switchover starts a switchover, unless the flap guard holds it back. why
// is what drove the anomaly; noResize, when set, why no resize in place
// answers it instead.
func (g *Gate) switchover(now time.Time, why, noResize string) []Action {
	r := &g.Rec
	if noResize != "" {
		noResize = "; " + noResize
	}
	if !r.LastSwitch.IsZero() && now.Before(r.LastSwitch.Add(g.Policy.Gates.Cooldown)) {
		if r.Phase == PhaseResizing {
			r.Phase, r.Resize, r.Decision = PhaseIdle, Resize{}, time.Time{}
		}
		if r.FlapGuarded {
			return nil
		}
		r.FlapGuarded = true
		return []Action{warning("FlapGuard", "anomaly confirmed (%d samples%s%s) but the last switchover was at %s, within the cool-down of %v: not switching",
			r.Anomalous, drivenBy(why), noResize, r.LastSwitch.UTC().Format(time.RFC3339), g.Policy.Gates.Cooldown)}
	}
	wasAborted := r.Phase == PhaseAborted
	r.Phase, r.Decision, r.Confirmed, r.Failover, r.FlapGuarded, r.AbortAt, r.Resize = PhaseWaitReady, now, 0, false, false, time.Time{}, Resize{}
	r.Why = why
	acts := []Action{event("SwitchoverDecided", "%d consecutive anomalous samples%s%s: bringing up the standby %s", r.Anomalous, drivenBy(r.Why), noResize, r.Standby)}
	if g.cold() && !wasAborted {
		acts = append(acts, Action{Kind: ActScaleStandby, Replicas: 1})
	}
	if r.StandbyReady {
		// Hot standby, or the standby of an aborted switchover still running.
		r.Phase = PhaseConfirm
	}
	return acts
}

// failover starts bringing the standby up at once, without debounce or flap
// guard: a crashed primary is not a prediction that could be wrong.
func (g *Gate) failover(now time.Time, why string) []Action {
	r := &g.Rec
	wasAborted := r.Phase == PhaseAborted
	r.Phase, r.Decision, r.Failover, r.Confirmed, r.AbortAt, r.Why, r.Resize = PhaseFailover, now, true, 0, time.Time{}, "", Resize{}
	r.SidecarGone = time.Time{}
	acts := []Action{event("Failover", "primary %s: bringing up the standby %s at once", why, r.Standby)}
	if r.StandbyReady {
		return append(acts, g.retire()...)
	}
	if g.cold() && !wasAborted {
		acts = append(acts, Action{Kind: ActScaleStandby, Replicas: 1})
	}
	return acts
}

// abort gives up a switchover whose anomaly cleared before the primary was
// retired. A cold standby is kept for AbortDelay, so a returning anomaly
// finds it already up, then scaled back.
func (g *Gate) abort(now time.Time) []Action {
	r := &g.Rec
	r.Anomalous, r.Confirmed = 0, 0
	acts := []Action{event("SwitchoverAborted", "anomaly cleared before the primary was retired: keeping the primary")}
	if !g.cold() {
		r.Phase, r.Decision = PhaseIdle, time.Time{}
		return acts
	}
	r.Phase, r.AbortAt = PhaseAborted, now.Add(g.Policy.Gates.AbortDelay)
	return acts
}

func (g *Gate) maybeRetire(now time.Time) []Action {
	r := &g.Rec
	if r.Phase != PhaseConfirm || !r.StandbyReady || r.Confirmed < g.Policy.Gates.Reconfirm || now.Before(r.Decision.Add(g.Policy.Gates.Hold)) {
		return nil
	}
	return append([]Action{event("SwitchoverConfirmed", "%d anomalous samples with the standby %s Ready, %v since the decision%s: retiring the primary",
		r.Confirmed, r.Standby, now.Sub(r.Decision).Round(time.Millisecond), drivenBy(r.Why))}, g.retire()...)
}

// drivenBy renders an explanation for an Event's message; "" without one.
func drivenBy(why string) string {
	if why == "" {
		return ""
	}
	return ", driven by " + why
}

func (g *Gate) retire() []Action {
	g.Rec.Phase = PhaseRetiring
	return []Action{{Kind: ActRetirePrimary}}
}

func (g *Gate) standby(in Input) []Action {
	r := &g.Rec
	r.StandbyReady = in.Ready
	return append(g.restore(in), g.standbyPhase(in)...)
}

// restore brings a hot pair's retired old primary back as the new hot
// standby (Record.Restore), once none of its old pods are left: scaling it
// up earlier could keep the very pod the switchover retired.
func (g *Gate) restore(in Input) []Action {
	r := &g.Rec
	switch {
	case !r.Restore:
	case g.cold() || in.Scaled:
		r.Restore = false // brought back (or no longer to be: a cold standby stays at 0)
	case in.Drained:
		// Repeated on each drained observation until it is seen scaled up:
		// the scale is idempotent, and the flag is cleared only then, so a
		// restart in between scales it again.
		return []Action{{Kind: ActScaleStandby, Replicas: 1}}
	}
	return nil
}

func (g *Gate) standbyPhase(in Input) []Action {
	r := &g.Rec
	switch r.Phase {
	case PhaseWaitReady:
		if in.Ready {
			r.Phase = PhaseConfirm
			return append([]Action{event("StandbyReady", "standby %s is Ready after %v: re-confirming", r.Standby, in.At.Sub(r.Decision).Round(time.Millisecond))}, g.maybeRetire(in.At)...)
		}
	case PhaseConfirm:
		if !in.Ready {
			// Not Ready any more: never retire the primary now; wait again.
			r.Phase, r.Confirmed = PhaseWaitReady, 0
			return []Action{warning("StandbyNotReady", "standby %s lost readiness before the primary was retired", r.Standby)}
		}
		// Ready (again, or first seen after a resume): the samples counted
		// meanwhile may already confirm.
		return g.maybeRetire(in.At)
	case PhaseRetiring:
		// A retirement refused because the standby was not Ready (or resumed
		// before it was) goes ahead once it is.
		if in.Ready {
			return []Action{{Kind: ActRetirePrimary}}
		}
	case PhaseFailover:
		if in.Ready {
			return append([]Action{event("StandbyReady", "standby %s is Ready %v after the failover decision", r.Standby, in.At.Sub(r.Decision).Round(time.Millisecond))}, g.retire()...)
		}
	}
	return nil
}

// orphan adopts a cold standby found scaled up with no switchover recorded
// as the standby of an aborted switchover: kept for AbortDelay, so an anomaly
// that persists (debounced again) or a crash uses it at once, then scaled
// back. Not for hot (it runs anyway) nor while a switchover is recorded.
func (g *Gate) orphan(now time.Time) []Action {
	r := &g.Rec
	if !g.cold() || r.Active() {
		return nil
	}
	r.Phase, r.AbortAt, r.Decision, r.Confirmed, r.Failover = PhaseAborted, now.Add(g.Policy.Gates.AbortDelay), time.Time{}, 0, false
	return []Action{warning("OrphanedStandby", "standby %s is scaled up but no switchover is recorded (a scale-up whose record was lost, or someone else's): keeping it for %v in case the anomaly persists, then scaling it back",
		r.Standby, g.Policy.Gates.AbortDelay)}
}

func (g *Gate) tick(now time.Time) []Action {
	r := &g.Rec
	if g.graced() && !now.Before(r.SidecarGone.Add(g.Policy.Gates.SidecarGrace)) {
		since := now.Sub(r.SidecarGone).Round(time.Millisecond)
		r.SidecarGone = time.Time{}
		return g.crash(now, fmt.Sprintf("gone (its sidecar silent for %v)", since))
	}
	switch r.Phase {
	case PhaseWaitReady, PhaseFailover:
		if now.Before(r.Decision.Add(g.Policy.Gates.ReadyTimeout)) {
			return nil
		}
		acts := []Action{warning("StandbyNotReady", "standby %s not Ready within %v of the decision: keeping the primary", r.Standby, g.Policy.Gates.ReadyTimeout)}
		if g.cold() {
			acts = append(acts, g.scaleBack()...)
		}
		r.Phase, r.Decision, r.Anomalous, r.Confirmed, r.Failover = PhaseIdle, time.Time{}, 0, 0, false
		return acts
	case PhaseConfirm:
		return g.maybeRetire(now)
	case PhaseAborted:
		if now.Before(r.AbortAt) {
			return nil
		}
		r.Phase, r.AbortAt, r.Decision, r.Anomalous = PhaseIdle, time.Time{}, time.Time{}, 0
		return g.scaleBack()
	case PhaseResizing:
		return g.resizeTimedOut(now)
	}
	return nil
}

// scaleBack scales the cold standby to 0. It is not Ready from now on, until
// its watch says otherwise: a crash right after must wait for a standby,
// never retire the primary on a readiness seen before the scale-back.
func (g *Gate) scaleBack() []Action {
	g.Rec.StandbyReady = false
	return []Action{{Kind: ActScaleStandby, Replicas: 0}}
}

// Retired records that the driver retired the primary at now: the switchover
// is complete. The driver then moves the record to the new primary.
func (g *Gate) Retired(now time.Time) {
	g.Rec = Record{Phase: PhaseIdle, Standby: g.Rec.Standby, LastSwitch: now, LastResize: g.Rec.LastResize}
}

// Persist reports whether the change from old to the current record must be
// written before acting: any change but the counting of debounce samples.
func (g *Gate) Persist(old Record) bool {
	a, b := old, g.Rec
	a.Anomalous, b.Anomalous = 0, 0
	if a.Phase == PhaseSuspect {
		a.Phase = PhaseIdle
	}
	if b.Phase == PhaseSuspect {
		b.Phase = PhaseIdle
	}
	if a.Phase == PhaseConfirm || a.Phase == PhaseWaitReady {
		a.Confirmed, b.Confirmed = 0, 0
	}
	return a != b
}
