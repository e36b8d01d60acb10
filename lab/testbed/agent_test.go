package testbed

import (
	"fmt"
	"testing"
	"time"
)

// TestAgentLogLinesAreNotRepeatedWhenAStreamStartsAgain: a log stream that
// starts again (a restarted container, a restarted kubelet) from the second
// of the last line read yields no line twice and every newer line once,
// also a line written after one with a later time of its own (the agent's
// goroutines take a line's time before the handler's lock).
func TestAgentLogLinesAreNotRepeatedWhenAStreamStartsAgain(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 15, 0, 0, 0, time.UTC)
	// line is written at w ms, with its own time at own ms.
	line := func(w, own int) string {
		at := func(ms int) string { return t0.Add(time.Duration(ms) * time.Millisecond).Format(time.RFC3339Nano) }
		return fmt.Sprintf(`%s {"time":%q,"level":"INFO","msg":"decision","action":"a%d"}`, at(w), at(own), w)
	}
	a := &AgentPod{}
	var r logResume
	stream := func(lines ...string) {
		for _, l := range lines {
			if s, ok := r.fresh(l); ok {
				a.onLine(s)
			}
		}
	}
	stream(line(100, 100), line(300, 310), line(300, 300), "no timestamp", line(700, 650)) // 300 twice: two writes in one instant
	stream(line(100, 100), line(300, 310), line(300, 300), line(700, 650), line(900, 900)) // from the second of line 700
	stream(line(1200, 1100))
	var got []string
	for _, l := range a.Lines() {
		got = append(got, l.Action)
	}
	if want := "[a100 a300 a300 a700 a900 a1200]"; fmt.Sprint(got) != want {
		t.Errorf("lines %v, want %s", got, want)
	}
}
