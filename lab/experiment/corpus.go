package experiment

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/amf-edge/amf/lab/corpus"
	"github.com/amf-edge/amf/lab/node"
	"github.com/amf-edge/amf/lab/testbed"
)

// CorpusConfig configures Corpus.
type CorpusConfig struct {
	Seed      uint64
	PerFamily int      // runs per family (default 1)
	Families  []string // default: every family of package corpus
	Parallel  int      // runs at once (default 2; each is one broker container)
	// Horizon labels a sample 1 when the failure comes within it (default 120 s).
	Horizon time.Duration
	// Scale multiplies every phase's duration (default 1; ramp rates are kept,
	// so a shortened ramp may stop short of its target).
	Scale float64
	// Base carries Out, Repo, Bin, Log and Progress (its modes are ignored).
	Base Config
}

// CorpusRun is what one corpus run recorded, for runs.json.
type CorpusRun struct {
	ID      string    `json:"id"`
	Family  string    `json:"family"`
	Failing bool      `json:"failing_family"`
	Seed    uint64    `json:"seed"`
	Profile string    `json:"profile"`
	Onset   time.Time `json:"onset"`
	// Failure is when the container failed (the OOM kill, or its exit), and
	// FailureKind what it was; none for a healthy run.
	Failure     *time.Time `json:"failure,omitempty"`
	FailureKind string     `json:"failure_kind,omitempty"`
	Samples     int        `json:"samples"`
	Error       string     `json:"error,omitempty"`
}

// CorpusHeader is the corpus CSV's header: the replay format's raw columns
// (amf-sidecar replay recomputes features with any windows from them), then
// the run and its label.
var CorpusHeader = []string{"run", "family", "time", "cpu_seconds_total", "memory_bytes", "memory_limit_bytes",
	"network_bytes_total", "disk_bytes_total", "since_onset_s", "time_to_failure_s", "label"}

// Corpus runs the planned corpus and writes <Out>/corpus.csv.gz (one row per
// sample, every run) and <Out>/runs.json.
func Corpus(ctx context.Context, cc CorpusConfig) ([]CorpusRun, error) {
	if cc.PerFamily <= 0 {
		cc.PerFamily = 1
	}
	if cc.Parallel <= 0 {
		cc.Parallel = 2
	}
	if cc.Horizon <= 0 {
		cc.Horizon = 120 * time.Second
	}
	plan, err := corpus.Plan(cc.Seed, cc.PerFamily, cc.Families...)
	if err != nil {
		return nil, err
	}
	if cc.Scale > 0 && cc.Scale != 1 {
		for i := range plan {
			if plan[i].Profile, err = plan[i].Profile.Scale(cc.Scale); err != nil {
				return nil, err
			}
		}
	}
	cfg := cc.Base
	cfg.Modes = []Mode{Reactive}
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	if err := CanRun(); err != nil {
		return nil, fmt.Errorf("corpus: %w", err)
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(cfg.Out, "corpus.csv.gz"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zw := gzip.NewWriter(f)
	w := csv.NewWriter(zw)
	if err := w.Write(CorpusHeader); err != nil {
		return nil, err
	}
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

	var (
		mu   sync.Mutex
		out  = make([]CorpusRun, len(plan))
		jobs = make(chan int)
		wg   sync.WaitGroup
	)
	for range cc.Parallel {
		wg.Go(func() {
			for i := range jobs {
				r, rows, err := env.corpusRun(ctx, plan[i], cc.Horizon)
				mu.Lock()
				if err != nil {
					r.Error = err.Error()
					failed, env.keepState = true, true
				}
				out[i] = r
				for _, row := range rows {
					_ = w.Write(row)
				}
				w.Flush()
				mu.Unlock()
				env.progress("corpus %d/%d %s: %d samples, failure %s %s", i+1, len(plan), r.ID, r.Samples, r.FailureKind, r.Error)
			}
		})
	}
	for i := range plan {
		select {
		case jobs <- i:
		case <-ctx.Done():
		}
	}
	close(jobs)
	wg.Wait()
	w.Flush()
	if err := errors.Join(w.Error(), zw.Close()); err != nil {
		return out, err
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return out, err
	}
	if err := os.WriteFile(filepath.Join(cfg.Out, "runs.json"), b, 0o644); err != nil {
		return out, err
	}
	return out, ctx.Err()
}

// corpusRun runs one profile in a fresh broker Deployment and records the
// broker container's raw counters every second, as the sidecar samples them
// (`amf-sidecar sample --pid`), until the container fails or the profile ends.
func (e *env) corpusRun(ctx context.Context, run corpus.Run, horizon time.Duration) (res CorpusRun, rows [][]string, err error) {
	res = CorpusRun{ID: run.ID, Family: run.Family, Failing: run.Failing, Seed: run.Seed, Profile: run.Profile.String()}
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
	evs, unsub := e.node.Subscribe()
	defer unsub()
	failed := make(chan node.Event, 1)
	go func() {
		for ev := range evs {
			if ev.Namespace == ns && ev.Pod == pod.Name && ev.Container == testbed.BrokerContainer &&
				(ev.Type == node.EventOOMKilled || ev.Type == node.EventExited) {
				select {
				case failed <- ev:
				default:
				}
			}
		}
	}()
	cg, err := e.node.ContainerCgroup(ns, pod.Name, testbed.BrokerContainer)
	if err != nil {
		return res, nil, err
	}
	pid, err := firstPID(cg)
	if err != nil {
		return res, nil, err
	}
	sctx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
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
	select {
	case ev := <-failed:
		t := ev.Time
		res.Failure, res.FailureKind = &t, string(ev.Type)
		if ev.Type == node.EventExited {
			res.FailureKind = "exited: " + ev.Reason
		}
		err = sleep(ctx, 3*time.Second) // the samples up to the kill
	case <-time.After(run.Profile.Duration() + 10*time.Second):
	case <-ctx.Done():
		err = ctx.Err()
	}
	stopSampling()
	<-done
	_ = sampler.Wait()
	for _, s := range samples {
		if res.Failure != nil && s.Time.After(*res.Failure) {
			break
		}
		rows = append(rows, s.row(run, res, horizon))
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
	cmd, err := e.node.Exec(ctx, ns, pod, testbed.BrokerContainer, []string{e.stress, "stress", "--profile", profile}, log, log)
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

// firstPID is a process of a v1 container cgroup (its memory hierarchy).
func firstPID(cgroup string) (int, error) {
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", cgroup, "cgroup.procs"))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("no process in %s", cgroup)
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
