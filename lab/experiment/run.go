package experiment

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/amf-edge/amf/actuate"
	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/testbed"
	"github.com/amf-edge/amf/podsignal"
)

// record collects what happens during one run, from the agent's log, the
// pods' container events (as the kubelet reports them) and the watches, each
// with its own timestamp.
type record struct {
	ns, primaryPod string
	// stateful: the run's pair carries its broker's state (Mode.stateful).
	stateful bool

	mu           sync.Mutex
	standbyReady time.Time
	// newPrimaryReady is when the standby's pod was first Ready: for a
	// stateful pair, once it runs on the retired primary's state.
	newPrimaryReady time.Time
	ooms            []time.Time
	restarts        int
	lines           []testbed.AgentLine
	// agentLog is every line the agent logged during the run, whatever it
	// speaks of (its hub's lines name a pod, not a Deployment), as logged.
	agentLog     []string
	memory       []sample
	scores       []sample
	sidecarModel string // the primary's sidecar's /status "model"
}

type sample struct {
	at time.Time
	v  float64
}

func (r *record) consumeNode(ch <-chan kubenode.Event) {
	for ev := range ch {
		if ev.Namespace != r.ns || ev.Pod != r.primaryPod || ev.Container != testbed.BrokerContainer {
			continue
		}
		r.mu.Lock()
		switch ev.Type {
		case kubenode.EventOOMKilled:
			r.ooms = append(r.ooms, ev.Time)
		case kubenode.EventRestarted:
			r.restarts++
		}
		r.mu.Unlock()
	}
}

func (r *record) consumeAgent(ch <-chan testbed.AgentLine) {
	for l := range ch {
		r.mu.Lock()
		r.agentLog = append(r.agentLog, l.Raw)
		if l.Namespace == r.ns || l.Deployment == r.ns+"/"+testbed.PrimaryName || l.Deployment == r.ns+"/"+testbed.StandbyName {
			r.lines = append(r.lines, l)
		}
		r.mu.Unlock()
	}
}

// writeAgentLog writes the agent's lines of the run so far to file: the
// evidence behind the run's figures, kept beside the node's logs.
func (r *record) writeAgentLog(file string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return os.WriteFile(file, []byte(strings.Join(r.agentLog, "\n")+"\n"), 0o644)
}

func (r *record) setStandbyReady(t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.standbyReady.IsZero() {
		r.standbyReady = t
	}
}

func (r *record) setNewPrimaryReady(t time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.newPrimaryReady.IsZero() {
		r.newPrimaryReady = t
	}
}

func (r *record) addMemory(t time.Time, v float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.memory = append(r.memory, sample{t, v})
}

func (r *record) addScore(t time.Time, v float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.scores = append(r.scores, sample{t, v})
}

func (r *record) setSidecarModel(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sidecarModel == "" {
		r.sidecarModel = s
	}
}

// mode runs every run of one mode.
func (e *env) mode(ctx context.Context, m Mode) ([]RunResult, error) {
	if m == Reactive {
		return e.reactive(ctx)
	}
	agent, err := e.startAgent(ctx, m)
	if err != nil {
		return nil, err
	}
	defer agent.Stop()
	runs := e.cfg.Runs
	if m == Healthy {
		runs = 1
	}
	var out []RunResult
	for i := 1; i <= runs; i++ {
		r, err := e.agentRun(ctx, m, i, agent)
		out = append(out, r)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// agentRun is one run with the sidecar and agent (modes amf, observe, healthy).
func (e *env) agentRun(ctx context.Context, m Mode, i int, agent *testbed.AgentPod) (res RunResult, err error) {
	ns := fmt.Sprintf("%s-%d", m, i)
	res = RunResult{Mode: m, Index: i, Namespace: ns, Model: e.model.Name, ModelSHA256: e.model.SHA256}
	defer func() {
		if err != nil {
			res.Error = err.Error()
		}
		if rerr := e.remove(context.WithoutCancel(ctx), ns); rerr != nil && err == nil {
			err = fmt.Errorf("remove namespace %s: %w", ns, rerr)
		}
	}()
	ed, err := e.edge(ns, agent)
	if err != nil {
		return res, err
	}
	ed.Policy = e.resizePolicy(m)
	objs, err := ed.AMF()
	with := "with the sidecar"
	switch {
	case m == AMFNode:
		objs, err = ed.NodeMode()
		with = "in node mode (no sidecar)"
	case m.stateful():
		objs, err = statefulEdge(ed)
		with = "with the sidecar, a stateful pair (persistence on, inject --state-dir " + brokerstate.DataDir + ")"
	}
	if err != nil {
		return res, err
	}
	rec := &record{ns: ns, stateful: m.stateful()}
	lines, unsub := agent.Subscribe()
	defer unsub()
	go rec.consumeAgent(lines)
	defer func() {
		if werr := rec.writeAgentLog(filepath.Join(e.dir, "agent-"+ns+".log")); werr != nil && err == nil {
			err = werr
		}
	}()

	e.progress("%s run %d: primary %s %s, cold standby %s (namespace %s)", m, i, testbed.PrimaryName, with, testbed.StandbyName, ns)
	if err := e.apply(ctx, ns, objs); err != nil {
		return res, err
	}
	// An observing agent never sets the readiness gate, so the pod is never
	// Ready there: its containers are.
	cond := corev1.PodReady
	if m == Observe {
		cond = corev1.ContainersReady
	}
	pod, err := e.waitPod(ctx, ns, testbed.PrimaryName, cond, 2*time.Minute)
	if err != nil {
		return res, err
	}
	rec.primaryPod = pod.Name
	evs, unsubNode := e.node.Subscribe(ctx)
	defer unsubNode()
	go rec.consumeNode(evs)
	if err := e.waitFlow(ctx, time.Minute); err != nil {
		return res, err
	}
	var plan brokerstate.Plan
	if m.stateful() {
		if plan, err = e.seedState(ctx, pod); err != nil {
			return res, err
		}
		e.progress("%s run %d: the primary holds %s", m, i, planText(plan))
	}
	if m == AMFResizeNoRoom {
		tmpl, err := standbyTemplate(objs)
		if err != nil {
			return res, err
		}
		if err := e.fillNode(ctx, ns, tmpl); err != nil {
			return res, err
		}
	}
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	if m.stateful() {
		go e.watchDeployment(runCtx, ns, testbed.StandbyName, standbyMarked, rec.setStandbyReady)
		go func() {
			// Bounded by the run (runCtx), not by this timeout.
			if _, err := e.waitPodReady(runCtx, ns, testbed.StandbyName, time.Hour); err == nil {
				rec.setNewPrimaryReady(time.Now())
			}
		}()
	} else {
		go e.watchDeploymentReady(runCtx, ns, testbed.StandbyName, rec.setStandbyReady)
	}
	if cg, err := e.node.ContainerCgroup(ctx, ns, pod.Name, testbed.BrokerContainer); err == nil {
		go sampleMemory(runCtx, cg, rec.addMemory)
	}
	if m != AMFNode { // node mode has no sidecar to ask: the scores are the agent's
		hc, url, err := e.sidecarStatusClient(ctx, ns, pod.Name)
		if err != nil {
			return res, err
		}
		go sampleScore(runCtx, hc, url, rec.addScore, rec.setSidecarModel)
	}

	f := e.cfg.Fault
	if m == Healthy {
		e.progress("healthy run: %v of normal traffic, no fault", e.cfg.Healthy)
		start := time.Now()
		if err := sleep(ctx, e.cfg.Healthy); err != nil {
			return res, err
		}
		end := time.Now()
		e.analyse(&res, rec, start, start, end)
		if g, ok := e.probe.Snapshot().MaxGap(start, end); ok {
			res.JitterMs = ms(g.Duration())
		}
		return res, nil
	}
	baseline := time.Now()
	e.progress("%s run %d: baseline %v", m, i, f.Baseline)
	if err := sleep(ctx, f.Baseline); err != nil {
		return res, err
	}
	profile, length := f.StressProfile(), f.Stress+f.Overload
	if m == AMFResizeLeak {
		profile, length = e.cfg.Leak.StressProfile(), e.cfg.Leak.Duration
	}
	onset, err := e.injectProfile(ctx, ns, pod.Name, fmt.Sprintf("%s-%d", m, i), profile)
	if err != nil {
		return res, err
	}
	e.progress("%s run %d: fault injected (%s)", m, i, profile)
	if err := sleep(ctx, length+e.cfg.Tail); err != nil {
		return res, err
	}
	e.analyse(&res, rec, baseline, onset, time.Now())
	if m.stateful() {
		// After the run's window, so that the check's clients are not in
		// what the probe measured.
		for _, n := range res.StateNotes {
			e.progress("%s run %d: the agent: %s", m, i, n)
		}
		if res.PrimaryRetired == nil {
			res.StateError = "no switchover: the state was not carried anywhere"
		} else if res.StateCheck, err = e.checkState(ctx, ns, plan); err != nil {
			res.StateError = err.Error()
			return res, err
		}
	}
	e.progress("%s run %d: %s", m, i, res.Line())
	return res, nil
}

// inject starts the staged fault's load inside the broker container's cgroups.
func (e *env) inject(ctx context.Context, ns, pod, name string) (time.Time, error) {
	return e.injectProfile(ctx, ns, pod, name, e.cfg.Fault.StressProfile())
}

// waitFlow waits until the probe's messages go through the path again.
func (e *env) waitFlow(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := e.probe.WaitReceived(ctx, e.probe.Received()+10); err != nil {
		return fmt.Errorf("no messages from RDS to OBU through the edge broker within %v: %w", timeout, err)
	}
	return nil
}

// analyse fills res from the record and the probe's recording. Times are
// seconds after onset.
func (e *env) analyse(res *RunResult, rec *record, baseline, onset, end time.Time) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	res.Onset = onset
	since := func(t time.Time) *float64 {
		if t.IsZero() {
			return nil
		}
		s := t.Sub(onset).Seconds()
		return &s
	}
	primary := rec.ns + "/" + testbed.PrimaryName
	var detection, confirmation, retired, handedOn, carried time.Time
	for _, l := range rec.lines {
		if l.Time.Before(onset) {
			continue
		}
		switch {
		case (l.Msg == "signal" || l.Msg == "transition") && l.Pod == rec.primaryPod && l.To == string(podsignal.Anomalous) && detection.IsZero():
			detection = l.Time
		case l.Msg == "decision" && l.Deployment == primary && l.Action == string(actuate.ActScaleStandby) && confirmation.IsZero():
			confirmation = l.Time
			res.Explanation = l.Explanation
			res.Switchovers++
		case l.Msg == "decision" && l.Deployment == primary && l.Action == string(actuate.ActRetirePrimary) && !l.DryRun && retired.IsZero():
			retired = l.Time
		case l.Msg == "event" && l.Deployment == primary && l.Reason == "ResizeDecided" && res.ResizeDecided == nil:
			res.ResizeDecided, res.ResizeNotes = since(l.Time), append(res.ResizeNotes, l.Reason+": "+l.Note)
		case l.Msg == "event" && l.Deployment == primary && l.Reason == "Resized" && res.Resized == nil:
			res.Resized, res.ResizeNotes = since(l.Time), append(res.ResizeNotes, l.Reason+": "+l.Note)
		case l.Msg == "event" && l.Deployment == primary && (l.Reason == "SwitchoverDecided" || l.Reason == "Failover") && res.SwitchoverNote == "":
			res.SwitchoverNote = l.Reason + ": " + l.Note
		// A handover's lines name the new primary's Deployment.
		case l.Msg == "decision" && l.Action == "HandOnState" && handedOn.IsZero():
			handedOn = l.Time
		case l.Msg == "decision" && l.Action == "StateCarried" && carried.IsZero():
			carried = l.Time
		case l.Msg == "event" && (l.Reason == "StateHandover" || l.Reason == "StateFromSnapshot" || l.Reason == "StateCarried" || l.Reason == "StateNotCarried"):
			res.StateNotes = append(res.StateNotes, l.Reason+": "+l.Note)
		}
	}
	for _, s := range rec.scores {
		if s.at.Before(baseline) {
			continue
		}
		p := s.v
		res.MaxProbability = max(res.MaxProbability, p)
		res.Timeline = append(res.Timeline, Point{T: s.at.Sub(onset).Seconds(), Probability: &p})
	}
	for _, s := range rec.memory {
		v := s.v
		res.Timeline = append(res.Timeline, Point{T: s.at.Sub(onset).Seconds(), MemoryPct: &v})
	}
	oom := rec.firstOOMLocked(onset)
	res.Detection, res.Confirmation, res.PrimaryRetired, res.OOM = since(detection), since(confirmation), since(retired), since(oom)
	if !rec.standbyReady.IsZero() && !rec.standbyReady.Before(onset) {
		res.StandbyReady = since(rec.standbyReady)
	}
	if rec.stateful {
		res.StateHandedOn, res.StateCarried = since(handedOn), since(carried)
		if !rec.newPrimaryReady.IsZero() && !rec.newPrimaryReady.Before(onset) {
			res.NewPrimaryReady = since(rec.newPrimaryReady)
			// Complete when the old primary is retired and the new one
			// serves on its state; the second comes after the first
			// but for a give-up, when the standby serves at once.
			if !retired.IsZero() {
				res.SwitchoverComplete = since(later(retired, rec.newPrimaryReady))
			}
		}
	}
	res.OOMKilled = !oom.IsZero()
	res.Restarts = rec.restarts
	res.SidecarModel = rec.sidecarModel

	r := e.probe.Snapshot()
	if g, ok := r.MaxGap(baseline, onset); ok {
		res.JitterMs = ms(g.Duration())
	}
	for _, g := range r.Gaps() {
		if g.End.After(baseline) && g.Start.Before(end) {
			sent := 0
			for _, sd := range r.Sends {
				if sd.Time.After(g.Start) && sd.Time.Before(g.End) {
					sent++
				}
			}
			res.Gaps = append(res.Gaps, GapAt{Start: g.Start.Sub(onset).Seconds(), End: g.End.Sub(onset).Seconds(), Ms: ms(g.Duration()), Sent: sent})
		}
	}
	if g, ok := r.MaxGap(onset, end); ok {
		res.FaultGapMs = ms(g.Duration())
	}
	res.Duplicates = r.Duplicates(onset, end)
	res.Lost = len(r.Lost(onset, end))
	// The outage is the largest interval between fresh messages around the
	// event, whatever the probe's 250 ms threshold (a restart on loopback can
	// be shorter than it).
	switch {
	case !oom.IsZero():
		res.SOTAt = "oom"
		if g, ok := r.MaxGap(oom, oom.Add(e.cfg.Tail)); ok {
			res.SOTMs = ms(g.Duration())
		}
	case !retired.IsZero():
		res.SOTAt = "cut-over"
		from := retired
		if !rec.standbyReady.IsZero() && rec.standbyReady.Before(from) {
			from = rec.standbyReady
		}
		if g, ok := r.MaxGap(from, retired.Add(e.cfg.Tail)); ok {
			res.SOTMs = ms(g.Duration())
		}
	}
}

func (r *record) firstOOMLocked(t time.Time) time.Time {
	for _, o := range r.ooms {
		if !o.Before(t) {
			return o
		}
	}
	return time.Time{}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// sleep waits d: the experiment's schedule (phases of the fault), not a
// synchronisation.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// reactive runs consecutive injections into one plain broker Deployment, as
// Kubernetes alone handles them: the kernel OOM-kills the container, the
// kubelet restarts it with its back-off, so each outage is longer.
func (e *env) reactive(ctx context.Context) (out []RunResult, err error) {
	const ns = "reactive"
	defer func() {
		if rerr := e.remove(context.WithoutCancel(ctx), ns); rerr != nil && err == nil {
			err = fmt.Errorf("remove namespace %s: %w", ns, rerr)
		}
	}()
	ed, err := e.edge(ns, nil)
	if err != nil {
		return nil, err
	}
	objs, err := ed.Reactive()
	if err != nil {
		return nil, err
	}
	e.progress("reactive: %s alone, no sidecar, no agent, no standby (namespace %s)", testbed.PrimaryName, ns)
	if err := e.apply(ctx, ns, objs); err != nil {
		return nil, err
	}
	f := e.cfg.Fault
	runs := e.cfg.Runs
	if e.cfg.ReactiveRuns > 0 {
		runs = e.cfg.ReactiveRuns
	}
	for i := 1; i <= runs; i++ {
		res := RunResult{Mode: Reactive, Index: i, Namespace: ns}
		err := func() error {
			// After a crash the container waits out its back-off (up to 5 min).
			pod, err := e.waitPodReady(ctx, ns, testbed.PrimaryName, 7*time.Minute)
			if err != nil {
				return err
			}
			if err := e.waitFlow(ctx, 7*time.Minute); err != nil {
				return err
			}
			rec := &record{ns: ns, primaryPod: pod.Name}
			evs, unsub := e.node.Subscribe(ctx)
			defer unsub()
			go rec.consumeNode(evs)
			runCtx, stopRun := context.WithCancel(ctx)
			defer stopRun()
			if cg, err := e.node.ContainerCgroup(ctx, ns, pod.Name, testbed.BrokerContainer); err == nil {
				go sampleMemory(runCtx, cg, rec.addMemory)
			}
			baseline := time.Now()
			e.progress("reactive run %d: baseline %v", i, f.Baseline)
			if err := sleep(ctx, f.Baseline); err != nil {
				return err
			}
			onset, err := e.inject(ctx, ns, pod.Name, fmt.Sprintf("reactive-%d", i))
			if err != nil {
				return err
			}
			e.progress("reactive run %d: fault injected (stress %v, then over the limit for %v)", i, f.Stress, f.Overload)
			if err := sleep(ctx, f.Stress+f.Overload); err != nil {
				return err
			}
			// The outage lasts until the restarted broker carries traffic again.
			if err := e.waitFlow(ctx, 7*time.Minute); err != nil {
				return err
			}
			if err := sleep(ctx, e.cfg.Tail/3); err != nil {
				return err
			}
			e.analyse(&res, rec, baseline, onset, time.Now())
			e.progress("reactive run %d: %s", i, res.Line())
			return nil
		}()
		if err != nil {
			res.Error = err.Error()
			out = append(out, res)
			return out, err
		}
		out = append(out, res)
	}
	return out, nil
}
