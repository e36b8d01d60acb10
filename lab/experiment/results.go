package experiment

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/amf-edge/amf/lab/testbed"
)

// RunResult is what one run measured. Times are seconds after the fault's
// onset; nil means it did not happen.
type RunResult struct {
	Mode      Mode      `json:"mode"`
	Index     int       `json:"run"`
	Namespace string    `json:"namespace"`
	Onset     time.Time `json:"onset"`
	// Model is the sidecars' model (an embedded name, or the model file's
	// path as given) and ModelSHA256 its sha256; SidecarModel is what the
	// primary's sidecar reported in /status: source, sha256, and the reason
	// if it fell back to its default. None in reactive runs (no sidecar).
	Model        string `json:"model,omitempty"`
	ModelSHA256  string `json:"model_sha256,omitempty"`
	SidecarModel string `json:"sidecar_model,omitempty"`

	Detection    *float64 `json:"detection_s"`    // first anomalous signal of the primary
	Confirmation *float64 `json:"confirmation_s"` // the agent's scale-up decision (debounce passed)
	// StandbyReady is when the standby could take over: its Deployment has
	// a Ready replica; for a stateful pair, whose standby is held out of its
	// Services, the agent names its pod in amf.io/standby-ready.
	StandbyReady *float64 `json:"standby_ready_s"`
	// PrimaryRetired is the agent's retire decision: a stateless pair's
	// switchover complete.
	PrimaryRetired *float64 `json:"primary_retired_s"`
	OOM            *float64 `json:"oom_s"` // the broker container OOM-killed

	// A stateful pair's (the amf mode's) switchover, as the agent's
	// decisions say it: the retired primary's state handed on to the new
	// primary's pod, which runs on it (state carried); its pod Ready
	// (serving on the state); the switchover complete when both the old
	// primary is retired and the new one serves. StateNotes are the
	// agent's Events of the handover (StateHandover, StateCarried or
	// StateNotCarried), each its reason first.
	StateHandedOn      *float64 `json:"state_handed_on_s,omitempty"`
	StateCarried       *float64 `json:"state_carried_s,omitempty"`
	NewPrimaryReady    *float64 `json:"new_primary_ready_s,omitempty"`
	SwitchoverComplete *float64 `json:"switchover_complete_s,omitempty"`
	StateNotes         []string `json:"state_notes,omitempty"`
	// StateCheck is what the new primary held of the state seeded before
	// the fault (state_retained_lost, state_sessions_lost, state_qos1_lost,
	// state_duplicates, beside what was seeded); nil when not checked, and
	// StateError then says why.
	*StateCheck
	StateError string `json:"state_error,omitempty"`

	// The amf-resize modes: the agent's ResizeDecided and Resized Events
	// (ResizeNotes their texts, the reason first), and the Event that began
	// a switchover or failover (SwitchoverNote, its reason first).
	ResizeDecided  *float64 `json:"resize_decided_s,omitempty"`
	Resized        *float64 `json:"resized_s,omitempty"`
	ResizeNotes    []string `json:"resize_notes,omitempty"`
	SwitchoverNote string   `json:"switchover_note,omitempty"`

	OOMKilled bool `json:"oom_killed"`
	Restarts  int  `json:"restarts"`
	// JitterMs is the largest gap between messages in the healthy window before
	// the fault; SOTMs the end-to-end service outage: the largest gap overlapping
	// the event (the OOM, or the cut-over from standby Ready to Tail after the
	// retire), SOTAt which.
	JitterMs float64 `json:"jitter_ms"`
	SOTMs    float64 `json:"sot_ms"`
	SOTAt    string  `json:"sot_at,omitempty"`
	// FaultGapMs is the largest interval between fresh messages from the
	// onset to the run's end, whatever happened: a resize that spares the
	// clients shows the healthy jitter here.
	FaultGapMs float64 `json:"fault_gap_ms"`
	Gaps       []GapAt `json:"gaps"`       // every gap over the probe's threshold from the baseline on
	Duplicates int     `json:"duplicates"` // messages the OBU received twice (both edge brokers bridged)
	Lost       int     `json:"lost"`
	// Explanation is what drove the scale-up decision, as its decision line
	// says (the top features, or predict_linear's time to the limit).
	Explanation string `json:"explanation,omitempty"`
	// Switchovers counts scale-up decisions (healthy mode: false switchovers).
	Switchovers    int     `json:"switchovers"`
	MaxProbability float64 `json:"max_probability"`
	Timeline       []Point `json:"timeline,omitempty"`
	Error          string  `json:"error,omitempty"`
}

// GapAt is a gap between messages at the OBU, in seconds after onset.
type GapAt struct {
	Start float64 `json:"start_s"`
	End   float64 `json:"end_s"`
	Ms    float64 `json:"ms"`
	// Sent is how many messages the publisher sent during the gap: about one
	// per 100 ms when the path was down, none when the publisher itself stalled.
	Sent int `json:"sent"`
}

// Point is a timeline sample: the primary's anomaly probability (its
// sidecar's /status) or its memory use in % of the limit.
type Point struct {
	T           float64  `json:"t"`
	Probability *float64 `json:"p,omitempty"`
	MemoryPct   *float64 `json:"mem_pct,omitempty"`
}

// Results is the whole experiment.
type Results struct {
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Node     NodeInfo  `json:"node"`
	Fault    Fault     `json:"fault"`
	// ResizeCeiling and Leak are the amf-resize modes' (absent without them).
	ResizeCeiling string `json:"resize_ceiling,omitempty"`
	Leak          *Leak  `json:"leak,omitempty"`
	// StatePlan is what a stateful pair's primary held before the fault
	// (absent without the amf mode).
	StatePlan string         `json:"state_plan,omitempty"`
	Bridge    testbed.Bridge `json:"bridge"`
	Runs      []RunResult    `json:"runs"`
	Error     string         `json:"error,omitempty"`
}

// NodeInfo is the node the pods ran on, as its Node object reports it.
type NodeInfo struct {
	Name    string `json:"name"`
	Kubelet string `json:"kubelet"` // status.nodeInfo.kubeletVersion
	Runtime string `json:"runtime"` // status.nodeInfo.containerRuntimeVersion
	// Cgroup and CgroupDriver are the node's hierarchy (v1, v2) and the
	// driver its kubelet and runtime use (cgroupfs, systemd): the Node
	// object does not say them, the lab that made the node does.
	Cgroup       string `json:"cgroup"`
	CgroupDriver string `json:"cgroup_driver"`
}

// Line is a one-line summary of a run for the progress output.
func (r RunResult) Line() string {
	var b strings.Builder
	for _, f := range []struct {
		name string
		v    *float64
	}{{"detection", r.Detection}, {"resize decided", r.ResizeDecided}, {"resized", r.Resized}, {"confirmation", r.Confirmation}, {"standby Ready", r.StandbyReady}, {"primary retired", r.PrimaryRetired},
		{"state handed on", r.StateHandedOn}, {"state carried", r.StateCarried}, {"new primary Ready", r.NewPrimaryReady}, {"switchover complete", r.SwitchoverComplete}, {"OOM", r.OOM}} {
		if f.v != nil {
			fmt.Fprintf(&b, "%s %+.1f s, ", f.name, *f.v)
		}
	}
	fmt.Fprintf(&b, "restarts %d, E2E SOT %.0f ms", r.Restarts, r.SOTMs)
	if r.SOTAt != "" {
		fmt.Fprintf(&b, " (%s)", r.SOTAt)
	}
	fmt.Fprintf(&b, ", largest gap after onset %.0f ms, jitter %.0f ms, duplicates %d", r.FaultGapMs, r.JitterMs, r.Duplicates)
	switch {
	case r.StateCheck != nil:
		fmt.Fprintf(&b, "; state on the new primary: %s", r.StateCheck.text())
	case r.StateError != "":
		fmt.Fprintf(&b, "; state not checked: %s", r.StateError)
	}
	return b.String()
}

func (res *Results) write(dir string) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), b, 0o644); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "summary.md"))
	if err != nil {
		return err
	}
	res.Summary(f)
	if err := f.Close(); err != nil {
		return err
	}
	return res.plots(dir)
}

func opt(v *float64, format string) string {
	if v == nil {
		return "–"
	}
	return fmt.Sprintf(format, *v)
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// Paper's reactive outages per consecutive crash (only the first and the fifth
// are published).
var paperReactiveSOT = map[int]string{1: "2.67", 5: "83.31"}

// Summary writes the tables beside the paper's figures (markdown).
func (res *Results) Summary(w io.Writer) {
	f := res.Fault
	if res.Node.Kubelet != "" {
		fmt.Fprintf(w, "Node: %s, kubelet %s, %s.\n\n", res.Node.Name, res.Node.Kubelet, res.Node.Runtime)
	}
	fmt.Fprintf(w, "Fault: baseline %v, stress %v (%s, %.0f %% of a core), over the limit %v; bridges keepalive_interval %d s, restart_timeout %d s.\n\n",
		f.Baseline, f.Stress, f.StressMemory, 100*f.StressCPU, f.Overload, res.Bridge.KeepaliveInterval, res.Bridge.RestartTimeout)
	by := map[Mode][]RunResult{}
	for _, r := range res.Runs {
		by[r.Mode] = append(by[r.Mode], r)
	}
	if runs := by[Reactive]; len(runs) > 0 {
		fmt.Fprintln(w, "Reactive (Kubernetes restart only):")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| run | OOM | OOM at (s) | restarts | E2E SOT (s) | paper E2E SOT (s) |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|")
		for _, r := range runs {
			p := paperReactiveSOT[r.Index]
			if p == "" {
				p = "–"
			}
			fmt.Fprintf(w, "| %d | %s | %s | %d | %.2f | %s |\n", r.Index, yes(r.OOMKilled), opt(r.OOM, "%.1f"), r.Restarts, r.SOTMs/1000, p)
		}
		fmt.Fprintln(w)
	}
	for _, m := range []Mode{AMF, AMFNode} {
		runs := by[m]
		if len(runs) == 0 {
			continue
		}
		title := "AMF (make-before-break switchover; times in s after the fault's onset):"
		if m == AMFNode {
			title = "AMF in node mode (no sidecar: the agent runs the pipeline; make-before-break switchover; times in s after the fault's onset):"
		}
		fmt.Fprintln(w, title)
		fmt.Fprintln(w)
		modelLine(w, runs)
		fmt.Fprintln(w, "| run | detection | confirmation | standby Ready | switchover complete | OOM | max E2E SOT at cut-over (ms) | duplicates at OBU | healthy jitter (ms) |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|")
		for _, r := range runs {
			sot := "–"
			if r.SOTAt != "" {
				sot = fmt.Sprintf("%.0f", r.SOTMs)
			}
			fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s | %s | %d | %.0f |\n", r.Index, opt(r.Detection, "%.1f"), opt(r.Confirmation, "%.1f"),
				opt(r.StandbyReady, "%.1f"), opt(complete(r), "%.1f"), oomCell(r), sot, r.Duplicates, r.JitterMs)
		}
		fmt.Fprintln(w, "| paper | 14 | 18–27 | – | 34–42 | no | ≤ 1050 (two runs < 250) | – | ≈ 1000 |")
		fmt.Fprintln(w, "| target | – | ≤ 8 | – | ≤ 25 | no | ≤ 250 | – | – |")
		fmt.Fprintln(w)
		explanations(w, runs)
		stateTable(w, res, runs)
	}
	resizeTable(w, res, by)
	if runs := by[Observe]; len(runs) > 0 {
		fmt.Fprintln(w, "Observe (the agent decides but never acts; times in s after the fault's onset):")
		fmt.Fprintln(w)
		modelLine(w, runs)
		fmt.Fprintln(w, "| run | detection | confirmation (would scale up) | OOM | lead time: OOM − confirmation (s) | E2E SOT at the OOM (ms) |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|")
		for _, r := range runs {
			lead := "–"
			if r.OOM != nil && r.Confirmation != nil {
				lead = fmt.Sprintf("%.1f", *r.OOM-*r.Confirmation)
			}
			fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %.0f |\n", r.Index, opt(r.Detection, "%.1f"), opt(r.Confirmation, "%.1f"), oomCell(r), lead, r.SOTMs)
		}
		fmt.Fprintln(w)
	}
	if runs := by[Healthy]; len(runs) > 0 {
		fmt.Fprintln(w, "Healthy (normal traffic, no fault; the full loop running):")
		fmt.Fprintln(w)
		modelLine(w, runs)
		fmt.Fprintln(w, "| run | switchovers (false) | max anomaly probability | largest gap (ms) |")
		fmt.Fprintln(w, "|---|---|---|---|")
		for _, r := range runs {
			fmt.Fprintf(w, "| %d | %d | %.3f | %.0f |\n", r.Index, r.Switchovers, r.MaxProbability, r.JitterMs)
		}
		fmt.Fprintln(w)
	}
	for _, r := range res.Runs {
		if r.Error != "" {
			fmt.Fprintf(w, "%s run %d failed: %s\n", r.Mode, r.Index, r.Error)
		}
	}
}

// modelLine says which model a mode's sidecars ran, and what any sidecar
// reported otherwise (a fallback to its default, another build's model).
func modelLine(w io.Writer, runs []RunResult) {
	var models []string
	for _, r := range runs {
		if m := fmt.Sprintf("%s (sha256 %.12s)", r.Model, r.ModelSHA256); r.Model != "" && !slices.Contains(models, m) {
			models = append(models, m)
		}
	}
	if len(models) == 0 {
		return
	}
	fmt.Fprintf(w, "Model: %s.\n", strings.Join(models, ", "))
	for _, r := range runs {
		if r.SidecarModel != "" && !strings.Contains(r.SidecarModel, "sha256:"+r.ModelSHA256) {
			fmt.Fprintf(w, "Run %d: the sidecar reported %s.\n", r.Index, r.SidecarModel)
		}
	}
	fmt.Fprintln(w)
}

func oomCell(r RunResult) string {
	if !r.OOMKilled {
		return "no"
	}
	return "yes, " + opt(r.OOM, "%.1f")
}

// explanations lists what drove each run's switchover, as the agent's
// decision line said it.
func explanations(w io.Writer, runs []RunResult) {
	var said bool
	for _, r := range runs {
		if r.Explanation == "" {
			continue
		}
		if !said {
			fmt.Fprintln(w, "What drove each switchover (the agent's decision line):")
			fmt.Fprintln(w)
			said = true
		}
		fmt.Fprintf(w, "- run %d: %s\n", r.Index, r.Explanation)
	}
	if said {
		fmt.Fprintln(w)
	}
}

// resizeTable puts the amf-resize modes' runs beside today's AMF (the amf
// mode's runs of the same experiment): what answered the fault, when, and
// what the clients saw.
func resizeTable(w io.Writer, res *Results, by map[Mode][]RunResult) {
	modes := []Mode{AMF, AMFResize, AMFResizeLeak, AMFResizeNoRoom}
	if len(by[AMFResize])+len(by[AMFResizeLeak])+len(by[AMFResizeNoRoom]) == 0 {
		return
	}
	fmt.Fprintf(w, "Resize in place first (amf.io/memory-ceiling %s) beside today's AMF; amf-resize-leak's fault is a leak (%s), the others the staged fault; amf-resize-noroom's node has no room for the resize (times in s after the fault's onset):\n\n", res.ResizeCeiling, leakText(res.Leak))
	fmt.Fprintln(w, "| mode | run | detection | resize decided | resized | switchover decided | standby Ready | switchover complete | OOM | largest gap after onset (ms) | lost |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, m := range modes {
		for _, r := range by[m] {
			fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %.0f | %d |\n", m, r.Index, opt(r.Detection, "%.1f"), opt(r.ResizeDecided, "%.1f"), opt(r.Resized, "%.1f"),
				opt(r.Confirmation, "%.1f"), opt(r.StandbyReady, "%.1f"), opt(r.PrimaryRetired, "%.1f"), oomCell(r), r.FaultGapMs, r.Lost)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "What the agent said (its Events):")
	fmt.Fprintln(w)
	for _, m := range modes[1:] {
		for _, r := range by[m] {
			for _, n := range append(slices.Clone(r.ResizeNotes), r.SwitchoverNote) {
				if n != "" {
					fmt.Fprintf(w, "- %s run %d: %s\n", m, r.Index, n)
				}
			}
		}
	}
	fmt.Fprintln(w)
}

// complete is when a run's switchover completed: a stateful pair's once
// the new primary serves on the state, a stateless pair's at the retirement.
func complete(r RunResult) *float64 {
	if r.SwitchoverComplete != nil {
		return r.SwitchoverComplete
	}
	return r.PrimaryRetired
}

// stateTable says, for the runs of a stateful pair, what became of the
// broker's state: when the handover's steps came, and what the new primary
// held of what the old one did.
func stateTable(w io.Writer, res *Results, runs []RunResult) {
	var stateful []RunResult
	for _, r := range runs {
		if r.StateCheck != nil || r.StateError != "" || r.StateCarried != nil {
			stateful = append(stateful, r)
		}
	}
	if len(stateful) == 0 {
		return
	}
	fmt.Fprintf(w, "The broker's state across the switchover (a stateful pair: Mosquitto with persistence on, inject --standby --state-dir; before the fault the primary held %s; times in s after the fault's onset, the break from the retirement to the new primary Ready):\n\n", res.StatePlan)
	fmt.Fprintln(w, "| run | standby ready (held) | primary retired | state handed on | state carried | new primary Ready | switchover complete | break (s) | retained lost | sessions lost | QoS 1 lost | duplicates |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range stateful {
		brk := "–"
		if r.PrimaryRetired != nil && r.NewPrimaryReady != nil {
			brk = fmt.Sprintf("%.2f", *r.NewPrimaryReady-*r.PrimaryRetired)
		}
		lost := [4]string{"–", "–", "–", "–"}
		if c := r.StateCheck; c != nil {
			lost = [4]string{fmt.Sprintf("%d of %d", c.StateRetainedLost, c.StateRetained), fmt.Sprintf("%d of %d", c.StateSessionsLost, c.StateSessions),
				fmt.Sprintf("%d of %d", c.StateQoS1Lost, c.StateQoS1), strconv.Itoa(c.StateDuplicates)}
		}
		fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Index, opt(r.StandbyReady, "%.1f"), opt(r.PrimaryRetired, "%.1f"),
			opt(r.StateHandedOn, "%.1f"), opt(r.StateCarried, "%.1f"), opt(r.NewPrimaryReady, "%.1f"), opt(r.SwitchoverComplete, "%.1f"), brk, lost[0], lost[1], lost[2], lost[3])
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "What the agent said of the state (its Events):")
	fmt.Fprintln(w)
	for _, r := range stateful {
		for _, n := range r.StateNotes {
			fmt.Fprintf(w, "- run %d: %s\n", r.Index, n)
		}
		if r.StateError != "" {
			fmt.Fprintf(w, "- run %d: not checked: %s\n", r.Index, r.StateError)
		}
	}
	fmt.Fprintln(w)
}

func leakText(l *Leak) string {
	if l == nil {
		return "none run"
	}
	return l.StressProfile()
}
