package nodewatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/detect"
	"github.com/amf-edge/amf/healthcheck"
	"github.com/amf-edge/amf/podsignal"
)

// podRun is one pod's pipeline: a goroutine that owns the detect.Pipeline
// and its target, samples it every interval and takes in the pushed ends.
type podRun struct {
	w    *Watcher
	s    runSpec
	log  *slog.Logger
	done chan struct{}

	cancel context.CancelFunc
	mu     sync.Mutex
	latest string // the broker container's ID per the pod status
	reason string // why stop was called; "" while not stopped
	change chan struct{}
}

// newPodRun starts a pod's pipeline; it ends with ctx (the watcher's)
// without a message, or with stop.
func (w *Watcher) newPodRun(ctx context.Context, spec runSpec) runner {
	ctx, cancel := context.WithCancel(ctx)
	r := &podRun{w: w, s: spec, log: w.log.With(slog.String("pod", spec.id.String())), done: make(chan struct{}),
		cancel: cancel, latest: spec.containerID, change: make(chan struct{}, 1)}
	go r.loop(ctx)
	return r
}

func (r *podRun) spec() runSpec { return r.s }

func (r *podRun) update(id string) {
	r.mu.Lock()
	changed := id != r.latest
	r.latest = id
	r.mu.Unlock()
	if changed {
		select {
		case r.change <- struct{}{}:
		default:
		}
	}
}

func (r *podRun) stop(reason string) {
	r.mu.Lock()
	r.reason = reason
	r.mu.Unlock()
	r.cancel()
	<-r.done
}

func (r *podRun) wait() { <-r.done }

// loop runs the pod's pipeline on a detect.Runner until ctx ends; a stop
// (the pod goes) says stopping before it returns.
func (r *podRun) loop(ctx context.Context) {
	defer close(r.done)
	sess := r.w.cfg.Begin(r.s.id)
	if sess == nil {
		return // the agent is stopping
	}
	prober, err := r.prober()
	if err != nil { // checked by desired; a bug if it happens
		r.log.Error("node pipeline's probe not built", slog.String("error", err.Error()))
		return
	}
	pipe, err := detect.NewPipeline(detect.PipelineConfig{Model: r.s.model, Interval: r.w.cfg.Interval, NeedProbe: prober != nil, Log: r.log})
	if err != nil { // checked by desired; a bug if it happens
		r.log.Error("node pipeline not built", slog.String("error", err.Error()))
		return
	}
	f := &finder{r: r}
	// The pod status naming another container (or none) wakes the runner,
	// which ends the one it samples (finder.Stale): its exit may not have
	// been seen (no PID of it was visible).
	runner, err := detect.NewRunner(detect.RunnerConfig{Pipeline: pipe, Interval: r.w.cfg.Interval, Finder: f, Sink: verdicts{sess, r.log}, Probe: prober, Wake: r.change,
		OnOOM: func(ev cgroup.OOMEvent) {
			r.log.Warn("OOM kill in the broker container", slog.Uint64("kills", ev.Kills))
		}})
	if err != nil { // checked by desired; a bug if it happens
		r.log.Error("node pipeline's runner not built", slog.String("error", err.Error()))
		return
	}
	// The first observation says the agent watches the pod: the tracker and
	// the actuator see it at once, before the first score.
	now := time.Now()
	sess.Observe(&podsignal.Message{State: podsignal.Starting, Reason: "watched by the node agent (node mode)", Seq: 0, Time: now}, now)

	runner.Run(ctx)

	r.mu.Lock()
	reason := r.reason
	r.mu.Unlock()
	if reason != "" { // the pod goes: stopping, not gone
		e := pipe.Stop("node mode: " + reason)
		sess.Observe(e.Message, time.Now())
		sess.End()
	}
}

// verdicts is node mode's side of a pod's detect.Runner where the verdicts
// go: the agent's tracker, through the pod's session.
type verdicts struct {
	sess Session
	log  *slog.Logger
}

func (s verdicts) Emit(e detect.Emission, _ *detect.Step) {
	if e.Message != nil {
		s.sess.Observe(e.Message, time.Now())
	}
}

func (s verdicts) Target(t *detect.Target, err error) {
	switch {
	case t == nil:
		s.log.Debug("broker container not found", slog.String("error", err.Error()))
	case err != nil:
		s.log.Warn("cannot tell what bounds the broker's memory", slog.String("error", err.Error()))
	}
}

func (s verdicts) Sampled(_ context.Context, st *detect.Step, _ time.Duration) {
	if st != nil && st.Err != nil && !errors.Is(st.Err, cgroup.ErrGone) {
		s.log.Warn("sample failed", slog.String("error", st.Err.Error()))
	}
}

var _ detect.Rechecker = (*finder)(nil)

// finder is node mode's side of a pod's detect.Runner where the target
// comes from: the broker container the pod status names, never one seen
// to end, with its exit and OOM kills pushed.
type finder struct {
	r    *podRun
	dead []string // IDs of containers seen to end: never the target again
}

// Stale: the pod status names another container than t (or none).
func (f *finder) Stale(t *detect.Target) (string, bool) {
	f.r.mu.Lock()
	id := bareID(f.r.latest)
	f.r.mu.Unlock()
	if id == t.ID {
		return "", false
	}
	return "broker container " + short(t.ID) + " no longer runs (per the pod status)", true
}

func (f *finder) Find(ctx context.Context) (*detect.Target, error) {
	f.r.mu.Lock()
	id := bareID(f.r.latest)
	f.r.mu.Unlock()
	t, err := f.r.open(ctx, id, f.dead)
	if err != nil {
		return nil, err
	}
	unwatch := t.Close
	t.Close = func() {
		f.dead = append(f.dead, id)
		if len(f.dead) > 8 {
			f.dead = f.dead[1:]
		}
		unwatch()
	}
	return t, nil
}

// prober is the app-logic probe of amf.io/probe, aimed at the pod's IP (its
// host is never the annotation's); nil without one.
func (r *podRun) prober() (healthcheck.Prober, error) {
	p := r.s.probe
	if p.Port == 0 {
		return nil, nil
	}
	addr := net.JoinHostPort(r.s.podIP, strconv.Itoa(p.Port))
	switch p.Scheme {
	case "mqtt":
		return healthcheck.NewMQTTProber(healthcheck.MQTTConfig{Broker: "tcp://" + addr})
	case "tcp":
		return healthcheck.NewTCPProber(healthcheck.TCPConfig{Address: addr})
	}
	return nil, fmt.Errorf("probe scheme %q", p.Scheme)
}

// open finds the broker container id (not one of dead) and watches its
// end: its process's exit (final) and its OOM kills.
func (r *podRun) open(ctx context.Context, id string, dead []string) (*detect.Target, error) {
	if id == "" {
		return nil, errors.New("the broker container " + r.s.container + " is not running (per the pod status)")
	}
	if slices.Contains(dead, id) {
		return nil, errors.New("the broker container " + short(id) + " has ended; waiting for its restart")
	}
	opts := r.w.cfg.Cgroup
	c, err := cgroup.FindContainer(cgroup.PodQuery{UID: string(r.s.uid), ContainerID: id}, opts...)
	if err != nil {
		return nil, err
	}
	pids, err := cgroup.ContainerPIDs(c, opts...)
	if err != nil {
		return nil, err
	}
	if len(pids) > 0 {
		// Any process of the pod gives its network counters; the first is
		// the container's own (the runtime starts it before it forks).
		opts = append(slices.Clip(opts), cgroup.WithPID(pids[0]))
	}
	src, err := cgroup.Open(c.Path, opts...)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	var exit <-chan time.Time
	if len(pids) > 0 {
		exit, err = cgroup.WatchExit(wctx, pids[0])
		switch {
		case errors.Is(err, unix.ESRCH):
			cancel()
			return nil, fmt.Errorf("the broker container %s ended while it was opened", short(id))
		case err != nil:
			r.log.Warn("no exit notification for the broker; its end is seen at the next sample", slog.String("error", err.Error()))
		}
	}
	// memDir and kills: its memory cgroup and oom_kill counter when opened,
	// so that an exit can be told an OOM kill without the notification
	// (it may come after the exit, or not at all: cgroup v1 on the
	// read-only mount of the node-mode overlay).
	var oom <-chan cgroup.OOMEvent
	var memDir string
	var kills uint64
	w, watched := src.(cgroup.Watched)
	if watched {
		if n, err := cgroup.OOMKills(w.MemoryDir()); err == nil {
			memDir, kills = w.MemoryDir(), n
		}
		if oom, err = cgroup.WatchOOM(wctx, w.MemoryDir()); err != nil {
			r.log.Warn("no OOM notification for the broker; an OOM kill is seen when its process exits or at the next sample", slog.String("error", err.Error()))
		}
	}
	exitReason := func() string {
		if memDir != "" {
			if n, err := cgroup.OOMKills(memDir); err == nil && n > kills {
				r.log.Warn("OOM kill in the broker container", slog.Uint64("kills", n), slog.String("seen", "at its exit"))
				return fmt.Sprintf("OOM kill in the broker container (%d so far): its process exited", n)
			}
		}
		return "broker container " + short(id) + ": its process exited"
	}
	t := &detect.Target{ID: id, Source: src, Close: cancel, Exit: exit, ExitReason: exitReason, OOM: oom}
	if len(pids) > 0 && watched {
		// Its processes were visible when it was opened (the host's PID
		// namespace), so none in cgroup.procs means it ended.
		t.Running = func() bool {
			p, err := w.PIDs()
			return err == nil && len(p) > 0
		}
	}
	r.log.Info("node pipeline target", slog.String("target", fmt.Sprint(src)), slog.Bool("exit_watch", exit != nil), slog.Bool("oom_watch", oom != nil))
	return t, nil
}

// bareID strips the runtime's prefix from a pod status container ID
// ("containerd://<id>").
func bareID(id string) string {
	if _, rest, ok := strings.Cut(id, "://"); ok {
		return rest
	}
	return id
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
