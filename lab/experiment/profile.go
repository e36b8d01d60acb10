package experiment

import (
	"fmt"
	"time"
)

// Fault is the staged fault of the paper: a baseline, then memory and CPU stress
// below the limit (the anomaly window), then memory over the limit (OOM).
type Fault struct {
	Baseline time.Duration // no stress; the healthy window for jitter
	Stress   time.Duration // phase 1
	Overload time.Duration // phase 2
	// Phase 1 load: memory held and CPU burnt (fraction of one core; the paper's
	// 80 % of the 500m limit is 0.4).
	StressMemory string
	StressCPU    float64
	// Phase 2: memory grows from StressMemory to OverloadMemory at OverloadRamp.
	OverloadMemory, OverloadRamp string
}

// PaperFault is the published profile: 60 s, 120 s (≈60 Mi, 80 % of 500m), 60 s over 100 Mi.
var PaperFault = Fault{
	Baseline: 60 * time.Second, Stress: 120 * time.Second, Overload: 60 * time.Second,
	StressMemory: "60Mi", StressCPU: 0.4, OverloadMemory: "160Mi", OverloadRamp: "10Mi/s",
}

// Scaled shortens every phase by factor (0 < factor ≤ 1 for quick runs).
func (f Fault) Scaled(factor float64) Fault {
	s := func(d time.Duration) time.Duration { return time.Duration(float64(d) * factor).Round(time.Millisecond) }
	f.Baseline, f.Stress, f.Overload = s(f.Baseline), s(f.Stress), s(f.Overload)
	return f
}

// StressProfile is the `amf-lab stress --profile` of the two stress phases.
func (f Fault) StressProfile() string {
	return fmt.Sprintf("%s:mem=%s,cpu=%g;%s:mem=%s,ramp=%s",
		f.Stress, f.StressMemory, f.StressCPU, f.Overload, f.OverloadMemory, f.OverloadRamp)
}

// Leak is a memory leak from the fault's onset: memory climbs at Ramp
// towards Memory for Duration, past any limit a broker would be given; no
// CPU load.
type Leak struct {
	Duration     time.Duration
	Memory, Ramp string
}

// LeakFault is the amf-resize-leak mode's fault: memory climbs from the
// onset at the staged fault's own overload rate, 10 MiB/s, for 60 s, past
// the limit and past a 512 Mi ceiling: no resize absorbs it.
var LeakFault = Leak{Duration: 60 * time.Second, Memory: "1Gi", Ramp: "10Mi/s"}

// StressProfile is the `amf-lab stress --profile` of the leak.
func (l Leak) StressProfile() string {
	return fmt.Sprintf("%s:mem=%s,ramp=%s", l.Duration, l.Memory, l.Ramp)
}
