package detect

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/healthcheck"
)

// fakeFinder hands out the targets it is given, in order, and says "not
// found" when it has none left.
type fakeFinder struct {
	mu      sync.Mutex
	targets []*Target
	calls   int
}

func (f *fakeFinder) Find(context.Context) (*Target, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if len(f.targets) == 0 {
		return nil, errors.New("no container yet")
	}
	t := f.targets[0]
	f.targets = f.targets[1:]
	return t, nil
}

func (f *fakeFinder) add(t *Target) {
	f.mu.Lock()
	f.targets = append(f.targets, t)
	f.mu.Unlock()
}

// recordingSink writes one line per call: "emit <state>: <reason>",
// "target <id>" or "target none: <err>", "sampled read|held|err".
type recordingSink struct{ lines chan string }

func (s recordingSink) Emit(e Emission, _ *Step) {
	if e.Verdict.Changed {
		s.lines <- fmt.Sprintf("emit %s: %s", e.Verdict.State, e.Verdict.Reason)
	}
}

func (s recordingSink) Target(t *Target, err error) {
	if t == nil {
		s.lines <- "target none: " + err.Error()
		return
	}
	s.lines <- "target " + t.ID
}

func (s recordingSink) Sampled(_ context.Context, st *Step, _ time.Duration) {
	switch {
	case st == nil:
		s.lines <- "sampled held"
	case st.Err != nil:
		s.lines <- "sampled err"
	default:
		s.lines <- "sampled read"
	}
}

// await reads lines until one starts with want, failing after 10 s.
func (s recordingSink) await(t *testing.T, want string) string {
	t.Helper()
	timeout := time.After(10 * time.Second)
	var seen []string
	for {
		select {
		case l := <-s.lines:
			if strings.HasPrefix(l, want) {
				return l
			}
			seen = append(seen, l)
		case <-timeout:
			t.Fatalf("no %q; saw %q", want, seen)
		}
	}
}

// probeFeed is a Prober whose results the test sends.
type probeFeed chan healthcheck.Result

func (p probeFeed) Run(ctx context.Context, report func(healthcheck.Result)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case r := <-p:
			report(r)
		}
	}
}

type runnerHarness struct {
	r      *Runner
	finder *fakeFinder
	sink   recordingSink
	ctx    context.Context
}

// newRunner builds a Runner whose ticker never fires within a test (an
// hour): every sample after the first is one the test asks for. The test
// gives its finder targets, then starts it.
func newRunner(t *testing.T, cfg RunnerConfig) *runnerHarness {
	t.Helper()
	h := &runnerHarness{finder: &fakeFinder{}, sink: recordingSink{lines: make(chan string, 64)}}
	cfg.Pipeline = newPipeline(t, nil)
	cfg.Interval, cfg.Finder, cfg.Sink = time.Hour, h.finder, h.sink
	r, err := NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.r = r
	return h
}

// start runs the Runner until the test ends.
func (h *runnerHarness) start(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	h.ctx = ctx
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() { defer close(done); h.r.Run(ctx) }()
}

// sample asks for a sample now.
func (h *runnerHarness) sample() { h.r.Do(h.ctx, func() { h.r.Sample(h.ctx) }) }

// pushes are a target's watches, as the test drives them.
type pushes struct {
	exit   chan time.Time
	oom    chan cgroup.OOMEvent
	closed chan struct{}
}

func (h *runnerHarness) target(id string, src Source) (*Target, pushes) {
	p := pushes{exit: make(chan time.Time), oom: make(chan cgroup.OOMEvent), closed: make(chan struct{})}
	t := &Target{ID: id, Source: src, Exit: p.exit, OOM: p.oom, Close: func() { close(p.closed) }}
	h.finder.add(t)
	return t, p
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func TestRunnerLooksForItsTargetAtEachSampleUntilFound(t *testing.T) {
	h := newRunner(t, RunnerConfig{})
	h.start(t)
	h.sink.await(t, "target none: no container yet")
	h.sink.await(t, "sampled held")
	h.target("c1", &synthSource{memory: 10 << 20, t0: time.Now()})
	h.sample()
	h.sink.await(t, "target c1")
	h.sink.await(t, "sampled read")
}

func TestRunnerPushedEnds(t *testing.T) {
	for _, tc := range []struct {
		name string
		// exit: the target's process exits; else its cgroup has an OOM kill.
		exit bool
		// running: the target's processes, as Target.Running says (nil:
		// cannot be seen).
		running func() bool
		// said: the reason of Gone; then: what the next sample does;
		// dropped: the target was closed and the next one looked for.
		said, then string
		dropped    bool
	}{
		{name: "an OOM kill whose processes cannot be seen holds the next reading back for an interval",
			said: "OOM kill in the broker container (1 so far)", then: "sampled held"},
		{name: "an OOM kill whose process runs again is read at the next sample",
			running: func() bool { return true }, said: "OOM kill in the broker container (1 so far)", then: "sampled read"},
		{name: "an OOM kill that ended the processes drops the target",
			running: func() bool { return false }, said: "OOM kill in the broker container (1 so far)", then: "sampled held", dropped: true},
		{name: "an exit drops the target at once",
			exit: true, said: "its process exited", dropped: true, then: "sampled held"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var told []uint64 // OnOOM's, on the Runner's goroutine, before its end
			h := newRunner(t, RunnerConfig{OnOOM: func(ev cgroup.OOMEvent) { told = append(told, ev.Kills) }})
			tg, p := h.target("c1", &synthSource{memory: 10 << 20, t0: time.Now()})
			tg.Running = tc.running
			h.start(t)
			h.sink.await(t, "target c1")
			h.sink.await(t, "sampled read")
			if tc.exit {
				p.exit <- time.Now()
			} else {
				p.oom <- cgroup.OOMEvent{Time: time.Now(), Kills: 1}
			}
			h.sink.await(t, "emit unhealthy: "+tc.said)
			h.sample()
			h.sink.await(t, tc.then)
			if want := map[bool]int{true: 0, false: 1}[tc.exit]; len(told) != want || want == 1 && told[0] != 1 {
				t.Errorf("OnOOM told %v, want %d kill(s) of 1", told, want)
			}
			if isClosed(p.closed) != tc.dropped {
				t.Errorf("target closed %t, want %t", isClosed(p.closed), tc.dropped)
			}
			h.finder.mu.Lock()
			calls := h.finder.calls
			h.finder.mu.Unlock()
			if want := map[bool]int{false: 1, true: 2}[tc.dropped]; calls < want || !tc.dropped && calls != 1 {
				t.Errorf("%d searches, want %d", calls, want)
			}
		})
	}
}

func TestRunnerSaysAnExitWithItsTargetsReason(t *testing.T) {
	h := newRunner(t, RunnerConfig{})
	tg, p := h.target("c1", &synthSource{memory: 10 << 20, t0: time.Now()})
	tg.ExitReason = func() string { return "OOM kill in the broker container (3 so far): its process exited" }
	h.start(t)
	h.sink.await(t, "sampled read")
	p.exit <- time.Now()
	h.sink.await(t, "emit unhealthy: OOM kill in the broker container (3 so far): its process exited")
}

// An OOM kill and the exit it caused, both waiting when the Runner next
// looks: Go's select takes either, and the exit's own reason reads a cgroup
// that may be gone by then; the kill is the reason either way.
func TestRunnerSaysAnOOMKillWaitingBesideTheExitItCaused(t *testing.T) {
	for i := range 20 {
		var told []uint64
		h := newRunner(t, RunnerConfig{OnOOM: func(ev cgroup.OOMEvent) { told = append(told, ev.Kills) }})
		exit, oom := make(chan time.Time, 1), make(chan cgroup.OOMEvent, 1)
		tg := &Target{ID: "c1", Source: &synthSource{memory: 10 << 20, t0: time.Now()}, Exit: exit, OOM: oom, Close: func() {},
			ExitReason: func() string { return "its process exited (the cgroup is gone)" }}
		h.finder.add(tg)
		h.start(t)
		h.sink.await(t, "sampled read")
		h.r.Do(h.ctx, func() { // on the Runner's goroutine: both wait when it returns
			oom <- cgroup.OOMEvent{Time: time.Now(), Kills: 2}
			exit <- time.Now()
		})
		if l := h.sink.await(t, "emit unhealthy: "); !strings.HasPrefix(l, "emit unhealthy: OOM kill in the broker container (2 so far)") {
			t.Fatalf("try %d: %q; want the OOM kill as the exit's reason", i, l)
		}
		h.r.Do(h.ctx, func() {}) // OnOOM ran before the emission, on the Runner's goroutine
		if len(told) != 1 || told[0] != 2 {
			t.Fatalf("try %d: OnOOM told %v, want one of 2 kills", i, told)
		}
	}
}

// An OOM watch that ended (its cgroup unreadable: the channel closed) holds
// no kill: the exit's own reason is asked, which may still find one.
func TestRunnerAsksTheExitsReasonWhenTheOOMWatchEnded(t *testing.T) {
	for i := range 20 {
		h := newRunner(t, RunnerConfig{})
		exit, oom := make(chan time.Time, 1), make(chan cgroup.OOMEvent)
		tg := &Target{ID: "c1", Source: &synthSource{memory: 10 << 20, t0: time.Now()}, Exit: exit, OOM: oom, Close: func() {},
			ExitReason: func() string { return "OOM kill in the broker container (4 so far): its process exited" }}
		h.finder.add(tg)
		h.start(t)
		h.sink.await(t, "sampled read")
		h.r.Do(h.ctx, func() { // the watch's end and the exit, both ready when it returns
			close(oom)
			exit <- time.Now()
		})
		if l := h.sink.await(t, "emit unhealthy: "); l != "emit unhealthy: OOM kill in the broker container (4 so far): its process exited" {
			t.Fatalf("try %d: %q; want the exit's own reason", i, l)
		}
	}
}

func TestRunnerDropsAVanishedTargetAndTakesTheNext(t *testing.T) {
	h := newRunner(t, RunnerConfig{})
	gone := &synthSource{memory: 10 << 20, t0: time.Now()}
	_, p := h.target("c1", gone)
	h.start(t)
	h.sink.await(t, "sampled read")
	h.r.Do(h.ctx, func() { gone.gone = true })
	h.target("c2", &synthSource{memory: 10 << 20, t0: time.Now().Add(time.Minute)})
	h.sample()
	h.sink.await(t, "emit unhealthy: broker container gone")
	h.sink.await(t, "target c2")
	if !isClosed(p.closed) {
		t.Error("the vanished target's watches were not ended")
	}
	h.sample()
	h.sink.await(t, "emit ")
}

func TestRunnerTakesProbeAnswersInUnlessMuted(t *testing.T) {
	feed := make(probeFeed)
	var muted sync.Mutex
	mute := true
	seen := make(chan healthcheck.Result, 8)
	h := newRunner(t, RunnerConfig{Probe: feed,
		ProbeMuted: func() bool { muted.Lock(); defer muted.Unlock(); return mute },
		OnProbe:    func(_ context.Context, r healthcheck.Result) { seen <- r }})
	h.target("c1", &synthSource{memory: 10 << 20, t0: time.Now()})
	h.start(t)
	h.sink.await(t, "sampled read")

	state := func() string {
		c := make(chan string, 1)
		h.r.Do(h.ctx, func() { st, reason := h.r.cfg.Pipeline.State(); c <- fmt.Sprintf("%s: %s", st, reason) })
		return <-c
	}
	feed <- healthcheck.Result{OK: false, Reason: "no answer"}
	<-seen
	if s := state(); strings.Contains(s, "no answer") {
		t.Errorf("a muted probe answer was taken in: %s", s)
	}
	muted.Lock()
	mute = false
	muted.Unlock()
	feed <- healthcheck.Result{OK: true}
	<-seen
	feed <- healthcheck.Result{OK: false, Reason: "no answer again"}
	<-seen
	if s := state(); !strings.Contains(s, "no answer again") {
		t.Errorf("a probe answer was not taken in: %s", s)
	}
}

// recheckingFinder is a fakeFinder that calls the targets named in stale
// stale (node mode: the pod status names another container).
type recheckingFinder struct {
	*fakeFinder
	mu    sync.Mutex
	stale map[string]bool
}

func (f *recheckingFinder) Stale(t *Target) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stale[t.ID] {
		return "container " + t.ID + " replaced", true
	}
	return "", false
}

func TestRunnerWakeRechecksItsTarget(t *testing.T) {
	for _, tc := range []struct {
		name      string
		found     bool // c1 is found before the wake
		stale     bool // the finder calls c1 stale at the wake
		wantLines []string
		wantEnded bool
	}{
		{name: "a stale target ends at once and the next is found without a tick", found: true, stale: true,
			wantLines: []string{"emit unhealthy: container c1 replaced", "target c2"}, wantEnded: true},
		{name: "a target still current is kept", found: true, stale: false},
		{name: "with no target one is looked for at once", found: false,
			wantLines: []string{"target c1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wake := make(chan struct{})
			h := newRunner(t, RunnerConfig{Wake: wake})
			rf := &recheckingFinder{fakeFinder: h.finder, stale: map[string]bool{}}
			h.r.cfg.Finder = rf
			var p pushes
			if tc.found {
				_, p = h.target("c1", &synthSource{memory: 10 << 20, t0: time.Now()})
			}
			h.start(t)
			if tc.found {
				h.sink.await(t, "sampled read")
				h.target("c2", &synthSource{memory: 10 << 20, t0: time.Now().Add(time.Minute)})
			} else {
				h.sink.await(t, "target none")
				h.target("c1", &synthSource{memory: 10 << 20, t0: time.Now()})
			}
			rf.mu.Lock()
			rf.stale["c1"] = tc.stale
			rf.mu.Unlock()
			h.finder.mu.Lock()
			calls := h.finder.calls
			h.finder.mu.Unlock()

			wake <- struct{}{}
			for _, want := range tc.wantLines {
				h.sink.await(t, want)
			}
			// Everything the wake did is done once a Do after it has run.
			done := make(chan struct{})
			h.r.Do(h.ctx, func() { close(done) })
			<-done
			if tc.found && isClosed(p.closed) != tc.wantEnded {
				t.Errorf("c1's watches ended: %v, want %v", isClosed(p.closed), tc.wantEnded)
			}
			h.finder.mu.Lock()
			defer h.finder.mu.Unlock()
			if searched := h.finder.calls > calls; searched != (tc.wantEnded || !tc.found) {
				t.Errorf("searched at the wake: %v", searched)
			}
		})
	}
}
