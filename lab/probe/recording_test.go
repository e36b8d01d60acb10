package probe

import (
	"slices"
	"strconv"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// at is t0 + ms milliseconds.
func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// synth builds a recording: sends every 100 ms from t0 (seq i at (i−1)·100 ms),
// receipts as (seq, receive ms) in receive order, ended at endMs.
func synth(sends int, receipts [][2]int, endMs int) *Recording {
	r := newRecorder(DefaultTopic, DefaultInterval, DefaultGapThreshold)
	r.rec.Started = t0
	for i := range sends {
		r.send(at(100 * i))
	}
	for _, m := range receipts {
		seq := uint64(m[0])
		r.add(seq, r.rec.Sends[seq-1].Time, at(m[1]))
	}
	return r.snapshot(at(endMs))
}

// steady is receipts of seqs from..to, each received 10 ms after its send.
func steady(from, to int) [][2]int {
	var out [][2]int
	for s := from; s <= to; s++ {
		out = append(out, [2]int{s, 100*(s-1) + 10})
	}
	return out
}

func cat(parts ...[][2]int) [][2]int { return slices.Concat(parts...) }

func TestRecorderClassifies(t *testing.T) {
	// 1,2,3 in order; 2 again (duplicate); 5 then 4 (4 is late); 4 again (duplicate, not late).
	r := synth(5, [][2]int{{1, 10}, {2, 110}, {3, 210}, {2, 220}, {5, 410}, {4, 420}, {4, 430}}, 500)
	type class struct{ dup, late bool }
	want := []class{{}, {}, {}, {dup: true}, {}, {late: true}, {dup: true}}
	for i, m := range r.Receipts {
		if got := (class{m.Duplicate, m.Late}); got != want[i] {
			t.Errorf("receipt %d (seq %d): got %+v, want %+v", i, m.Seq, got, want[i])
		}
	}
	if r.Received() != 5 || r.DuplicateCount() != 2 || r.Sent() != 5 {
		t.Errorf("received %d duplicates %d sent %d, want 5 2 5", r.Received(), r.DuplicateCount(), r.Sent())
	}
}

func TestReceiveRejectsForeignPayloads(t *testing.T) {
	r := newRecorder(DefaultTopic, DefaultInterval, DefaultGapThreshold)
	seq := r.send(t0)
	for _, p := range []string{"", "x", "1", "1,2", "2," + itoa(t0.UnixNano()), "0," + itoa(t0.UnixNano()), "-1,5", "1,abc"} {
		if r.receive([]byte(p), at(5)) {
			t.Errorf("payload %q accepted", p)
		}
	}
	if !r.receive(payload(seq, t0), at(5)) {
		t.Fatalf("own payload %q rejected", payload(seq, t0))
	}
	if r.rec.Foreign != 8 || len(r.rec.Receipts) != 1 || r.rec.Receipts[0].Latency() != 5*time.Millisecond {
		t.Errorf("foreign %d receipts %+v", r.rec.Foreign, r.rec.Receipts)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func TestGaps(t *testing.T) {
	ms := time.Millisecond
	tests := []struct {
		name     string
		sends    int
		receipts [][2]int
		end      int
		want     []time.Duration // gap durations
		open     bool            // the last gap is open
	}{
		{"healthy", 20, steady(1, 20), 1950, nil, false},
		{"no receipts: no gap", 20, nil, 1950, nil, false},
		{"one outage", 30, cat(steady(1, 10), steady(21, 30)), 2950, []time.Duration{1100 * ms}, false},
		{"just above threshold", 10, [][2]int{{1, 10}, {2, 261}, {3, 361}}, 400, []time.Duration{251 * ms}, false},
		{"at threshold is not a gap", 10, [][2]int{{1, 10}, {2, 260}, {3, 360}}, 400, nil, false},
		{"duplicates do not end a gap", 30,
			cat(steady(1, 10), [][2]int{{10, 1000}, {10, 1500}}, steady(21, 30)), 2950, []time.Duration{1100 * ms}, false},
		{"late message does not end a gap", 30,
			cat(steady(1, 10), [][2]int{{12, 1200}, {11, 1500}}, steady(21, 30)), 2950, []time.Duration{290 * ms, 810 * ms}, false},
		{"open tail", 30, steady(1, 10), 2950, []time.Duration{2040 * ms}, true},
		{"short tail is not a gap", 10, steady(1, 10), 1000, nil, false},
		{"two outages", 60, cat(steady(1, 10), steady(21, 30), steady(51, 60)), 5950,
			[]time.Duration{1100 * ms, 2100 * ms}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := synth(tc.sends, tc.receipts, tc.end)
			gs := r.Gaps()
			var got []time.Duration
			for _, g := range gs {
				got = append(got, g.Duration())
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("gaps %v, want %v", got, tc.want)
			}
			for i, g := range gs {
				if g.Open != (tc.open && i == len(gs)-1) {
					t.Errorf("gap %d open=%v", i, g.Open)
				}
				if g.Open && (g.NextSeq != 0 || !g.End.Equal(r.Ended)) {
					t.Errorf("open gap %+v should end at Ended %v with no next seq", g, r.Ended)
				}
			}
		})
	}
}

func TestLargestGapWithin(t *testing.T) {
	// Outages: receipts stop after seq 10 (received 910 ms) and resume at seq 21
	// (2010 ms): gap (910, 2010) = 1.1 s; then after seq 30 (2910) until seq 51
	// (5010): gap (2910, 5010) = 2.1 s.
	r := synth(60, cat(steady(1, 10), steady(21, 30), steady(51, 60)), 5950)
	tests := []struct {
		name string
		from int
		d    time.Duration
		want time.Duration // 0: none
	}{
		{"window inside the first gap", 1000, 100 * time.Millisecond, 1100 * time.Millisecond},
		{"gap began before from and ends after it", 1500, time.Second, 1100 * time.Millisecond},
		{"gap begins inside the window, ends after it", 0, time.Second, 1100 * time.Millisecond},
		{"window spanning both: largest", 0, 10 * time.Second, 2100 * time.Millisecond},
		{"default window 30 s", 0, 0, 2100 * time.Millisecond},
		{"gap ending exactly at from does not count", 2010, 500 * time.Millisecond, 0},
		{"gap starting exactly at window end does not count", 2410, 500 * time.Millisecond, 0},
		{"a millisecond of overlap counts", 2909, 2 * time.Millisecond, 2100 * time.Millisecond},
		{"healthy window", 100, 500 * time.Millisecond, 0},
		{"after everything", 6000, time.Second, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, ok := r.LargestGapWithin(at(tc.from), tc.d)
			if ok != (tc.want != 0) || g.Duration() != tc.want {
				t.Fatalf("got %v (ok %v), want %v", g.Duration(), ok, tc.want)
			}
		})
	}
}

func TestMaxGap(t *testing.T) {
	// Jittery but healthy: seq 5 arrives 80 ms late, so the intervals around it
	// are 180 and 20 ms; one outage of 1.1 s later.
	rs := steady(1, 10)
	rs[4][1] += 80
	r := synth(30, cat(rs, steady(21, 30)), 2950)
	tests := []struct {
		name     string
		from, to int
		want     time.Duration
	}{
		{"healthy window sees the jitter", 0, 800, 180 * time.Millisecond},
		{"steady window", 600, 900, 100 * time.Millisecond},
		{"below the threshold still counts", 0, 2000, 1100 * time.Millisecond},
		{"point inside the outage", 1500, 1500, 1100 * time.Millisecond},
		{"open tail counts", 2920, 2940, 40 * time.Millisecond},
		{"before the first receipt: none", 0, 5, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, ok := r.MaxGap(at(tc.from), at(tc.to))
			if ok != (tc.want != 0) || g.Duration() != tc.want {
				t.Fatalf("got %v (ok %v), want %v", g.Duration(), ok, tc.want)
			}
		})
	}
}

func TestDuplicatesAndLost(t *testing.T) {
	// Seqs 1–10 normally; 11–20 through both edges (each twice); 21–25 lost;
	// 26–30 through one edge again.
	var both [][2]int
	for s := 11; s <= 20; s++ {
		both = append(both, [2]int{s, 100*(s-1) + 10}, [2]int{s, 100*(s-1) + 30})
	}
	r := synth(30, cat(steady(1, 10), both, steady(26, 30)), 2950)
	dup := []struct {
		from, to, want int
	}{
		{0, 3000, 10},
		{0, 1000, 0},
		{1030, 1031, 1}, // [from, to): the copy at 1030 ms
		{1010, 1030, 0}, // the first copy at 1010 ms is no duplicate; 1030 is excluded
		{1500, 2000, 5},
	}
	for _, tc := range dup {
		if got := r.Duplicates(at(tc.from), at(tc.to)); got != tc.want {
			t.Errorf("Duplicates(%d, %d ms) = %d, want %d", tc.from, tc.to, got, tc.want)
		}
	}
	lost := []struct {
		from, to int
		want     []uint64
	}{
		{0, 3000, []uint64{21, 22, 23, 24, 25}},
		{2000, 2200, []uint64{21, 22}}, // sent at 2000 and 2100; 2200 is excluded
		{0, 2000, nil},
		{2500, 3000, nil},
	}
	for _, tc := range lost {
		if got := r.Lost(at(tc.from), at(tc.to)); !slices.Equal(got, tc.want) {
			t.Errorf("Lost(%d, %d ms) = %v, want %v", tc.from, tc.to, got, tc.want)
		}
	}
	s := r.Summary()
	if s.Sent != 30 || s.Received != 25 || s.Duplicates != 10 || s.Lost != 5 || len(s.Gaps) != 1 {
		t.Errorf("summary %+v", s)
	}
}

func TestLatencyAndPercentile(t *testing.T) {
	ms := time.Millisecond
	// Latencies 1..100 ms for seqs 1..100, plus a duplicate of seq 1 with 500 ms.
	var rs [][2]int
	for s := 1; s <= 100; s++ {
		rs = append(rs, [2]int{s, 100*(s-1) + s})
	}
	rs = append(rs, [2]int{1, 10000})
	r := synth(100, rs, 10050)
	l := r.Latency(t0, at(20000))
	want := LatencyStats{N: 100, Min: ms, P50: 50 * ms, P90: 90 * ms, P99: 99 * ms, Max: 100 * ms, Mean: 50500 * time.Microsecond}
	if l != want {
		t.Errorf("latency %+v, want %+v", l, want)
	}
	if (r.Latency(at(20000), at(30000)) != LatencyStats{}) {
		t.Error("empty window should give zero stats")
	}
	pt := []struct {
		vals []time.Duration
		p    float64
		want time.Duration
	}{
		{nil, 50, 0},
		{[]time.Duration{7}, 99, 7},
		{[]time.Duration{1, 2, 3, 4}, 0, 1},
		{[]time.Duration{1, 2, 3, 4}, 25, 1},
		{[]time.Duration{1, 2, 3, 4}, 26, 2},
		{[]time.Duration{1, 2, 3, 4}, 50, 2},
		{[]time.Duration{1, 2, 3, 4}, 100, 4},
		{[]time.Duration{1, 2, 3, 4}, 150, 4},
	}
	for _, tc := range pt {
		if got := Percentile(tc.vals, tc.p); got != tc.want {
			t.Errorf("Percentile(%v, %v) = %v, want %v", tc.vals, tc.p, got, tc.want)
		}
	}
}
