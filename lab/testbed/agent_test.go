package testbed

import (
	"fmt"
	"testing"
	"time"
)

// TestAgentLogLinesAreNotRepeatedWhenAStreamStartsAgain: a log stream that
// starts again (a restarted container, a restarted kubelet) from the second
// of the last line read yields no line twice, and every newer line once.
func TestAgentLogLinesAreNotRepeatedWhenAStreamStartsAgain(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 15, 0, 0, 0, time.UTC)
	line := func(ms int) string {
		return fmt.Sprintf(`{"time":%q,"level":"INFO","msg":"decision","action":"a%d"}`, t0.Add(time.Duration(ms)*time.Millisecond).Format(time.RFC3339Nano), ms)
	}
	a := &Agent{}
	var last time.Time
	stream := func(lines ...string) {
		for _, l := range lines {
			if at, ok := a.onLine(l, last); ok {
				last = at
			}
		}
	}
	stream(line(100), line(300), "not json", line(700))
	stream(line(100), line(300), line(700), line(900)) // from the second of line 700
	stream(line(1200))
	var got []string
	for _, l := range a.Lines() {
		got = append(got, l.Action)
	}
	if want := "[a100 a300 a700 a900 a1200]"; fmt.Sprint(got) != want {
		t.Errorf("lines %v, want %s", got, want)
	}
}
