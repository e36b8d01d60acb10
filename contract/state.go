package contract

import (
	"encoding/json"
	"fmt"
	"time"
)

// The kinds of a broker state carried to a new primary (Handover.Kind).
const (
	// StateFinal: the file the retired broker wrote as it stopped; a
	// planned switchover carries it.
	StateFinal = "final"
	// StateSnapshot: the newest file written while the broker served; a
	// failover carries it, and what came after it is lost.
	StateSnapshot = "snapshot"
)

// Handover is the value of AnnHandover: the state the new primary's pod
// is to run on before it serves. It lives on the Deployment rather than in
// one agent's memory because the agent that retires the primary and the
// one whose node runs the new primary's pod are two when the pair spans
// two nodes, and so that an agent started again finds it.
type Handover struct {
	// From is the retired primary's Deployment, whose pods' states are
	// taken.
	From string `json:"from"`
	// Pod is the new primary's pod that takes the state.
	Pod string `json:"pod"`
	// Kind is StateFinal or StateSnapshot.
	Kind string `json:"kind"`
	// At is the retirement.
	At time.Time `json:"at"`
}

// String is h as an annotation's value.
func (h Handover) String() string {
	b, _ := json.Marshal(h) // strings and a time: cannot fail
	return string(b)
}

// ParseHandover reads an AnnHandover value.
func ParseHandover(s string) (Handover, error) {
	var h Handover
	if err := json.Unmarshal([]byte(s), &h); err != nil {
		return Handover{}, fmt.Errorf("annotation %s: %w", AnnHandover, err)
	}
	if h.Kind != StateFinal && h.Kind != StateSnapshot {
		return Handover{}, fmt.Errorf("annotation %s: kind %q, want %q or %q", AnnHandover, h.Kind, StateFinal, StateSnapshot)
	}
	for what, name := range map[string]string{"from": h.From, "pod": h.Pod} {
		if msgs := dns1123Subdomain(name); len(msgs) > 0 {
			return Handover{}, fmt.Errorf("annotation %s: %s %q: %s", AnnHandover, what, name, msgs[0])
		}
	}
	if h.At.IsZero() {
		return Handover{}, fmt.Errorf("annotation %s: no time (at)", AnnHandover)
	}
	return h, nil
}
