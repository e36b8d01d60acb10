package actuate

import (
	"fmt"
	"time"
)

// Resizing in place is the cheapest remedy for a predicted memory
// exhaustion: nothing disconnects and the broker keeps what it holds. The
// Gate tries it before a switchover when the workload allows it (a memory
// ceiling, contract.AnnMemoryCeiling) and it can help: memory is the
// pressure (climbing, or above half the limit: a step that stopped), the
// limit is below the ceiling, and the room the ceiling gives lasts longer
// at the memory's current slope than a switchover could take to complete
// (hold, plus ready-timeout unless the standby is Ready) — a leak that
// would use the room up sooner is only postponed by it, so the switchover
// starts at once instead. The limit goes to the ceiling at once. The
// resize is done when the kubelet reports the new limit in the pod's
// status (InResize, read by the driver) and the sidecar reads it from the
// container's cgroup (a sample's MemoryLimit); a refusal (PodResizePending
// Deferred or Infeasible, or the API's), or no effect within
// ResizeTimeout, puts the old size back in the spec and switches over. A
// crash during it fails over at once, as always. At most one resize per
// cool-down: an anomaly that comes back after one switches over.

// Resize is a resize in place in progress, persisted in the Record.
type Resize struct {
	// Pod is the primary's pod whose broker container is resized.
	Pod string `json:"pod"`
	// From and To are the container's memory limit before and after, bytes.
	From int64 `json:"from"`
	To   int64 `json:"to"`
	// Kubelet: the pod's status reports To. Sidecar: a sample of the pod
	// read To from the container's cgroup.
	Kubelet bool `json:"kubelet,omitempty"`
	Sidecar bool `json:"sidecar,omitempty"`
}

// ResizeApplied returns the InResize input of a pod whose status reports
// the new limit.
func ResizeApplied(at time.Time) Input { return Input{Kind: InResize, At: at, Applied: true} }

// ResizeRefused returns the InResize input of a resize the kubelet or the
// API refused; why says which and why.
func ResizeRefused(at time.Time, why string) Input {
	return Input{Kind: InResize, At: at, Refused: why}
}

// resize starts a resize in place for the confirming sample in, if the
// policy allows one and it can help. It returns no actions and, when the
// workload has a ceiling, why not (for the switchover's Event).
func (g *Gate) resize(in Input) (acts []Action, noResize string) {
	r := &g.Rec
	ceiling := int64(g.Policy.MemoryCeiling)
	if ceiling == 0 || (r.Phase != PhaseIdle && r.Phase != PhaseSuspect) {
		return nil, ""
	}
	// The current slope when the sidecar sends it; an older sidecar's
	// memory_growth_rate (ten minutes) otherwise, which lags a new leak.
	slopeOf, slopeP := "memory_slope_bytes_per_second", in.MemorySlope
	if slopeP == nil {
		slopeOf, slopeP = "memory_growth_rate", in.MemoryGrowth
	}
	if in.MemoryLimit <= 0 || in.MemoryPercent == nil || slopeP == nil {
		return nil, "no resize in place: the sample says nothing of the container's memory limit and slope"
	}
	limit, pct, slope := in.MemoryLimit, *in.MemoryPercent, *slopeP // slope: bytes per second
	// Memory is the pressure when it climbs, or when it holds more than
	// half the limit after a step: an anomaly of CPU or I/O is not cured
	// by memory.
	if slope <= 0 && pct < 50 {
		return nil, fmt.Sprintf("no resize in place: memory is neither climbing (%s %.3g) nor above half its limit (%.1f%%)", slopeOf, slope, pct)
	}
	if !r.LastResize.IsZero() && in.At.Before(r.LastResize.Add(g.Policy.Gates.Cooldown)) {
		return nil, fmt.Sprintf("no resize in place: resized at %s, within the cool-down of %v", r.LastResize.UTC().Format(time.RFC3339), g.Policy.Gates.Cooldown)
	}
	usage := pct / 100 * limit
	// The time a switchover may take once decided: a resize must give more
	// room than the slope uses in it, or it only delays the switchover.
	// Hold, and the ready timeout unless the standby is Ready already.
	bound := g.Policy.Gates.Hold
	if !r.StandbyReady {
		bound += g.Policy.Gates.ReadyTimeout
	}
	// Straight to the ceiling: it is what the user lets the broker have,
	// and one resize that buys the most time beats steps that each cost a
	// decision (and, within a cool-down, leave a switchover as the answer).
	to := ceiling
	if to <= int64(limit) {
		return nil, fmt.Sprintf("no resize in place: the limit %s is at the ceiling %s", mib(limit), mib(float64(ceiling)))
	}
	enough := "for as long as it stops there"
	if slope > 0 {
		lasts := time.Duration((float64(to) - usage) / slope * float64(time.Second))
		if lasts < bound {
			return nil, fmt.Sprintf("no resize in place: at %s/s, %s would be used up in %v, before a switchover could complete (%v)",
				mib(slope), mib(float64(to)), lasts.Round(time.Second), bound)
		}
		enough = "for " + lasts.Round(time.Second).String()
	}
	r.Phase, r.Decision, r.Why = PhaseResizing, in.At, in.Why
	r.Resize = Resize{Pod: in.Pod, From: int64(limit), To: to}
	return []Action{
		event("ResizeDecided", "%d consecutive anomalous samples%s, memory at %.1f%% of %s, its slope %s/s: raising the memory limit of %s to the ceiling %s in place, enough %s",
			r.Anomalous, drivenBy(in.Why), pct, mib(limit), mib(slope), in.Pod, mib(float64(to)), enough),
		{Kind: ActResize, Memory: to, Pod: in.Pod},
	}, ""
}

// resizeSeen takes a sample during a resize: the sidecar's view of the new
// limit, read from the container's cgroup.
func (g *Gate) resizeSeen(in Input) []Action {
	rz := &g.Rec.Resize
	if in.Pod == rz.Pod && in.MemoryLimit >= float64(rz.To) {
		rz.Sidecar = true
	}
	return g.resizeDone(in.At)
}

// resized takes the kubelet's answer to the resize.
func (g *Gate) resized(in Input) []Action {
	r := &g.Rec
	if r.Phase != PhaseResizing {
		return nil
	}
	if in.Refused != "" {
		return g.resizeFailed(in.At, "resize refused: "+in.Refused)
	}
	r.Resize.Kubelet = in.Applied
	return g.resizeDone(in.At)
}

func (g *Gate) resizeDone(now time.Time) []Action {
	r := &g.Rec
	rz := r.Resize
	if !rz.Kubelet || !rz.Sidecar {
		return nil
	}
	took := now.Sub(r.Decision).Round(time.Millisecond)
	r.Phase, r.Decision, r.Anomalous, r.Resize, r.LastResize, r.Why = PhaseIdle, time.Time{}, 0, Resize{}, now, ""
	return []Action{
		{Kind: ActKeepSize, Memory: rz.To, Pod: rz.Pod},
		event("Resized", "the memory limit of %s is %s, in the pod's status and in its cgroup, %v after the decision: no switchover",
			rz.Pod, mib(float64(rz.To)), took),
	}
}

func (g *Gate) resizeTimedOut(now time.Time) []Action {
	r := &g.Rec
	if now.Before(r.Decision.Add(g.Policy.Gates.ResizeTimeout)) {
		return nil
	}
	rz := r.Resize
	return g.resizeFailed(now, fmt.Sprintf("resize not in effect within %v (in the pod's status: %v, in its cgroup: %v)",
		g.Policy.Gates.ResizeTimeout, rz.Kubelet, rz.Sidecar))
}

// resizeFailed puts the old size back in the spec (a deferred resize would
// otherwise apply later, to a pod being retired or kept) and switches over.
func (g *Gate) resizeFailed(now time.Time, why string) []Action {
	r := &g.Rec
	back := Action{Kind: ActResize, Memory: r.Resize.From, Pod: r.Resize.Pod}
	acts := g.switchover(now, r.Why, why)
	return append([]Action{back}, acts...)
}

// mib renders bytes for an Event.
func mib(b float64) string { return fmt.Sprintf("%.4gMi", b/(1<<20)) }
