package sidecar

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amf-edge/amf/detect"
	"github.com/amf-edge/amf/healthcheck"
	"github.com/amf-edge/amf/sidecar/handover"
	"github.com/amf-edge/amf/statehub"
)

// StateConfig is the sidecar's part in carrying its broker's state across a
// switchover (DESIGN.md, "Broker state"): it hands the state its broker
// writes as it stops to the node agent's state hub, and restarts its broker
// on a state the hub hands it.
type StateConfig struct {
	Broker handover.Broker
	Hub    *statehub.Client
	// RestartTimeout bounds how long a broker restarted on a handed-over
	// state counts as starting; after it, what the probe and the samples
	// say counts again. Default 60 s.
	RestartTimeout time.Duration
	// SnapshotEvery, when above 0, has the broker write its state that
	// often (SIGUSR1), handed in when it changed: what a failover restarts
	// the standby on, a crashed broker writing no final state. Mosquitto
	// writes its whole state each time.
	SnapshotEvery time.Duration
	// SnapshotRate bounds the bytes a second the broker's snapshots write
	// (and the hub and a relay carry): after a state of n bytes the next
	// snapshot waits n/SnapshotRate seconds when that is longer than
	// SnapshotEvery, so a big state is taken less often instead of its
	// broker writing without rest. 0: no bound.
	SnapshotRate int64
	// SnapshotRefresh is the longest an unchanged snapshot goes without
	// being handed in again; default 1 min, half the hub's TTL (package
	// statehub), so that the last snapshot of a quiet broker is always
	// there for a failover, also in an agent started again since.
	SnapshotRefresh time.Duration
	// HandInTimeout bounds one hand-in, which outlives the sidecar's own
	// stop: the kubelet stops a native sidecar after its broker, so the
	// final state is often handed in while the stop is under way. Default 10 s.
	HandInTimeout time.Duration
}

// restart is a broker restart the sidecar asked for, owned by the loop
// goroutine.
type restart struct {
	id       string    // the state it was restarted on
	at       time.Time // when the restart was asked for
	deadline time.Time
	// ended is the target read when the restart was asked for: the
	// broker's container that the restart ends. With Rediscover its
	// successor is a new container (a new cgroup), and the ended one's
	// cgroup may stay readable for a moment after its processes are gone.
	ended *detect.Target
}

// stateLevers is what the hand-in, snapshot and fetch goroutines share.
type stateLevers struct {
	mu        sync.Mutex
	installed []byte // the last state put in: its rename is not this broker's final state

	// handing serializes the hand-ins, and finals counts the final states
	// seen: a snapshot begun before a final is never handed in after it.
	// The hub (and its relay) keep the newest state of each pod, so a
	// snapshot landing after the final would stand in for it, and the
	// standby's agent, waiting for a final state, would give the state up.
	handing sync.Mutex
	finals  atomic.Uint64
}

// runState hands final states in and puts handed states in until ctx ends.
func (s *Sidecar) runState(ctx context.Context, wg *sync.WaitGroup) {
	if s.cfg.State == nil {
		return
	}
	cfg := s.cfg.State
	if cfg.RestartTimeout <= 0 {
		cfg.RestartTimeout = 60 * time.Second
	}
	if cfg.HandInTimeout <= 0 {
		cfg.HandInTimeout = 10 * time.Second
	}
	if cfg.SnapshotRefresh <= 0 {
		cfg.SnapshotRefresh = time.Minute
	}
	var lv stateLevers
	wg.Go(func() { s.handIn(ctx, cfg, &lv) })
	wg.Go(func() { s.fetch(ctx, cfg, &lv) })
	if cfg.SnapshotEvery > 0 {
		wg.Go(func() { s.snapshots(ctx, cfg, &lv) })
	}
}

// snapshots has the broker write its state every SnapshotEvery and hands
// it in when it changed, or when SnapshotRefresh has passed since it was
// last handed in. Only a digest of the last one is kept: the sidecar's
// memory holds one state, not two.
func (s *Sidecar) snapshots(ctx context.Context, cfg *StateConfig, lv *stateLevers) {
	var last [sha256.Size]byte
	var lastAt time.Time
	lastErr := ""
	wait := cfg.SnapshotEvery
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if s.restarting.Load() {
			continue // its broker is being restarted on a state
		}
		// The broker saves in its main loop: a busy one may take longer
		// than a short interval, which bounds how often it is asked, not
		// how long it may take.
		finals := lv.finals.Load()
		sctx, cancel := context.WithTimeout(ctx, max(cfg.SnapshotEvery, snapshotTimeout))
		st, err := cfg.Broker.Snapshot(sctx)
		cancel()
		if err == nil && st.Summary.Shutdown {
			// The file the broker wrote as it stopped, renamed in while
			// this snapshot waited: the final state, handIn's to hand in.
			continue
		}
		if err == nil {
			if w := snapshotWait(cfg.SnapshotEvery, cfg.SnapshotRate, len(st.Data)); w != wait {
				if w > cfg.SnapshotEvery && wait == cfg.SnapshotEvery {
					s.cfg.Log.Info("broker state snapshots spaced out: the state is big for --state-snapshot-rate", "bytes", len(st.Data), "every", w.Round(time.Millisecond))
				}
				wait = w
			}
			if sum := sha256.Sum256(st.Data); sum != last || time.Since(lastAt) >= cfg.SnapshotRefresh {
				var handed bool
				handed, err = s.handInSnapshot(ctx, cfg, lv, finals, st.Data)
				if handed {
					last, lastAt = sum, time.Now()
				}
			}
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			s.metrics.Error(ErrorKindState)
			if err.Error() != lastErr {
				s.cfg.Log.Warn("broker state snapshot not handed to the node agent", "err", err)
			}
			lastErr = err.Error()
		case lastErr != "":
			s.cfg.Log.Info("broker state snapshots handed to the node agent again")
			lastErr = ""
		}
	}
}

// handInSnapshot hands a snapshot in unless a final state was seen since
// the snapshot began (finals, lv.finals then): it would be older than the
// final, yet the hub would keep it as the pod's newest.
func (s *Sidecar) handInSnapshot(ctx context.Context, cfg *StateConfig, lv *stateLevers, finals uint64, data []byte) (bool, error) {
	lv.handing.Lock()
	defer lv.handing.Unlock()
	if lv.finals.Load() != finals {
		return false, nil
	}
	hctx, cancel := context.WithTimeout(ctx, cfg.HandInTimeout)
	defer cancel()
	_, err := cfg.Hub.HandIn(hctx, statehub.Snapshot, data)
	return err == nil, err
}

// snapshotTimeout is the least time a snapshot is given to be written.
const snapshotTimeout = 5 * time.Second

// snapshotWait is the time from one snapshot to the next after a state of
// n bytes: every, or n/rate seconds when that is longer, so that the
// broker's whole-state saves write at most rate bytes a second.
func snapshotWait(every time.Duration, rate int64, n int) time.Duration {
	if rate <= 0 {
		return every
	}
	return max(every, time.Duration(float64(n)/float64(rate)*float64(time.Second)))
}

// handIn waits for each state the broker writes as it stops and hands it
// to the hub.
func (s *Sidecar) handIn(ctx context.Context, cfg *StateConfig, lv *stateLevers) {
	for attempt := 0; ctx.Err() == nil; {
		st, err := cfg.Broker.Final(ctx, nil)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.metrics.Error(ErrorKindState)
			s.cfg.Log.Warn("broker state not watched", "err", err)
			attempt++
			select {
			case <-time.After(backoff(attempt, time.Second, 30*time.Second)):
			case <-ctx.Done():
				return
			}
			continue
		}
		attempt = 0
		lv.mu.Lock()
		ours := bytes.Equal(st.Data, lv.installed)
		lv.mu.Unlock()
		if ours {
			continue // the state this sidecar put in, renamed into place
		}
		lv.finals.Add(1) // before the lock: a snapshot waiting on it is dropped
		lv.handing.Lock()
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.HandInTimeout)
		id, err := cfg.Hub.HandIn(hctx, statehub.Final, st.Data)
		cancel()
		lv.handing.Unlock()
		sum := st.Summary
		if err != nil {
			s.metrics.Error(ErrorKindState)
			s.cfg.Log.Error("final broker state not handed to the node agent", "err", err, "bytes", len(st.Data))
			continue
		}
		s.cfg.Log.Info("final broker state handed to the node agent", "state", id, "bytes", len(st.Data),
			"retained", sum.Retained, "sessions", len(sum.Sessions), "queued", sum.Queued)
	}
}

// fetch long-polls the hub for a state handed to this pod and restarts the
// broker on it.
func (s *Sidecar) fetch(ctx context.Context, cfg *StateConfig, lv *stateLevers) {
	last := ""
	for attempt := 0; ctx.Err() == nil; {
		// The hub keeps a state handed on until the agent sees the pod
		// run on it: naming it has the long poll wait past it, where
		// asking again at once spun.
		st, ok, err := cfg.Hub.Fetch(ctx, last)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			s.metrics.Error(ErrorKindState)
			attempt++
			if attempt == 1 || attempt%10 == 0 {
				s.cfg.Log.Warn("state hub not reached", "err", err, "attempts", attempt)
			}
			select {
			case <-time.After(backoff(attempt, 500*time.Millisecond, 15*time.Second)):
			case <-ctx.Done():
				return
			}
			continue
		case !ok || st.ID == last:
			attempt = 0
			continue
		}
		attempt = 0
		last = st.ID
		s.install(ctx, cfg, lv, st)
	}
}

// install restarts the broker on st: the pod is starting from the moment
// it is asked (the broker's end is the sidecar's own doing) until the
// restarted broker answers.
func (s *Sidecar) install(ctx context.Context, cfg *StateConfig, lv *stateLevers, st statehub.State) {
	done := make(chan error, 1)
	s.do(ctx, func() {
		s.restart = &restart{id: st.ID, at: time.Now(), deadline: time.Now().Add(cfg.RestartTimeout), ended: s.runner.Target()}
		s.restarting.Store(true)
		s.apply(s.pipe.Restart(fmt.Sprintf("restarting the broker on the state of %s handed over by the node agent", st.From), st.ID), nil)
		lv.mu.Lock()
		lv.installed = st.Data
		lv.mu.Unlock()
		if h, ok := s.cfg.Probe.(interface{ Hurry(time.Duration) }); ok {
			h.Hurry(cfg.RestartTimeout) // to see the restarted broker the moment it is back
		}
		sum, err := cfg.Broker.Install(st.Data)
		if err != nil {
			s.restart = nil
			s.restarting.Store(false)
			s.apply(s.pipe.Restarted(), nil)
			done <- err
			return
		}
		s.cfg.Log.Info("broker restarting on a handed-over state", "state", st.ID, "from", st.From.String(), "bytes", sum.Bytes,
			"retained", sum.Retained, "sessions", len(sum.Sessions), "queued", sum.Queued)
		done <- nil
	})
	select {
	case err := <-done:
		if err != nil {
			s.metrics.Error(ErrorKindState)
			s.cfg.Log.Error("handed-over state not put in: the broker runs on as it was", "state", st.ID, "err", err)
		}
	case <-ctx.Done():
	}
}

// restartAnswered ends a restart the sidecar asked for once the broker
// answers a probe begun after it with its container found again, or once
// its deadline passed. Called from the loop goroutine.
func (s *Sidecar) restartAnswered(ctx context.Context, r *healthcheck.Result) {
	rs := s.restart
	if rs == nil {
		return
	}
	now := time.Now()
	probed := r != nil && r.OK && r.At.Add(-r.RTT).After(rs.at)
	// Read after the restart, and (with Rediscover) not the container it
	// ended: the 2-hour soak's sidecar read the old container's cgroup,
	// still there after its broker was killed, called the restart done
	// when the new broker answered, and then, the old cgroup removed,
	// said the broker's container gone: its agent failed the pair over
	// from the pod it had just handed the state to.
	fresh := func() bool { return s.cfg.Rediscover == nil || s.runner.Target() != rs.ended }
	back := func() bool { return s.pipe.HasTarget() && !s.pipe.Vanished() && fresh() && s.lastRead.After(rs.at) }
	if probed && !back() {
		if !fresh() {
			// The broker answers, so its new container runs: the ended
			// one is dropped and the new one looked for now.
			s.runner.Refind(ctx)
		}
		// The broker answers; its new container is read now rather than
		// at the next tick, so the pod serves a tick sooner.
		s.sampleOnce(ctx)
		if s.restart == nil {
			return // ended by that sample
		}
	}
	answered := back() && probed
	if s.cfg.Probe == nil {
		answered = back()
	}
	if !answered && now.Before(rs.deadline) {
		return
	}
	if !answered {
		s.cfg.Log.Warn("the broker restarted on a handed-over state did not answer in time", "state", rs.id, "after", now.Sub(rs.at).Round(time.Millisecond))
	} else {
		s.cfg.Log.Info("the broker answers on the handed-over state", "state", rs.id, "after", now.Sub(rs.at).Round(time.Millisecond))
	}
	s.restart = nil
	s.restarting.Store(false)
	s.apply(s.pipe.Restarted(), nil)
}
