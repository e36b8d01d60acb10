package bench

import (
	"testing"
	"time"

	"github.com/amf-edge/amf/lab/probe"
)

func TestAnUnhealthySignalIsFalseOnlyWhileTheTestsOwnTrafficWasAnswered(t *testing.T) {
	at := time.Unix(1000, 0)
	// One message every 500 ms for the 10 s before the signal and 2 s after,
	// each answered in 20 ms unless the case says otherwise.
	rec := func(slow map[int]time.Duration, lost map[int]bool) *probe.Recording {
		r := &probe.Recording{}
		for i := range 24 {
			sent := at.Add(-10*time.Second + time.Duration(i)*500*time.Millisecond)
			r.Sends = append(r.Sends, probe.Send{Seq: uint64(i + 1), Time: sent})
			if lost[i] {
				continue
			}
			lat := 20 * time.Millisecond
			if d, ok := slow[i]; ok {
				lat = d
			}
			r.Receipts = append(r.Receipts, probe.Receipt{Seq: uint64(i + 1), Sent: sent, Received: sent.Add(lat)})
		}
		return r
	}
	for _, c := range []struct {
		name string
		rec  *probe.Recording
		want bool
	}{
		{"every message answered at once", rec(nil, nil), true},
		// Message 17 is sent 1.5 s before the signal: within the probe's
		// period and timeout (3 s).
		{"one answered after the probe's timeout, just before", rec(map[int]time.Duration{17: 1200 * time.Millisecond}, nil), false},
		{"one lost just before", rec(nil, map[int]bool{17: true}), false},
		{"one answered just under the timeout", rec(map[int]time.Duration{17: 900 * time.Millisecond}, nil), true},
		// Message 2 is sent 9 s before: the probe had answers since.
		{"one slow long before", rec(map[int]time.Duration{2: 3 * time.Second}, nil), true},
		{"one lost after the signal", rec(nil, map[int]bool{22: true}), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := answeredInTime(c.rec, at); got != c.want {
				t.Errorf("answeredInTime = %v, want %v", got, c.want)
			}
		})
	}
}
