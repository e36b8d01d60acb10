package node

import (
	"context"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// TestCrashLoop drives the back-off with a fake clock: each step runs the
// container for a while, lets it exit, and checks the delay before the
// restart, as the kubelet's: at once, then 10 s doubling to 5 min, reset after
// 10 min of running.
func TestCrashLoop(t *testing.T) {
	type step struct {
		ran  time.Duration // how long the container ran before exiting
		want time.Duration // the restart delay
	}
	s := time.Second
	for _, tc := range []struct {
		name  string
		cfg   Backoff
		steps []step
	}{
		{"paper's five crashes", Backoff{}, []step{{3 * s, 0}, {3 * s, 10 * s}, {3 * s, 20 * s}, {3 * s, 40 * s}, {3 * s, 80 * s}}},
		{"cap at five minutes", Backoff{}, []step{{s, 0}, {s, 10 * s}, {s, 20 * s}, {s, 40 * s}, {s, 80 * s}, {s, 160 * s}, {s, 300 * s}, {s, 300 * s}}},
		{"reset after ten minutes of running", Backoff{}, []step{{s, 0}, {s, 10 * s}, {s, 20 * s}, {10 * time.Minute, 0}, {s, 10 * s}}},
		{"nine minutes is not enough", Backoff{}, []step{{s, 0}, {s, 10 * s}, {9 * time.Minute, 20 * s}}},
		{"short test back-off", Backoff{Initial: 100 * time.Millisecond, Max: 300 * time.Millisecond, Reset: time.Minute},
			[]step{{s, 0}, {s, 100 * time.Millisecond}, {s, 200 * time.Millisecond}, {s, 300 * time.Millisecond}, {s, 300 * time.Millisecond}, {time.Minute, 0}}},
		{"max below initial", Backoff{Initial: time.Minute, Max: time.Second}, []step{{s, 0}, {s, time.Minute}, {s, time.Minute}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(1_700_000_000, 0))
			loop := newCrashLoop(tc.cfg)
			for i, st := range tc.steps {
				started := clk.Now()
				clk.Step(st.ran)
				got := loop.next(started, clk.Now())
				if got != st.want {
					t.Fatalf("exit %d after %v: delay %v, want %v", i+1, st.ran, got, st.want)
				}
				// The restart waits exactly that long on the clock.
				done := make(chan bool, 1)
				go func() { done <- sleep(context.Background(), clk, got, nil) }()
				if got > 0 {
					waitWaiters(t, clk)
					clk.Step(got - time.Nanosecond)
					select {
					case <-done:
						t.Fatalf("exit %d: restarted before %v", i+1, got)
					default:
					}
					clk.Step(time.Nanosecond)
				}
				if !<-done {
					t.Fatalf("exit %d: sleep reported a stop", i+1)
				}
			}
		})
	}
}

// waitWaiters waits until a goroutine waits on the fake clock.
func waitWaiters(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("nobody waits on the clock")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestSleepStops(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	stop := make(chan struct{})
	done := make(chan bool, 1)
	go func() { done <- sleep(context.Background(), clk, time.Hour, stop) }()
	waitWaiters(t, clk)
	close(stop)
	if <-done {
		t.Fatal("sleep ended true after stop")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if sleep(ctx, clk, 0, nil) {
		t.Fatal("sleep(0) with a cancelled context returned true")
	}
}
