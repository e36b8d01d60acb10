package sidecar

import (
	"fmt"
	"path/filepath"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/pause"
	"github.com/amf-edge/amf/podsignal"
)

// fence is the sidecar's side of the node agent's fence (DESIGN.md, "Losing
// a whole node"), owned by the loop goroutine: while the agent's latest
// command is a fence, the broker's processes are held stopped, at every
// sample again (a process forked meanwhile, a restarted container), until
// the agent lifts it or the kubelet stops the container.
type fence struct {
	on     bool   // the agent's latest command is a fence
	reason string // the agent's reason
	// let is the container whose SIGTERM was let through: the kubelet is
	// stopping it, so it is not paused again.
	let  string
	last string // the latest outcome, logged when it changes
}

// command applies the node agent's command c.
func (s *Sidecar) command(c podsignal.Command) {
	if c.Fence {
		s.fence.on, s.fence.reason = true, c.Reason
		s.holdFence()
		return
	}
	was := s.fence.on
	s.fence = fence{}
	if !was {
		return
	}
	outcome := "fence lifted: the broker resumed"
	s.setFence(false, outcome)
	if c := s.pausable(); c != nil {
		if _, err := c.Cont(); err != nil {
			outcome = "fence lifted, but the broker could not be resumed: " + err.Error()
			s.setFence(false, outcome)
			s.cfg.Log.Error("fence lifted, but the broker could not be resumed", "err", err)
		}
	}
	s.cfg.Log.Info("fence lifted by the node agent", "outcome", outcome, "reason", c.Reason)
	// Probe results were not fed to the state machine while fenced (the
	// failures were the fence's own): the latest one counts again.
	if s.probe != nil {
		if r, ok := s.probe.Last(); ok {
			s.apply(s.pipe.Probe(r.OK, r.Reason), nil)
		}
	}
}

// holdFence pauses the broker while the fence is on: at the command and at
// every sample after it. A container that has a SIGTERM waiting is being
// stopped by the kubelet (its pod deleted after a guard took over), so it
// is resumed to end as asked, and not paused again.
func (s *Sidecar) holdFence() {
	if !s.fence.on {
		return
	}
	c := s.pausable()
	if c == nil {
		outcome := "fenced, but the broker cannot be paused: no target with a cgroup of its own"
		s.setFence(true, outcome)
		s.logFence(outcome)
		return
	}
	if c.Leaf == s.fence.let {
		return
	}
	// The status says what is being done before it is done, so whoever sees
	// the broker stop or resume sees the status that explains it; the log
	// says it after.
	if term, err := c.TermPending(); err == nil && term {
		s.fence.let = c.Leaf
		outcome := "fenced; the broker is being stopped (SIGTERM waiting): resumed to end"
		s.setFence(true, outcome)
		if _, err := c.Cont(); err != nil {
			outcome = "fenced; the broker is being stopped, but could not be resumed to end: " + err.Error()
			s.setFence(true, outcome)
		}
		s.logFence(outcome)
		return
	}
	outcome := fmt.Sprintf("fenced by the node agent (%s): the broker is paused", s.fence.reason)
	s.setFence(true, outcome)
	if _, err := c.Stop(); err != nil {
		outcome = "fenced, but the broker is not paused: " + err.Error()
		s.setFence(true, outcome)
	}
	s.logFence(outcome)
}

// pausable is the current target as a pause.Container, or nil without a
// cgroup of its own (process mode).
func (s *Sidecar) pausable() *pause.Container {
	w, ok := s.target.(cgroup.Watched)
	if !ok || w.MemoryDir() == "" {
		return nil
	}
	return &pause.Container{Leaf: filepath.Base(w.MemoryDir())}
}

// setFence records the fence in the status.
func (s *Sidecar) setFence(on bool, outcome string) {
	s.mu.Lock()
	s.status.Fenced, s.status.Fence = on, outcome
	s.mu.Unlock()
}

// logFence logs a fence's outcome that is new (holdFence runs at every
// sample).
func (s *Sidecar) logFence(outcome string) {
	if outcome == s.fence.last {
		return
	}
	s.fence.last = outcome
	s.cfg.Log.Error("fence", "outcome", outcome)
}
