package promqlparity

import (
	"math"
	"testing"
	"time"

	"github.com/amf-edge/amf/infer"
)

// Fuzz input layout. A header of fuzzHeader bytes picks the windows and the start
// time; then each record of fuzzRecord bytes is one event:
//
//	r[0]  time since the previous event: < 224 → 1 + 40·r[0] ms (1 ms … 9 s);
//	      otherwise (r[0]-223)·17 s (17 s … 9 min 4 s, beyond the lookback)
//	r[1]  bits 0-3: cpu, memory, network, disk present; bit 4: with bits 0-3 clear,
//	      an evaluation only (no sample), otherwise a sample added without an
//	      evaluation; bit 5: cpu counter resets; bit 6: network and disk reset;
//	      bit 7: memory limit 200 MiB instead of 100 MiB
//	r[2]  cpu increase r[2]/100 s (after a reset: the counter's new value, r[2]/1000)
//	r[3]  memory r[3]·512 KiB (a gauge: 0 … 127.5 MiB)
//	r[4]  network increase 37·r[4]² bytes (after a reset: r[4])
//	r[5]  disk increase (r[5]&15)·4096·2^(r[5]>>4) bytes (after a reset: 0)
const (
	fuzzHeader     = 6
	fuzzRecord     = 6
	fuzzMaxRecords = 300
)

var (
	fuzzSteps     = []int64{1000, 250, 1500, 5000, 7000, 2000}
	fuzzRates     = []int64{1000, 2500, 5000, 10_000, 15_000, 30_000, 60_000, 300_000}
	fuzzLookbacks = []int64{1000, 3000, 10_000, 30_000, 60_000, 300_000}
)

// decodeFuzz turns fuzz bytes into windows and events. ok is false when data is too
// short to hold a header and one record.
func decodeFuzz(data []byte) (w windows, events []event, ok bool) {
	if len(data) < fuzzHeader+fuzzRecord {
		return w, nil, false
	}
	h := data[:fuzzHeader]
	ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
	step := fuzzSteps[int(h[0])%len(fuzzSteps)]
	w = windows{
		step:     ms(step),
		rate:     ms(fuzzRates[int(h[1])%len(fuzzRates)]),
		deriv:    ms(step*int64(1+h[2]%20) + int64(h[2]/20%3)*137),
		lookback: ms(fuzzLookbacks[int(h[3])%len(fuzzLookbacks)]),
	}
	t := b + (int64(h[4])<<8|int64(h[5]))*13

	var cpu, net, disk float64 = 3, 1e6, 4096
	data = data[fuzzHeader:]
	for n := 0; len(data) >= fuzzRecord && n < fuzzMaxRecords; n++ {
		r := data[:fuzzRecord]
		data = data[fuzzRecord:]
		if r[0] < 224 {
			t += 1 + 40*int64(r[0])
		} else {
			t += int64(r[0]-223) * 17_000
		}
		noEval := r[1]&(1<<4) != 0
		if noEval && r[1]&0x0f == 0 {
			events = append(events, evalAt(t))
			continue
		}
		if r[1]&(1<<5) != 0 {
			cpu = float64(r[2]) / 1000
		} else {
			cpu += float64(r[2]) / 100
		}
		if r[1]&(1<<6) != 0 {
			net, disk = float64(r[4]), 0
		} else {
			net += 37 * float64(r[4]) * float64(r[4])
			disk += float64(r[5]&15) * 4096 * float64(int64(1)<<(r[5]>>4))
		}
		limit := float64(defaultLimit)
		if r[1]&(1<<7) != 0 {
			limit *= 2
		}
		s := infer.Sample{T: t, CPUSeconds: cpu, MemoryBytes: float64(r[3]) * 512 * 1024, MemoryLimitBytes: limit, NetworkBytes: net, DiskBytes: disk}
		for i, f := range []*float64{&s.CPUSeconds, &s.MemoryBytes, &s.NetworkBytes, &s.DiskBytes} {
			if r[1]&(1<<i) == 0 {
				*f = math.NaN()
			}
		}
		if math.IsNaN(s.MemoryBytes) {
			s.MemoryLimitBytes = math.NaN()
		}
		events = append(events, event{t: t, sample: s, noEval: noEval})
	}
	return w, events, true
}

// FuzzFeaturesMatchPrometheus compares infer with Prometheus over short series built
// from the fuzz bytes (see decodeFuzz), at every sample and evaluation-only time.
//
//	go test -run '^$' -fuzz FuzzFeaturesMatchPrometheus -fuzztime 2m
func FuzzFeaturesMatchPrometheus(f *testing.F) {
	// Seeds: a steady 1 s series, sparse series with gaps beyond the lookback, resets
	// and partial samples, and evaluation-only times.
	f.Add(fuzzSeed([]byte{0, 2, 5, 5, 0, 0}, 40, func(i int) []byte {
		return []byte{24, 0x0f, 40, byte(60 + i%5), 50, 0x21}
	}))
	f.Add(fuzzSeed([]byte{3, 7, 19, 2, 1, 77}, 60, func(i int) []byte {
		dt := byte(100 + i*7%120)
		if i%17 == 16 {
			dt = 240
		}
		return []byte{dt, byte(0x0f | (i%9/8)<<4), byte(i * 13), byte(i * 29), byte(i * 5), byte(i)}
	}))
	f.Add(fuzzSeed([]byte{1, 3, 45, 1, 9, 200}, 80, func(i int) []byte {
		flags := byte(i*37) & 0x7f
		return []byte{byte(i * 11 % 60), flags, byte(i * 7), byte(200 - i), byte(i * 3), byte(i * 19)}
	}))
	f.Add(fuzzSeed([]byte{4, 4, 13, 3, 250, 3}, 50, func(i int) []byte {
		return []byte{byte(170 + i%3), byte(0x0f | (i%2)<<7), 3, byte(100 + i), 0, 0}
	}))

	f.Fuzz(func(t *testing.T, data []byte) {
		w, events, ok := decodeFuzz(data)
		if !ok {
			t.Skip("too short")
		}
		out := compareRun(t, w, w.queries(), events)
		report(t, out, w.String())
	})
}

// fuzzSeed builds a fuzz input from a header and n records.
func fuzzSeed(header []byte, n int, rec func(i int) []byte) []byte {
	out := append([]byte(nil), header...)
	for i := range n {
		out = append(out, rec(i)...)
	}
	return out
}
