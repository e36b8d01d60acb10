package experiment

import (
	"bufio"
	"cmp"
	"compress/gzip"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/lab/corpus"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/testbed"
)

// CorpusConfig configures Corpus.
type CorpusConfig struct {
	Seed      uint64
	PerFamily int      // runs per family (default 1)
	Families  []string // default: every family of package corpus
	// Parallel is how many runs may load the machine at once (default 2; each
	// is one broker container under its profile's load).
	Parallel int
	// Pods is how many brokers may run at once (default 4 × Parallel): the
	// runs beyond Parallel are in their quiet lead-ins, timed (corpus.Schedule)
	// so that each one's load begins as a slot comes free.
	Pods int
	// Horizon labels a sample 1 when the failure comes within it (default 120 s).
	Horizon time.Duration
	// Scale multiplies every phase's and burst's duration (default 1; ramp
	// rates are kept, so a shortened ramp may stop short of its target).
	Scale float64
	// LeadIn lengthens every run's quiet baseline (corpus.LeadIn: fixed, or
	// drawn per run from a range), so the feature windows have an age when
	// the load begins. Applied after Scale.
	LeadIn corpus.LeadIn
	// Append adds the runs to the corpus already in Out instead of writing a
	// new one; it refuses runs Out already has, another header, seed or lead-in.
	Append bool
	// Base carries Out, Repo, Bin, Log and Progress (its modes are ignored).
	Base Config
}

// CorpusRun is what one corpus run recorded, for runs.json.
type CorpusRun struct {
	ID      string `json:"id"`
	Family  string `json:"family"`
	Failing bool   `json:"failing_family"`
	Seed    uint64 `json:"seed"`
	Profile string `json:"profile"`
	// LeadIn is how much the planned baseline was lengthened (empty: no
	// --lead-in); Profile includes it. LeadInSpec is the --lead-in it was
	// drawn from ("0s-10m0s"; corpora recorded before ranges have only
	// LeadIn, their fixed spec).
	LeadIn     string    `json:"lead_in,omitempty"`
	LeadInSpec string    `json:"lead_in_spec,omitempty"`
	Onset      time.Time `json:"onset"`
	// Traffic is the planned MQTT bursts (corpus.Traffic's form), Bursts
	// what they did.
	Traffic string        `json:"traffic,omitempty"`
	Bursts  []BurstRecord `json:"bursts,omitempty"`
	// Failure is when the container failed (the OOM kill, or its exit), and
	// FailureKind what it was; none for a healthy run.
	Failure     *time.Time `json:"failure,omitempty"`
	FailureKind string     `json:"failure_kind,omitempty"`
	Samples     int        `json:"samples"`
	// MaxSampleGap is the longest time between two samples (seconds; the
	// sampler asks every 1 s). Well over 1 s means the machine was short of
	// CPU, and then so was the broker: its CPU features are distorted.
	MaxSampleGap float64 `json:"max_sample_gap_s"`
	Error        string  `json:"error,omitempty"`
}

// contendedGap is the sample gap over which a run is reported as recorded
// on a machine short of CPU.
const contendedGap = 2 * time.Second

// CorpusHeader is the corpus CSV's header: the replay format's raw columns
// (amf-sidecar replay recomputes features with any windows from them), then
// the run and its label.
var CorpusHeader = []string{"run", "family", "time", "cpu_seconds_total", "memory_bytes", "memory_limit_bytes",
	"network_bytes_total", "disk_bytes_total", "since_onset_s", "time_to_failure_s", "label"}

// BurstRecord is what one traffic burst did.
type BurstRecord struct {
	Start     time.Time `json:"start"`
	End       time.Time `json:"end"`
	Published int       `json:"published"` // messages the broker took (QoS 1: acknowledged)
	Delivered int       `json:"delivered"` // receipts, all subscribers together
}

// Files of a corpus folder.
const (
	corpusCSV  = "corpus.csv.gz"
	corpusRuns = "runs.json"
	// appendPart holds an appended run's rows (a gzip member without header)
	// until the runs are merged into the corpus.
	appendPart = "corpus.csv.gz.append"
)

// Corpus runs the planned corpus and writes <Out>/corpus.csv.gz (one row per
// sample, every run) and <Out>/runs.json, or adds to them (Append).
func Corpus(ctx context.Context, cc CorpusConfig) ([]CorpusRun, error) {
	if cc.PerFamily <= 0 {
		cc.PerFamily = 1
	}
	if cc.Parallel <= 0 {
		cc.Parallel = 2
	}
	if cc.Pods <= 0 {
		cc.Pods = 4 * cc.Parallel
	}
	if cc.Horizon <= 0 {
		cc.Horizon = 120 * time.Second
	}
	plan, err := cc.Plan()
	if err != nil {
		return nil, err
	}
	cfg := cc.Base
	cfg.Modes = []Mode{Reactive}
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	// Before the control plane: a refused append must not cost a setup.
	if cc.Append {
		if _, err := checkAppend(cfg.Out, cc.Seed, cc.LeadIn, plan); err != nil {
			return nil, err
		}
	}
	if err := CanRun(); err != nil {
		return nil, fmt.Errorf("corpus: %w", err)
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, err
	}
	rowsPath := filepath.Join(cfg.Out, corpusCSV)
	if cc.Append {
		rowsPath = filepath.Join(cfg.Out, appendPart)
	}
	w, err := createRows(rowsPath, !cc.Append)
	if err != nil {
		return nil, err
	}
	// An early return (no control plane) leaves no stray rows beside a corpus
	// being appended to.
	defer w.abort(cc.Append)
	// The corpus folder is meant to be committed: the control plane's data and
	// the logs go elsewhere, kept only when a run failed.
	if cfg.Work == "" {
		if cfg.Work, err = os.MkdirTemp("", "amf-corpus-work-"); err != nil {
			return nil, err
		}
	}
	env, err := setup(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	failed := false
	defer func() {
		env.close()
		if failed {
			env.progress("control plane data and logs kept in %s", cfg.Work)
		} else if cc.Base.Work == "" {
			os.RemoveAll(cfg.Work)
		}
	}()

	out := make([]CorpusRun, len(plan))
	record := func(i int, r CorpusRun, rows [][]string, err error) {
		if !cc.LeadIn.IsZero() {
			r.LeadIn, r.LeadInSpec = plan[i].LeadIn.String(), cc.LeadIn.String()
		}
		if err != nil {
			r.Error = err.Error()
			failed, env.keepState = true, true
		}
		out[i] = r
		w.write(rows)
		contended := ""
		if r.MaxSampleGap > contendedGap.Seconds() {
			contended = fmt.Sprintf(" (samples %.1f s apart: the machine was short of CPU, this run's CPU is distorted)", r.MaxSampleGap)
		}
		env.progress("corpus %d/%d %s: lead-in %v, %d samples%s, failure %s %s", i+1, len(plan), r.ID, plan[i].LeadIn, r.Samples, contended, r.FailureKind, r.Error)
	}
	env.progress("corpus: %d runs, %d loading and %d brokers at once: about %v if every run lasts as planned",
		len(plan), cc.Parallel, cc.Pods, corpus.Estimate(plan, cc.Parallel, cc.Pods, setupAllowance).Round(time.Minute))
	runCorpusSchedule(ctx, corpus.NewSchedule(plan, cc.Parallel, cc.Pods, setupAllowance),
		func(ctx context.Context, i int, onset func(time.Time)) func() {
			r, rows, err := env.corpusRun(ctx, plan[i], cc.Horizon, onset)
			return func() { record(i, r, rows, err) }
		})
	if err := w.close(); err != nil {
		return out, err
	}
	if !cc.Append {
		return out, errors.Join(writeRuns(filepath.Join(cfg.Out, corpusRuns), out), ctx.Err())
	}
	// An interrupted append would leave holes in the corpus: its rows stay
	// aside, and the corpus as it was.
	if err := ctx.Err(); err != nil {
		return out, fmt.Errorf("corpus: interrupted, nothing appended (the new rows are in %s): %w", rowsPath, err)
	}
	return out, appendCorpus(cfg.Out, cc.Seed, cc.LeadIn, rowsPath, out)
}

// setupAllowance is how long a run's broker may take to come Ready, for the
// schedule, until the run's onset says how long it took.
const setupAllowance = 30 * time.Second

// runCorpusSchedule starts each run when the schedule says, in a goroutine
// of its own, tells the schedule each one's onset and end, and returns when
// every started run has ended; once ctx is done it starts none. The finish a
// run returns is called on the caller's goroutine, one at a time, so what it
// records needs no lock.
func runCorpusSchedule(ctx context.Context, s *corpus.Schedule, run func(ctx context.Context, i int, onset func(time.Time)) (finish func())) {
	type onsetAt struct {
		i  int
		at time.Time
	}
	type ended struct {
		i      int
		finish func()
	}
	var (
		onsets  = make(chan onsetAt)
		ends    = make(chan ended)
		running int
		stop    = ctx.Done()
	)
	for {
		var wait time.Duration
		if ctx.Err() == nil {
			i, ok, w := s.Next(time.Now())
			if ok {
				running++
				go func() {
					finish := run(ctx, i, func(at time.Time) { onsets <- onsetAt{i, at} })
					ends <- ended{i, finish}
				}()
				continue
			}
			wait = w
		}
		if running == 0 && (s.Left() == 0 || ctx.Err() != nil) {
			return
		}
		var timer *time.Timer
		var fire <-chan time.Time
		if wait > 0 {
			timer = time.NewTimer(wait)
			fire = timer.C
		}
		select {
		case o := <-onsets:
			s.Onset(o.i, o.at)
		case e := <-ends:
			running--
			s.Done(e.i)
			e.finish()
		case <-fire:
		case <-stop:
			stop = nil // from now on only the running runs' ends
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// Plan is the runs Corpus records: the seeded plan, scaled, each run with
// its lead-in (what --list prints).
func (cc CorpusConfig) Plan() ([]corpus.Run, error) {
	plan, err := corpus.Plan(cc.Seed, max(cc.PerFamily, 1), cc.Families...)
	if err != nil {
		return nil, err
	}
	for i := range plan {
		if cc.Scale > 0 && cc.Scale != 1 {
			if plan[i], err = plan[i].Scale(cc.Scale); err != nil {
				return nil, err
			}
		}
		if plan[i], err = cc.LeadIn.Apply(plan[i]); err != nil {
			return nil, err
		}
	}
	return plan, nil
}

// rowsFile is a gzip-compressed CSV of corpus rows being written.
type rowsFile struct {
	f  *os.File
	zw *gzip.Writer
	w  *csv.Writer
}

// createRows creates path, starting with the header when header is set (an
// appended gzip member has none: the corpus's first member has it).
func createRows(path string, header bool) (*rowsFile, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	zw := gzip.NewWriter(f)
	rf := &rowsFile{f: f, zw: zw, w: csv.NewWriter(zw)}
	if header {
		rf.write([][]string{CorpusHeader})
	}
	return rf, nil
}

// write adds rows; errors surface at close (csv.Writer keeps the first).
func (rf *rowsFile) write(rows [][]string) {
	for _, row := range rows {
		_ = rf.w.Write(row)
	}
	rf.w.Flush()
}

func (rf *rowsFile) close() error {
	rf.w.Flush()
	err := errors.Join(rf.w.Error(), rf.zw.Close(), rf.f.Close())
	rf.f = nil
	return err
}

// abort closes the file, and removes it if asked, unless close was called.
func (rf *rowsFile) abort(remove bool) {
	if rf.f == nil {
		return
	}
	rf.f.Close()
	if remove {
		os.Remove(rf.f.Name())
	}
}

func writeRuns(path string, runs []CorpusRun) error {
	b, err := json.MarshalIndent(runs, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// readCorpus reads the runs of the corpus in dir and checks its CSV's header.
func readCorpus(dir string) ([]CorpusRun, error) {
	b, err := os.ReadFile(filepath.Join(dir, corpusRuns))
	if err != nil {
		return nil, fmt.Errorf("corpus: no corpus to append to: %w", err)
	}
	var runs []CorpusRun
	if err := json.Unmarshal(b, &runs); err != nil {
		return nil, fmt.Errorf("corpus: %s: %w", filepath.Join(dir, corpusRuns), err)
	}
	f, err := os.Open(filepath.Join(dir, corpusCSV))
	if err != nil {
		return nil, fmt.Errorf("corpus: no corpus to append to: %w", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("corpus: %s: %w", f.Name(), err)
	}
	header, err := csv.NewReader(zr).Read()
	if err != nil {
		return nil, fmt.Errorf("corpus: %s: header: %w", f.Name(), err)
	}
	if !slices.Equal(header, CorpusHeader) {
		return nil, fmt.Errorf("corpus: %s has the header %q, this build writes %q: record a new corpus",
			f.Name(), strings.Join(header, ","), strings.Join(CorpusHeader, ","))
	}
	return runs, nil
}

// checkAppend returns the runs of the corpus in dir if plan can be added to
// it: same header, none of the plan's run IDs there yet, and the corpus's
// runs planned from the same seed with the same --lead-in, each with the
// lead-in this build draws for it (else the result is no corpus one
// invocation would make).
func checkAppend(dir string, seed uint64, leadIn corpus.LeadIn, plan []corpus.Run) ([]CorpusRun, error) {
	have, err := readCorpus(dir)
	if err != nil {
		return nil, err
	}
	for _, r := range have {
		was, err := recordedSpec(r)
		if err != nil {
			return nil, fmt.Errorf("corpus: %s in %s: %w", r.ID, dir, err)
		}
		if was != leadIn {
			return nil, fmt.Errorf("corpus: %s in %s was recorded with --lead-in %v, not %v: windows would be filled differently across runs", r.ID, dir, was, leadIn)
		}
	}
	byID := make(map[string]CorpusRun, len(have))
	last := map[string]int{} // per family, the highest run number
	for _, r := range have {
		byID[r.ID] = r
		if n, err := strconv.Atoi(strings.TrimPrefix(r.ID, r.Family+"-")); err == nil {
			last[r.Family] = max(last[r.Family], n)
		}
	}
	for _, r := range plan {
		if _, ok := byID[r.ID]; ok {
			return nil, fmt.Errorf("corpus: run %s is already in %s: append other families or run numbers", r.ID, dir)
		}
	}
	for fam, n := range last {
		again, err := corpus.Plan(seed, n, fam)
		if err != nil {
			continue // a family this build does not plan: nothing to compare
		}
		for _, r := range again {
			h, ok := byID[r.ID]
			if !ok {
				continue
			}
			if h.Seed != r.Seed {
				return nil, fmt.Errorf("corpus: %s in %s was planned with another --seed than %d", r.ID, dir, seed)
			}
			if h.LeadIn == "" {
				continue
			}
			if got, err := time.ParseDuration(h.LeadIn); err != nil {
				return nil, fmt.Errorf("corpus: %s in %s: lead_in %q: %w", r.ID, dir, h.LeadIn, err)
			} else if want := leadIn.Draw(r); got != want {
				return nil, fmt.Errorf("corpus: %s in %s has a lead-in of %v where this build draws %v from --lead-in %v: record a new corpus with this build", r.ID, dir, got, want, leadIn)
			}
		}
	}
	return have, nil
}

// recordedSpec is the --lead-in a recorded run was drawn from: its spec, or
// for a corpus recorded before ranges its fixed lead-in, or none.
func recordedSpec(r CorpusRun) (corpus.LeadIn, error) {
	spec := cmp.Or(r.LeadInSpec, r.LeadIn)
	if spec == "" {
		return corpus.LeadIn{}, nil
	}
	l, err := corpus.ParseLeadIn(spec)
	if err != nil {
		return corpus.LeadIn{}, fmt.Errorf("runs.json's lead-in: %w", err)
	}
	return l, nil
}

// appendCorpus adds the runs and the rows in part (a gzip member without
// header) to the corpus in dir, checking again that they fit (the corpus may
// have changed during a long recording), then removes part. runs.json is
// replaced only once the rows are in, so a failure leaves at worst rows no
// run lists, never a listed run without rows.
func appendCorpus(dir string, seed uint64, leadIn corpus.LeadIn, part string, runs []CorpusRun) error {
	plan := make([]corpus.Run, len(runs))
	for i, r := range runs {
		plan[i] = corpus.Run{ID: r.ID, Family: r.Family, Seed: r.Seed}
	}
	have, err := checkAppend(dir, seed, leadIn, plan)
	if err != nil {
		return fmt.Errorf("%w (the new rows are in %s)", err, part)
	}
	src, err := os.Open(part)
	if err != nil {
		return err
	}
	defer src.Close()
	tmp := filepath.Join(dir, corpusRuns+".tmp")
	if err := writeRuns(tmp, append(have, runs...)); err != nil {
		return err
	}
	// gzip readers (Go's, gzip -d, Python's) read concatenated members as one
	// stream, so appending the member appends the rows.
	dst, err := os.OpenFile(filepath.Join(dir, corpusCSV), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return fmt.Errorf("corpus: append the rows: %w", err)
	}
	if err := errors.Join(dst.Sync(), dst.Close()); err != nil {
		return fmt.Errorf("corpus: append the rows: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, corpusRuns)); err != nil {
		return err
	}
	return os.Remove(part)
}

// corpusRun runs one profile in a fresh broker Deployment and records the
// broker container's raw counters every second, as the sidecar samples them
// (`amf-sidecar sample --pid`), until the container fails or the profile ends.
// onset is told the onset as soon as the profile has started.
func (e *env) corpusRun(ctx context.Context, run corpus.Run, horizon time.Duration, onset func(time.Time)) (res CorpusRun, rows [][]string, err error) {
	res = CorpusRun{ID: run.ID, Family: run.Family, Failing: run.Failing, Seed: run.Seed, Profile: run.Profile.String(),
		Traffic: run.Traffic.String()}
	ns := "corpus-" + run.ID
	defer func() {
		if rerr := e.remove(context.WithoutCancel(ctx), ns); rerr != nil && err == nil {
			err = fmt.Errorf("remove namespace %s: %w", ns, rerr)
		}
	}()
	ed, err := e.edge(ns, nil)
	if err != nil {
		return res, nil, err
	}
	ed.ClientPrefix = ns
	objs, err := ed.Reactive()
	if err != nil {
		return res, nil, err
	}
	if err := e.apply(ctx, ns, objs); err != nil {
		return res, nil, err
	}
	pod, err := e.waitPodReady(ctx, ns, testbed.PrimaryName, 2*time.Minute)
	if err != nil {
		return res, nil, err
	}
	evs, unsub := e.node.Subscribe(ctx)
	defer unsub()
	failed := make(chan kubenode.Event, 1)
	go func() {
		for ev := range evs {
			if ev.Namespace == ns && ev.Pod == pod.Name && ev.Container == testbed.BrokerContainer &&
				(ev.Type == kubenode.EventOOMKilled || ev.Type == kubenode.EventExited) {
				select {
				case failed <- ev:
				default:
				}
			}
		}
	}()
	cg, err := e.node.ContainerCgroup(ctx, ns, pod.Name, testbed.BrokerContainer)
	if err != nil {
		return res, nil, err
	}
	pid, err := firstPID(cg)
	if err != nil {
		return res, nil, err
	}
	sctx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	// The kill's time: the kubelet reports the container's end in whole
	// seconds (the API's FinishedAt), the cgroup's OOM watch to the
	// millisecond, before the kubelet has noticed.
	ooms, err := cgroup.WatchOOM(sctx, filepath.Join(memoryRoot, cg))
	if err != nil {
		return res, nil, err
	}
	var firstOOM atomic.Pointer[time.Time]
	go func() {
		for ev := range ooms {
			t := ev.Time
			firstOOM.CompareAndSwap(nil, &t)
		}
	}()
	sampler := exec.CommandContext(sctx, e.cfg.Bin.Sidecar, "sample", "--pid", strconv.Itoa(pid), "--interval", "1s")
	stdout, err := sampler.StdoutPipe()
	if err != nil {
		return res, nil, err
	}
	if err := sampler.Start(); err != nil {
		return res, nil, fmt.Errorf("start amf-sidecar sample: %w", err)
	}
	var samples []sampleLine
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var l sampleLine
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				samples = append(samples, l)
			}
		}
	}()
	// A baseline is the profile's first phase; the onset is the injector's start.
	res.Onset, err = e.injectProfile(ctx, ns, pod.Name, run.ID, run.Profile.String())
	if err != nil {
		return res, nil, err
	}
	onset(res.Onset)
	trafficDone := make(chan error, 1)
	if len(run.Traffic) > 0 {
		// From outside the container, as clients reach a broker: only the
		// broker's own work is charged to its cgroup.
		url := brokerURL(pod, ed.BrokerPortA)
		go func() {
			var terr error
			res.Bursts, terr = publishTraffic(sctx, url, ns, res.Onset, run.Traffic)
			trafficDone <- terr
		}()
	} else {
		trafficDone <- nil
	}
	select {
	case ev := <-failed:
		t := ev.Time
		res.Failure, res.FailureKind = &t, "oom-killed"
		if ev.Type == kubenode.EventExited {
			res.FailureKind = "exited: " + ev.Reason
		} else if at := firstOOM.Load(); at != nil && at.Sub(t).Abs() < time.Second {
			// The same kill, to the millisecond (FinishedAt is truncated to
			// the second; the process ends a moment after the kill).
			res.Failure = at
		}
		err = sleep(ctx, 3*time.Second) // the samples up to the kill
	case <-time.After(run.Profile.Duration() + corpus.Tail):
	case <-ctx.Done():
		err = ctx.Err()
	}
	stopSampling()
	// The bursts end before the profile; cut short, they only matter when the
	// broker was healthy.
	if terr := <-trafficDone; terr != nil && err == nil && res.Failure == nil && !errors.Is(terr, context.Canceled) {
		err = fmt.Errorf("traffic: %w", terr)
	}
	<-done
	_ = sampler.Wait()
	for i, s := range samples {
		if res.Failure != nil && s.Time.After(*res.Failure) {
			break
		}
		rows = append(rows, s.row(run, res, horizon))
		if i > 0 {
			res.MaxSampleGap = max(res.MaxSampleGap, math.Round(s.Time.Sub(samples[i-1].Time).Seconds()*1000)/1000)
		}
	}
	res.Samples = len(rows)
	return res, rows, err
}

// injectProfile starts `amf-lab stress --profile` inside the broker
// container's cgroups (as kubectl exec would) and returns its start: the onset.
func (e *env) injectProfile(ctx context.Context, ns, pod, name, profile string) (time.Time, error) {
	log, err := os.Create(filepath.Join(e.dir, "stress-"+name+".log"))
	if err != nil {
		return time.Time{}, err
	}
	onset := time.Now()
	cmd, err := e.node.Exec(ctx, ns, pod, testbed.BrokerContainer, []string{stressPath, "stress", "--memory-file", "--profile", profile}, log, log)
	if err != nil {
		log.Close()
		return time.Time{}, fmt.Errorf("start the profile in %s/%s: %w", ns, pod, err)
	}
	go func() {
		_ = cmd.Wait()
		log.Close()
	}()
	return onset, nil
}

// memoryRoot is the v1 memory hierarchy the node's container cgroups are in.
const memoryRoot = "/sys/fs/cgroup/memory"

// firstPID is a process of a v1 container cgroup (its memory hierarchy).
func firstPID(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(memoryRoot, dir, "cgroup.procs"))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("no process in %s", dir)
	}
	return strconv.Atoi(f[0])
}

// sampleLine is the part of an `amf-sidecar sample` line the corpus keeps.
type sampleLine struct {
	Time time.Time `json:"time"`
	Raw  struct {
		CPUSeconds       float64  `json:"cpu_seconds_total"`
		MemoryBytes      float64  `json:"memory_bytes"`
		MemoryLimitBytes float64  `json:"memory_limit_bytes"`
		NetworkBytes     *float64 `json:"network_bytes_total"`
		DiskBytes        float64  `json:"disk_bytes_total"`
	} `json:"raw"`
}

func (s sampleLine) row(run corpus.Run, res CorpusRun, horizon time.Duration) []string {
	g := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	netw := ""
	if s.Raw.NetworkBytes != nil {
		netw = g(*s.Raw.NetworkBytes)
	}
	ttf, label := "", "0"
	if res.Failure != nil {
		d := res.Failure.Sub(s.Time)
		ttf = strconv.FormatFloat(d.Seconds(), 'f', 3, 64)
		if d <= horizon {
			label = "1"
		}
	}
	return []string{run.ID, run.Family, strconv.FormatFloat(float64(s.Time.UnixNano())/1e9, 'f', 3, 64),
		g(s.Raw.CPUSeconds), g(s.Raw.MemoryBytes), g(s.Raw.MemoryLimitBytes), netw, g(s.Raw.DiskBytes),
		strconv.FormatFloat(s.Time.Sub(res.Onset).Seconds(), 'f', 3, 64), ttf, label}
}

// publishTraffic plays the bursts against the broker at url, each at onset +
// its start, and returns what each did.
func publishTraffic(ctx context.Context, url, clientID string, onset time.Time, traffic corpus.Traffic) ([]BurstRecord, error) {
	var recs []BurstRecord
	for i, b := range traffic {
		if err := sleep(ctx, time.Until(onset.Add(b.Start))); err != nil {
			return recs, err
		}
		rec, err := publishBurst(ctx, url, fmt.Sprintf("%s-burst%d", clientID, i+1), b)
		recs = append(recs, rec)
		if err != nil {
			return recs, fmt.Errorf("burst %d (%v): %w", i+1, b, err)
		}
	}
	return recs, nil
}

// burstWindow bounds the messages in flight (QoS 1: not yet acknowledged), so
// a broker slower than the rate paces the publisher instead of the
// publisher's memory growing.
const burstWindow = 256

// publishBurst connects the burst's subscribers and a publisher, publishes at
// the burst's rate for its duration on a topic the broker does not bridge
// (only set/# and get/# cross), and disconnects them.
func publishBurst(ctx context.Context, url, id string, b corpus.Burst) (rec BurstRecord, err error) {
	topic := "corpus/burst/" + id
	var clients []mqtt.Client
	defer func() {
		for _, c := range clients {
			c.Disconnect(250)
		}
	}()
	connect := func(id string) (mqtt.Client, error) {
		c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(url).SetClientID(id).SetCleanSession(true).
			SetAutoReconnect(false).SetConnectTimeout(5 * time.Second).SetWriteTimeout(5 * time.Second).
			SetKeepAlive(30 * time.Second))
		if err := wait(c.Connect()); err != nil {
			return nil, fmt.Errorf("connect %s to %s: %w", id, url, err)
		}
		clients = append(clients, c)
		return c, nil
	}
	var delivered atomic.Int64
	for j := range b.Subscribers {
		c, err := connect(fmt.Sprintf("%s-sub%d", id, j+1))
		if err != nil {
			return rec, err
		}
		if err := wait(c.Subscribe(topic, b.QoS, func(mqtt.Client, mqtt.Message) { delivered.Add(1) })); err != nil {
			return rec, fmt.Errorf("subscribe %s: %w", topic, err)
		}
	}
	pub, err := connect(id + "-pub")
	if err != nil {
		return rec, err
	}

	inflight := make(chan mqtt.Token, burstWindow)
	var (
		acks   int
		ackErr error
		acked  = make(chan struct{})
	)
	go func() {
		defer close(acked)
		for tok := range inflight {
			if err := wait(tok); err != nil {
				ackErr = cmp.Or(ackErr, err)
			} else {
				acks++
			}
		}
	}()
	payload := make([]byte, b.Size) // its content does not matter to the counters
	rec.Start = time.Now()
	end := rec.Start.Add(b.Duration)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	sent := 0
send:
	for now := rec.Start; now.Before(end); {
		// Catch up to the rate since the start: ticks are coarse and a busy
		// broker slows sending down.
		for due := int(now.Sub(rec.Start).Seconds() * float64(b.Rate)); sent < due && time.Now().Before(end); sent++ {
			select {
			case inflight <- pub.Publish(topic, b.QoS, false, payload):
			case <-ctx.Done():
				break send
			}
		}
		select {
		case now = <-tick.C:
		case <-ctx.Done():
			break send
		}
	}
	close(inflight)
	<-acked
	rec.End, rec.Published = time.Now(), acks
	// Let the subscribers get what is still on its way.
	for want := int64(acks * b.Subscribers); delivered.Load() < want && time.Since(rec.End) < 2*time.Second; {
		time.Sleep(20 * time.Millisecond)
	}
	rec.Delivered = int(delivered.Load())
	return rec, errors.Join(ackErr, ctx.Err())
}

// wait waits for a paho token, bounded: with auto-reconnect off a lost
// connection fails the token, the bound is for a broker that stops answering.
func wait(tok mqtt.Token) error {
	if !tok.WaitTimeout(30 * time.Second) {
		return errors.New("no answer from the broker in 30 s")
	}
	return tok.Error()
}
