package stress

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

// Run in this process: phases in order, ramps grow step by step, lower targets
// are released at once, and everything is released at the end.
func TestRunPlaysPhases(t *testing.T) {
	p, err := ParseProfile("400ms:mem=2Mi,ramp=8Mi/s;200ms:mem=4Mi;200ms:mem=1Mi;100ms")
	if err != nil {
		t.Fatal(err)
	}
	var got []Status
	if err := Run(t.Context(), p, func(s Status) { got = append(got, s) }); err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 || !got[len(got)-1].Done {
		t.Fatalf("statuses %+v: no Done at the end", got)
	}
	byPhase := map[int][]Status{}
	for _, s := range got[:len(got)-1] {
		byPhase[s.Phase] = append(byPhase[s.Phase], s)
	}
	// Each phase is reported first with what the previous one left, before any
	// allocation.
	startHeld := map[int]int64{1: 0, 2: 2 * mi, 3: 4 * mi, 4: 1 * mi}
	endHeld := map[int]int64{1: 2 * mi, 2: 4 * mi, 3: 1 * mi, 4: 0}
	for ph := 1; ph <= 4; ph++ {
		ss := byPhase[ph]
		if len(ss) < 2 {
			t.Fatalf("phase %d: statuses %+v", ph, ss)
		}
		if ss[0].Held != startHeld[ph] || ss[len(ss)-1].Held != endHeld[ph] || ss[0].Phases != 4 {
			t.Errorf("phase %d: held %d → %d, want %d → %d", ph, ss[0].Held, ss[len(ss)-1].Held, startHeld[ph], endHeld[ph])
		}
	}
	// 2 MiB at 8 MiB/s takes 250 ms: several steps, each growing.
	ramp := byPhase[1]
	if len(ramp) < 4 {
		t.Errorf("ramp in %d steps, want ≥ 3: %+v", len(ramp)-1, ramp)
	}
	for i := 1; i < len(ramp); i++ {
		if ramp[i].Held <= ramp[i-1].Held {
			t.Errorf("ramp not growing: %+v", ramp)
		}
	}
	// No ramp: one step.
	if n := len(byPhase[2]); n != 2 {
		t.Errorf("phase 2 at once: %d statuses, want 2", n)
	}
}

func TestRunStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	p := Profile{Phases: []Phase{{Duration: time.Hour, Memory: mi, CPU: 0.2}}}
	start := time.Now()
	err := Run(ctx, p, func(s Status) {
		if s.Held == mi {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) || time.Since(start) > 10*time.Second {
		t.Fatalf("got %v after %v", err, time.Since(start))
	}
}

func TestRunRejectsInvalidProfile(t *testing.T) {
	if err := Run(t.Context(), Profile{}, nil); err == nil {
		t.Fatal("empty profile accepted")
	}
}

// More workers than Ps would take turns: each gets a P while it burns,
// and the process's GOMAXPROCS is back afterwards.
func TestBurnGivesEveryWorkerItsOwnP(t *testing.T) {
	prev := runtime.GOMAXPROCS(0)
	n := prev + 2
	stop := burn(float64(n))
	got := runtime.GOMAXPROCS(0)
	stop()
	if got != n {
		t.Errorf("GOMAXPROCS %d while burning %d cores, want %d", got, n, n)
	}
	if after := runtime.GOMAXPROCS(0); after != prev {
		t.Errorf("GOMAXPROCS %d after burning, want %d back", after, prev)
	}
}

// A held level is checked every tick; in a memory file that must cost
// nothing, or the injector's own work shows in the container's CPU during
// quiet phases (it once made a 1 MiB buffer every tick: 0.04 cores).
func TestHoldingAMemoryFileLevelAllocatesNothing(t *testing.T) {
	var m memory
	if err := InMemoryFile()(&m); err != nil {
		t.Fatal(err)
	}
	defer m.close()
	ctx := context.Background()
	for _, level := range []int64{0, 3 << 20} {
		if err := m.set(ctx, level); err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(100, func() {
			if err := m.set(ctx, level); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("holding %d bytes: %v allocations a tick, want 0", level, n)
		}
	}
}
