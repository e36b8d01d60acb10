package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/lab/testbed"
)

// PairKind is how a pair of the run is made and watched.
type PairKind string

const (
	// SidecarPair is a hot pair watched by its sidecars.
	SidecarPair PairKind = "sidecar"
	// NodePair is a hot pair in node mode: the agents sample its brokers.
	NodePair PairKind = "node"
	// StatePair is a sidecar pair that keeps its brokers' state
	// (inject --state-dir): retained messages, persistent sessions and
	// queued QoS 1 messages are handed over at every switchover and
	// failover, and checked after each against what DESIGN.md promises
	// ("Broker state").
	StatePair PairKind = "state"
)

// DefaultPairs are a run's pairs unless it names others: one of each kind.
func DefaultPairs() []PairKind { return []PairKind{SidecarPair, NodePair, StatePair} }

// Mode is how the pair's brokers are watched.
func (k PairKind) Mode() contract.Mode {
	if k == NodePair {
		return contract.ModeNode
	}
	return contract.ModeSidecar
}

// ParsePairs reads a comma-separated list of pair kinds.
func ParsePairs(s string) ([]PairKind, error) {
	var out []PairKind
	for _, f := range strings.Split(s, ",") {
		k := PairKind(strings.TrimSpace(f))
		if !slices.Contains(DefaultPairs(), k) {
			return nil, fmt.Errorf("soak: unknown pair %q; a pair is %s, %s or %s", k, SidecarPair, NodePair, StatePair)
		}
		out = append(out, k)
	}
	return out, nil
}

// statePlan is what a stateful pair's primary holds before every fault:
// retained messages, 3.1.1 and MQTT 5 persistent sessions (paho, Debian's
// mosquitto_sub) with QoS 1 messages queued for each while it is away.
var statePlan = brokerstate.Plan{Retained: 100, Sessions: 2, V5Sessions: 1, Queued: 10, Prefix: "amf-soak"}

// clockEvery is how often a stateful pair's clock publishes.
const clockEvery = 100 * time.Millisecond

// stateRun follows a stateful pair's broker state: the plan its primary
// was seeded with, and the clock publishing to it.
type stateRun struct {
	plan  brokerstate.Plan
	clock *brokerstate.Clock
	// pod is the primary's pod the plan and the clock went to.
	pod string
}

// StateCheck is what a stateful pair's new primary held after a fault that
// took its primary away, against the plan seeded before it and the clock.
type StateCheck struct {
	// Handover is how the agents said the state went: "final" (a
	// switchover), "snapshot" (a failover), or "not carried" (Why says why).
	Handover string `json:"handover"`
	Why      string `json:"why,omitempty"`
	// SnapshotAge is the agent's: how old the snapshot was at the
	// failover.
	SnapshotAge time.Duration `json:"snapshot_age,omitempty"`
	// Clock is the clock's retained value the new primary served (zero:
	// none); Acked the newest one the old primary acknowledged.
	Clock time.Time `json:"clock,omitzero"`
	Acked time.Time `json:"acked,omitzero"`
	// What of the plan the new primary did not hold, and what it delivered
	// twice.
	RetainedLost int `json:"retained_lost"`
	SessionsLost int `json:"sessions_lost"`
	QoS1Lost     int `json:"qos1_lost"`
	Duplicates   int `json:"duplicates"`
	// Err says why the check could not be made.
	Err string `json:"error,omitempty"`
}

// RetainedAge is how much older than the fault's start the retained set
// the new primary served was, by the clock (negative: newer).
func (c StateCheck) RetainedAge(start time.Time) time.Duration { return start.Sub(c.Clock) }

// seedState seeds pr's primary with the plan, starts the clock on it, and
// waits until the standby's node's hub holds a snapshot of it all.
func (r *runner) seedState(ctx context.Context, pr *pairRun) error {
	name, addr, err := primaryAddr(ctx, pr)
	if err != nil {
		return err
	}
	st := pr.state
	if err := brokerstate.Seed(ctx, addr, st.plan); err != nil {
		return fmt.Errorf("seed %s: %w", name, err)
	}
	if st.clock, err = brokerstate.StartClock(ctx, addr, st.plan.Topic("clock"), clockEvery); err != nil {
		return fmt.Errorf("the clock on %s: %w", name, err)
	}
	st.pod = name
	return r.awaitSnapshot(ctx, pr)
}

// awaitSnapshot waits until the agent of pr's standby's node says its hub
// took in a snapshot of the primary's broker holding the whole plan and
// the clock, from now on: the failover's state is there before the fault,
// and its retained age is defined (a snapshot taken before the clock's
// first value would leave a new primary without one).
func (r *runner) awaitSnapshot(ctx context.Context, pr *pairRun) error {
	ag := r.agents[pr.at[1].Name]
	if ag == nil {
		return fmt.Errorf("no agent on %s", pr.at[1].Name)
	}
	lines, unsub := ag.Subscribe()
	defer unsub()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		select {
		case l := <-lines:
			if strings.HasPrefix(l.Msg, "broker state") && testbed.SnapshotHolds(l, pr.state.pod, pr.state.plan.WithClock()) {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("%s: no snapshot of %s holding the plan in the hub on %s: %w", pr.p.Namespace, pr.state.pod, pr.at[1].Name, ctx.Err())
		}
	}
}

// checkState reads what pr's new primary holds after a fault begun at
// start that took its primary away: the clock's value, the plan, and how
// the agents said the state went. Then it seeds the new primary again.
func (r *runner) checkState(ctx context.Context, pr *pairRun, start time.Time) (StateCheck, error) {
	st := pr.state
	c := StateCheck{Acked: st.clock.Stop()}
	c.Handover, c.Why, c.SnapshotAge = r.handover(pr.p.Namespace, start)
	name, addr, err := primaryAddr(ctx, pr)
	if err != nil {
		return c, err
	}
	var unread []string
	if at, ok, err := brokerstate.ReadClock(ctx, addr, st.plan.Topic("clock")); err != nil {
		unread = append(unread, fmt.Sprintf("the clock on %s: %v", name, err))
	} else if ok {
		c.Clock = at
	}
	if res, err := brokerstate.Check(ctx, addr, st.plan); err != nil {
		unread = append(unread, fmt.Sprintf("the plan on %s: %v", name, err))
	} else {
		c.RetainedLost, c.SessionsLost, c.QoS1Lost, c.Duplicates = res.RetainedLost, len(res.SessionsLost), res.QueuedLost, res.Duplicates
	}
	c.Err = strings.Join(unread, "; ")
	return c, r.seedState(ctx, pr)
}

// primaryAddr is the name and MQTT address of pr's primary's pod.
func primaryAddr(ctx context.Context, pr *pairRun) (name, addr string, err error) {
	if name, err = pr.p.PodOf(ctx, pr.roles[0]); err != nil {
		return "", "", err
	}
	pod, err := pr.p.Client.CoreV1().Pods(pr.p.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", "", err
	}
	return name, brokerstate.Addr(pod), nil
}

// handover is the last thing the agents said of the handover of a pair of
// namespace ns since start: StateCarried (its kind and snapshot age) or
// StateNotCarried (why).
func (r *runner) handover(ns string, start time.Time) (kind, why string, age time.Duration) {
	var last time.Time
	for _, ag := range r.agents {
		for _, l := range ag.Lines() {
			if l.Msg != "decision" || !strings.HasPrefix(l.Deployment, ns+"/") || l.Time.Before(start) || l.Time.Before(last) {
				continue
			}
			switch l.Action {
			case "StateCarried":
				var f struct {
					Kind        string `json:"kind"`
					SnapshotAge int64  `json:"snapshot_age"` // slog's JSON: nanoseconds
				}
				_ = json.Unmarshal([]byte(l.Raw), &f)
				kind, why, age, last = f.Kind, "", time.Duration(f.SnapshotAge), l.Time
			case "StateNotCarried":
				var f struct {
					Why string `json:"why"`
				}
				_ = json.Unmarshal([]byte(l.Raw), &f)
				kind, why, age, last = "not carried", f.Why, 0, l.Time
			}
		}
	}
	if last.IsZero() {
		return "none said", "", 0
	}
	return kind, why, age
}

// broken says which of the broker-state promises (DESIGN.md, "Broker
// state") the check shows broken for a fault begun at start: the state
// carried, the final one at a switchover, a snapshot no older than
// maxAge at a failover; and, as the plan was seeded and a snapshot of it
// was in the standby's hub long before the fault, none of it lost. The one
// exception DESIGN.md makes: with the hub's state lost (hubLost: the
// standby's node's agent killed within the fault) the state may be given
// up, said in a StateNotCarried, and what it held is then lost.
func (c StateCheck) broken(start time.Time, maxAge time.Duration, hubLost bool) []string {
	var out []string
	if c.Err != "" {
		out = append(out, "not read: "+c.Err)
	}
	switch c.Handover {
	case "final", "snapshot":
	case "not carried":
		if hubLost {
			return out
		}
		out = append(out, "not carried: "+c.Why)
	default:
		out = append(out, "the agents said neither StateCarried nor StateNotCarried")
	}
	if c.Err == "" && c.RetainedLost+c.SessionsLost+c.QoS1Lost > 0 {
		out = append(out, fmt.Sprintf("lost %d retained messages, %d sessions and %d queued QoS 1 messages of the plan", c.RetainedLost, c.SessionsLost, c.QoS1Lost))
	}
	switch {
	case c.Err != "":
	case c.Clock.IsZero():
		out = append(out, "the new primary serves no retained clock")
	case c.Handover == "final" && c.Acked.After(c.Clock):
		out = append(out, fmt.Sprintf("the switchover lost retained values: the old primary acknowledged the clock at %s, the new one serves %s",
			stamp(c.Acked), stamp(c.Clock)))
	case c.Handover == "snapshot" && c.RetainedAge(start) > maxAge:
		out = append(out, fmt.Sprintf("the retained set is %.2f s older than the fault (bound %v)", c.RetainedAge(start).Seconds(), maxAge))
	}
	return out
}

// Summary says in a line what the check found, for a fault begun at start.
func (c StateCheck) Summary(start time.Time) string {
	what := c.Handover
	switch {
	case c.Handover == "snapshot":
		what += fmt.Sprintf(" (%v old at the failover)", c.SnapshotAge.Round(time.Millisecond))
	case c.Why != "":
		what += " (" + c.Why + ")"
	}
	clock := "no retained clock"
	if !c.Clock.IsZero() {
		clock = fmt.Sprintf("the retained clock %.2f s before the fault, %.2f s before the last value acknowledged", c.RetainedAge(start).Seconds(), c.Acked.Sub(c.Clock).Seconds())
	}
	s := fmt.Sprintf("%s; %s; lost %d retained, %d sessions, %d QoS 1; %d duplicates", what, clock, c.RetainedLost, c.SessionsLost, c.QoS1Lost, c.Duplicates)
	if c.Err != "" {
		s += "; " + c.Err
	}
	return s
}
