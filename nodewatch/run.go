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
	"github.com/amf-edge/amf/signal"
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

// target is the container being sampled and its push notifications.
type target struct {
	id  string // runtime container ID, bare
	src detect.Source
	// pids: its processes were visible when it was opened (the host's PID
	// namespace), so an empty cgroup.procs means it ended.
	pids   bool
	oom    <-chan cgroup.OOMEvent
	exit   <-chan time.Time
	cancel context.CancelFunc
	// memDir and kills: its memory cgroup and oom_kill counter when opened,
	// so an exit can be told an OOM kill without the notification.
	memDir string
	kills  uint64
}

// exitReason says why the broker's process ended: an OOM kill if the
// cgroup's oom_kill counter moved since it was opened (the exit may be
// seen before the OOM notification, or there is none: cgroup v1 on the
// read-only mount of the node-mode overlay).
func (t *target) exitReason() string {
	if t.memDir != "" {
		if n, err := cgroup.OOMKills(t.memDir); err == nil && n > t.kills {
			return fmt.Sprintf("OOM kill in the broker container (%d so far): its process exited", n)
		}
	}
	return "broker container " + short(t.id) + ": its process exited"
}

func (t *target) close() {
	if t != nil {
		t.cancel()
	}
}

func (r *podRun) loop(ctx context.Context) {
	defer close(r.done)
	sess := r.w.cfg.Begin(r.s.id)
	if sess == nil {
		return // the agent is stopping
	}
	send := func(e detect.Emission) {
		if e.Message != nil {
			sess.Observe(e.Message, time.Now())
		}
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
	var probed chan healthcheck.Result // nil without a probe
	if prober != nil {
		probed = make(chan healthcheck.Result, 1)
		report := healthcheck.OnChange(func(res healthcheck.Result) {
			select {
			case probed <- res:
			case <-ctx.Done():
			}
		})
		go func() { _ = prober.Run(ctx, report) }()
	}
	// The first observation says the agent watches the pod: the tracker and
	// the actuator see it at once, before the first score.
	now := time.Now()
	sess.Observe(&signal.Message{State: signal.Starting, Reason: "watched by the node agent (node mode)", Seq: 0, Time: now}, now)

	var (
		cur  *target
		dead []string // IDs of containers seen to end: never the target again
		// pushed: an end was pushed for cur, which may stay readable after
		// its processes are gone (until the runtime removes the cgroup):
		// it is back only while it has processes, or, where they cannot be
		// seen, not before an interval has passed.
		pushed   bool
		pushedAt time.Time
	)
	defer func() { cur.close() }()
	drop := func() {
		if cur != nil {
			dead = append(dead, cur.id)
			if len(dead) > 8 {
				dead = dead[1:]
			}
			cur.close()
			cur = nil
		}
		pushed = false
	}
	open := func() {
		r.mu.Lock()
		id := bareID(r.latest)
		r.mu.Unlock()
		var err error
		cur, err = r.open(ctx, id, dead)
		if err != nil {
			if e, ok := pipe.TargetNotFound(err.Error()); ok {
				send(e)
			}
			r.log.Debug("broker container not found", slog.String("error", err.Error()))
			return
		}
		if _, err := pipe.SetTarget(cur.src); err != nil {
			r.log.Warn("cannot tell what bounds the broker's memory", slog.String("error", err.Error()))
		}
		r.log.Info("node pipeline target", slog.String("target", fmt.Sprint(cur.src)), slog.Bool("exit_watch", cur.exit != nil), slog.Bool("oom_watch", cur.oom != nil))
	}
	sample := func() {
		if cur == nil {
			if open(); cur == nil {
				return
			}
		}
		if pushed {
			w, ok := cur.src.(cgroup.Watched)
			switch {
			case cur.pids && ok:
				if pids, err := w.PIDs(); err != nil || len(pids) == 0 {
					drop()
					return
				}
			case time.Since(pushedAt) < r.w.cfg.Interval:
				return
			}
		}
		st := pipe.Sample(ctx)
		if ctx.Err() != nil {
			return
		}
		if st.Read {
			pushed = false
		}
		if st.Back != nil {
			send(*st.Back)
		}
		switch {
		case errors.Is(st.Err, cgroup.ErrGone):
			send(st.Emission)
			drop()
		case st.Err != nil:
			r.log.Warn("sample failed", slog.String("error", st.Err.Error()))
		default:
			send(st.Emission)
		}
	}

	tick := time.NewTicker(r.w.cfg.Interval)
	defer tick.Stop()
	sample()
	for {
		var oom <-chan cgroup.OOMEvent
		var exit <-chan time.Time
		if cur != nil {
			oom, exit = cur.oom, cur.exit
		}
		select {
		case <-ctx.Done():
			r.mu.Lock()
			reason := r.reason
			r.mu.Unlock()
			if reason != "" { // the pod goes: stopping, not gone
				e := pipe.Stop("node mode: " + reason)
				sess.Observe(e.Message, time.Now())
				sess.End()
			}
			return
		case <-tick.C:
			sample()
		case <-r.change:
			r.mu.Lock()
			id := bareID(r.latest)
			r.mu.Unlock()
			if cur != nil && id != cur.id {
				// The pod status says another container runs, or none: the
				// old one ended (its exit may not have been seen: no PID of
				// it was visible).
				send(pipe.Gone("broker container " + short(cur.id) + " no longer runs (per the pod status)"))
				drop()
			}
			if cur == nil {
				open()
			}
		case res := <-probed:
			send(pipe.Probe(res.OK, res.Reason))
		case ev, ok := <-oom:
			if !ok {
				cur.oom = nil
				continue
			}
			send(pipe.Gone(fmt.Sprintf("OOM kill in the broker container (%d so far)", ev.Kills)))
			pushed, pushedAt = true, time.Now()
		case _, ok := <-exit:
			if !ok {
				cur.exit = nil
				continue
			}
			send(pipe.Gone(cur.exitReason()))
			drop()
		}
	}
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

// open finds the broker container id (not one of dead) and watches its end.
func (r *podRun) open(ctx context.Context, id string, dead []string) (*target, error) {
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
	t := &target{id: id, src: src, cancel: cancel, pids: len(pids) > 0}
	if len(pids) > 0 {
		exit, err := cgroup.WatchExit(wctx, pids[0])
		switch {
		case errors.Is(err, unix.ESRCH):
			cancel()
			return nil, fmt.Errorf("the broker container %s ended while it was opened", short(id))
		case err != nil:
			r.log.Warn("no exit notification for the broker; its end is seen at the next sample", slog.String("error", err.Error()))
		default:
			t.exit = exit
		}
	}
	if w, ok := src.(cgroup.Watched); ok {
		if n, err := cgroup.OOMKills(w.MemoryDir()); err == nil {
			t.memDir, t.kills = w.MemoryDir(), n
		}
		oom, err := cgroup.WatchOOM(wctx, w.MemoryDir())
		if err != nil {
			r.log.Warn("no OOM notification for the broker; an OOM kill is seen when its process exits or at the next sample", slog.String("error", err.Error()))
		} else {
			t.oom = oom
		}
	}
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
