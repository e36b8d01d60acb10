package probe

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Send is one publish attempt of the probe.
type Send struct {
	Seq  uint64    `json:"seq"`
	Time time.Time `json:"time"` // the send time, also encoded in the payload
	// Err is set when the publisher's client refused the message at once (not
	// connected). A message the client accepted can still be lost on the path.
	Err string `json:"err,omitempty"`
}

// Receipt is one message the subscriber received.
type Receipt struct {
	Seq      uint64    `json:"seq"`
	Sent     time.Time `json:"sent"`
	Received time.Time `json:"received"`
	// Duplicate: this seq had been received before (both edge brokers bridged).
	Duplicate bool `json:"duplicate,omitempty"`
	// Late: the first receipt of this seq, but a higher seq had arrived already
	// (the paths reordered it). A late message does not restore the service: the
	// OBU already had newer data.
	Late bool `json:"late,omitempty"`
}

// Latency is the time from send to receipt.
func (r Receipt) Latency() time.Duration { return r.Received.Sub(r.Sent) }

// Fresh says the receipt carried the newest data so far: neither a duplicate nor
// late. Only fresh receipts end a gap.
func (r Receipt) Fresh() bool { return !r.Duplicate && !r.Late }

// Gap is an interval between consecutive fresh receipts: the service outage seen
// by the OBU subscriber.
type Gap struct {
	Start   time.Time `json:"start"`    // receive time of the last fresh receipt before the gap
	End     time.Time `json:"end"`      // receive time of the fresh receipt that ended it; Recording.Ended if Open
	LastSeq uint64    `json:"last_seq"` // seq received at Start
	NextSeq uint64    `json:"next_seq"` // seq received at End; 0 if Open
	// Open: no fresh receipt came before the recording ended; the outage lasted
	// at least this long.
	Open bool `json:"open,omitempty"`
}

// Duration is the gap's length, End − Start.
func (g Gap) Duration() time.Duration { return g.End.Sub(g.Start) }

// overlaps says whether the gap's open interval (Start, End) meets the closed
// window [from, to]. A gap that ends exactly at from does not: a message arrived
// at from, so the service was up then.
func (g Gap) overlaps(from, to time.Time) bool { return g.Start.Before(to) && g.End.After(from) }

// Client names in ConnEvent.
const (
	Publisher  = "publisher"
	Subscriber = "subscriber"
)

// Kinds of ConnEvent.
const (
	Connected = "connected" // the client (re)connected; the subscriber has also subscribed
	Lost      = "lost"      // the connection dropped; the client reconnects on its own
)

// ConnEvent is a connection change of one of the probe's clients.
type ConnEvent struct {
	Time   time.Time `json:"time"`
	Client string    `json:"client"` // Publisher or Subscriber
	Kind   string    `json:"kind"`   // Connected or Lost
	Err    string    `json:"err,omitempty"`
}

// Recording is what a probe observed. Its methods are pure functions of it, so
// recordings can be built by hand to test analyses.
type Recording struct {
	Topic        string        `json:"topic"`
	Interval     time.Duration `json:"interval"`
	GapThreshold time.Duration `json:"gap_threshold"`
	Started      time.Time     `json:"started"` // publishing began (both clients connected)
	// Ended is when publishing stopped (or, for a snapshot, the snapshot's time).
	Ended time.Time `json:"ended"`
	Sends []Send    `json:"sends"` // Sends[i].Seq == i+1
	// Receipts in receive order.
	Receipts []Receipt `json:"receipts"`
	// Foreign counts messages on the topic that this probe did not send
	// (another publisher, or a malformed payload); they are not in Receipts.
	Foreign int         `json:"foreign"`
	Events  []ConnEvent `json:"events"`
}

// Sent is the number of publish attempts.
func (r *Recording) Sent() int { return len(r.Sends) }

// Received is the number of distinct seqs received.
func (r *Recording) Received() int {
	n := 0
	for _, m := range r.Receipts {
		if !m.Duplicate {
			n++
		}
	}
	return n
}

// DuplicateCount is the number of duplicate receipts in the whole recording.
func (r *Recording) DuplicateCount() int { return len(r.Receipts) - r.Received() }

// Gaps lists every gap longer than GapThreshold, in time order. The time
// before the first receipt is not a gap (the path was being set up); the time
// after the last fresh receipt is an Open gap ending at Ended when it is longer
// than the threshold.
func (r *Recording) Gaps() []Gap {
	var out []Gap
	r.intervals(func(g Gap) {
		if g.Duration() > r.GapThreshold {
			out = append(out, g)
		}
	})
	return out
}

// intervals calls f with every interval between consecutive fresh receipts, and
// with the open tail from the last fresh receipt to Ended.
func (r *Recording) intervals(f func(Gap)) {
	var last *Receipt
	for i := range r.Receipts {
		m := &r.Receipts[i]
		if !m.Fresh() {
			continue
		}
		if last != nil {
			f(Gap{Start: last.Received, End: m.Received, LastSeq: last.Seq, NextSeq: m.Seq})
		}
		last = m
	}
	if last != nil && r.Ended.After(last.Received) {
		f(Gap{Start: last.Received, End: r.Ended, LastSeq: last.Seq, Open: true})
	}
}

// DefaultEventWindow is LargestGapWithin's window when d ≤ 0: long enough for
// the paper's slowest reactive recovery to begin inside it.
const DefaultEventWindow = 30 * time.Second

// LargestGapWithin is the E2E SOT of one event: the longest gap (longer than
// GapThreshold) that overlaps the window [from, from+d] (d ≤ 0 means
// DefaultEventWindow). Overlap means the gap's open interval (Start, End)
// meets the window, so a gap that began before from and ends after it counts,
// and so does one that begins inside the window and ends after it; the gap's
// full duration is returned, not the part inside the window. A gap ending
// exactly at from does not count. ok is false when no gap overlaps; ties go to
// the earlier gap.
func (r *Recording) LargestGapWithin(from time.Time, d time.Duration) (g Gap, ok bool) {
	if d <= 0 {
		d = DefaultEventWindow
	}
	to := from.Add(d)
	for _, c := range r.Gaps() {
		if c.overlaps(from, to) && (!ok || c.Duration() > g.Duration()) {
			g, ok = c, true
		}
	}
	return g, ok
}

// MaxGap is the jitter of a window, typically a healthy one: the longest
// interval between consecutive fresh receipts, whatever GapThreshold is,
// among those overlapping [from, to] (same overlap rule and full durations as
// LargestGapWithin, including an open tail). A healthy path gives about
// Interval. ok is false when no interval overlaps (fewer than two receipts).
func (r *Recording) MaxGap(from, to time.Time) (g Gap, ok bool) {
	r.intervals(func(c Gap) {
		if c.overlaps(from, to) && (!ok || c.Duration() > g.Duration()) {
			g, ok = c, true
		}
	})
	return g, ok
}

// Duplicates counts duplicate receipts received in [from, to).
func (r *Recording) Duplicates(from, to time.Time) int {
	n := 0
	for _, m := range r.Receipts {
		if m.Duplicate && inHalfOpen(m.Received, from, to) {
			n++
		}
	}
	return n
}

// Lost lists, in order, the seqs sent in [from, to) (by send time, including
// attempts the publisher's client refused) that were never received. Messages
// still in flight when the recording ended count as lost, so end windows at
// least a path latency before Ended.
func (r *Recording) Lost(from, to time.Time) []uint64 {
	return r.lost(func(s Send) bool { return inHalfOpen(s.Time, from, to) })
}

func (r *Recording) lost(in func(Send) bool) []uint64 {
	got := make(map[uint64]bool, len(r.Receipts))
	for _, m := range r.Receipts {
		got[m.Seq] = true
	}
	var out []uint64
	for _, s := range r.Sends {
		if in(s) && !got[s.Seq] {
			out = append(out, s.Seq)
		}
	}
	return out
}

// LatencyStats summarises send-to-receive latencies.
type LatencyStats struct {
	N    int           `json:"n"`
	Min  time.Duration `json:"min"`
	P50  time.Duration `json:"p50"`
	P90  time.Duration `json:"p90"`
	P99  time.Duration `json:"p99"`
	Max  time.Duration `json:"max"`
	Mean time.Duration `json:"mean"`
}

// Latency summarises the latency of the first receipt of each seq received in
// [from, to) (duplicates excluded: the second copy measures the other path).
// Percentiles are nearest-rank (Percentile). Zero stats when N is 0.
func (r *Recording) Latency(from, to time.Time) LatencyStats {
	return r.latency(func(m Receipt) bool { return inHalfOpen(m.Received, from, to) })
}

// LatencySent is Latency over the messages sent in [from, to), whenever
// they arrived: how the broker answered at that time.
func (r *Recording) LatencySent(from, to time.Time) LatencyStats {
	return r.latency(func(m Receipt) bool { return inHalfOpen(m.Sent, from, to) })
}

func (r *Recording) latency(in func(Receipt) bool) LatencyStats {
	var ls []time.Duration
	var sum time.Duration
	for _, m := range r.Receipts {
		if !m.Duplicate && in(m) {
			ls = append(ls, m.Latency())
			sum += m.Latency()
		}
	}
	if len(ls) == 0 {
		return LatencyStats{}
	}
	slices.Sort(ls)
	return LatencyStats{N: len(ls), Min: ls[0], Max: ls[len(ls)-1], Mean: sum / time.Duration(len(ls)),
		P50: Percentile(ls, 50), P90: Percentile(ls, 90), P99: Percentile(ls, 99)}
}

// Percentile is the nearest-rank p-th percentile (0 ≤ p ≤ 100) of sorted: the
// smallest value with at least p % of the values at or below it; p ≤ 0 gives
// the minimum. 0 for an empty slice.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

func inHalfOpen(t, from, to time.Time) bool { return !t.Before(from) && t.Before(to) }

// Summary is a recording's counts and gaps, for a report.
type Summary struct {
	Sent        int          `json:"sent"`
	Received    int          `json:"received"` // distinct seqs
	Duplicates  int          `json:"duplicates"`
	Late        int          `json:"late"`
	Lost        int          `json:"lost"`
	Foreign     int          `json:"foreign"`
	Disconnects int          `json:"disconnects"` // Lost events of either client
	Gaps        []Gap        `json:"gaps"`
	Latency     LatencyStats `json:"latency"`
}

// Summary counts over the whole recording.
func (r *Recording) Summary() Summary {
	s := Summary{Sent: r.Sent(), Received: r.Received(), Duplicates: r.DuplicateCount(), Foreign: r.Foreign, Gaps: r.Gaps()}
	for _, m := range r.Receipts {
		if m.Late {
			s.Late++
		}
	}
	for _, e := range r.Events {
		if e.Kind == Lost {
			s.Disconnects++
		}
	}
	s.Lost = len(r.lost(func(Send) bool { return true }))
	s.Latency = r.latency(func(Receipt) bool { return true })
	return s
}

// recorder builds a Recording as messages come; it classifies each receipt. It
// is not safe for concurrent use: the probe guards it with a mutex.
type recorder struct {
	rec    Recording
	seen   map[uint64]bool
	maxSeq uint64 // highest seq received
}

func newRecorder(topic string, interval, threshold time.Duration) *recorder {
	return &recorder{rec: Recording{Topic: topic, Interval: interval, GapThreshold: threshold}, seen: map[uint64]bool{}}
}

// send records a publish attempt at t and returns its seq (from 1).
func (r *recorder) send(t time.Time) uint64 {
	seq := uint64(len(r.rec.Sends)) + 1
	r.rec.Sends = append(r.rec.Sends, Send{Seq: seq, Time: t})
	return seq
}

// receive records a payload received at t. It reports false for a payload this
// probe did not send, which only counts as Foreign: the send time must match
// the recorded one to the nanosecond, so messages of an earlier probe on the
// same topic are not mistaken for ours.
func (r *recorder) receive(payload []byte, at time.Time) bool {
	seq, sentNs, ok := parsePayload(string(payload))
	if !ok || seq == 0 || seq > uint64(len(r.rec.Sends)) || r.rec.Sends[seq-1].Time.UnixNano() != sentNs {
		r.rec.Foreign++
		return false
	}
	r.add(seq, r.rec.Sends[seq-1].Time, at)
	return true
}

// add classifies and appends a receipt of seq.
func (r *recorder) add(seq uint64, sent, at time.Time) {
	m := Receipt{Seq: seq, Sent: sent, Received: at, Duplicate: r.seen[seq]}
	if !m.Duplicate {
		m.Late = seq < r.maxSeq
		r.seen[seq] = true
		r.maxSeq = max(r.maxSeq, seq)
	}
	r.rec.Receipts = append(r.rec.Receipts, m)
}

// distinct is the number of distinct seqs received.
func (r *recorder) distinct() int { return len(r.seen) }

// duplicates is the number of duplicate receipts.
func (r *recorder) duplicates() int { return len(r.rec.Receipts) - len(r.seen) }

// snapshot is a deep copy of the recording so far, ended at end.
func (r *recorder) snapshot(end time.Time) *Recording {
	c := r.rec
	c.Sends = slices.Clone(r.rec.Sends)
	c.Receipts = slices.Clone(r.rec.Receipts)
	c.Events = slices.Clone(r.rec.Events)
	if c.Ended.IsZero() {
		c.Ended = end
	}
	return &c
}

// payload encodes a message: "seq,unixnano".
func payload(seq uint64, sent time.Time) []byte {
	b := strconv.AppendUint(nil, seq, 10)
	b = append(b, ',')
	return strconv.AppendInt(b, sent.UnixNano(), 10)
}

func parsePayload(s string) (seq uint64, sentNs int64, ok bool) {
	a, b, found := strings.Cut(s, ",")
	if !found {
		return 0, 0, false
	}
	seq, err1 := strconv.ParseUint(a, 10, 64)
	sentNs, err2 := strconv.ParseInt(b, 10, 64)
	return seq, sentNs, err1 == nil && err2 == nil
}
