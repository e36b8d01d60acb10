package detect

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/infer"
)

const header = "time,cpu_seconds_total,memory_bytes,memory_limit_bytes,network_bytes_total,disk_bytes_total\n"

// linearCSV has n rows 1 s apart: 0.5 core, 1 kB/s memory growth, 100 MB limit.
func linearCSV(n int) string {
	var b strings.Builder
	b.WriteString(header)
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "%d.25,%g,%g,100000000,%g,%g\r\n", 1_700_000_000+i, 0.5*float64(i), 4e7+1000*float64(i), 900*float64(i), 10*float64(i))
	}
	return b.String()
}

func TestReplayWritesOneRowPerInputRow(t *testing.T) {
	var out bytes.Buffer
	if err := Replay(strings.NewReader(linearCSV(900)), &out, infer.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if want := "time,cpu_percent,memory_percent,network_io_bytes_per_sec,disk_io_bytes_per_sec,cpu_growth_rate,memory_growth_rate"; lines[0] != want {
		t.Fatalf("header = %q, want %q", lines[0], want)
	}
	if len(lines) != 901 {
		t.Fatalf("got %d rows, want 900 + header", len(lines)-1)
	}
	first := strings.Split(lines[1], ",")
	if first[0] != "1700000000.25" || first[1] != "" || first[2] == "" || first[5] != "" {
		t.Fatalf("first row %q: want time echoed, rates and growth empty, memory defined", lines[1])
	}
	last := strings.Split(lines[900], ",")
	want := map[int]float64{1: 50, 2: (4e7 + 1000*899) / 1e8 * 100, 3: 900, 4: 10, 6: 1000}
	for col, w := range want {
		got, err := strconv.ParseFloat(last[col], 64)
		if err != nil || math.Abs(got-w) > 1e-9*math.Abs(w) {
			t.Errorf("last row column %d = %q, want %g", col, last[col], w)
		}
	}
}

func TestReplayEmptyFieldMeansNoPoint(t *testing.T) {
	in := header + "1,0,1,,,0\n2,1,1,,,1\n"
	var out bytes.Buffer
	if err := Replay(strings.NewReader(in), &out, infer.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	rows := strings.Split(strings.TrimSpace(out.String()), "\n")
	f := strings.Split(rows[2], ",")
	if f[3] != "" {
		t.Fatalf("network with no samples = %q, want empty", f[3])
	}
	if f[2] != "9.5367431640625e-07" { // 1 byte of the 100 MiB reference, in %
		t.Fatalf("memory_percent without a limit = %q", f[2])
	}
}

func TestReplayRejectsBadInputWithItsLine(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		line     int
		column   string
		mention  string
		rowsKept int
	}{
		{"empty input", "", 1, "", "header", 0},
		{"missing column", "time,cpu_seconds_total,memory_bytes\n1,2,3\n", 1, "", "memory_limit_bytes", 0},
		{"duplicate column", "time,time,cpu_seconds_total,memory_bytes,memory_limit_bytes,network_bytes_total,disk_bytes_total\n", 1, "", "twice", 0},
		{"non-numeric value", header + "1,0,1,1,1,1\n2,abc,1,1,1,1\n", 3, "cpu_seconds_total", `"abc"`, 1},
		{"NaN value", header + "1,NaN,1,1,1,1\n", 2, "cpu_seconds_total", "finite", 0},
		{"time going backwards", header + "5,0,1,1,1,1\n6,0,1,1,1,1\n4,0,1,1,1,1\n", 4, "time", "increasing", 2},
		{"repeated time", header + "5,0,1,1,1,1\n5,0,1,1,1,1\n", 3, "time", "increasing", 1},
		{"empty time", header + ",0,1,1,1,1\n", 2, "time", "empty", 0},
		{"negative time", header + "-3,0,1,1,1,1\n", 2, "time", "Unix", 0},
		{"short row", header + "1,0,1,1,1,1\n2,0,1\n", 3, "", "fields", 1},
		{"negative counter", header + "1,0,1,1,1,1\n2,0,-5,1,1,1\n", 3, "memory_bytes", "negative", 1},
		{"negative limit", header + "1,0,1,-100,1,1\n", 2, "memory_limit_bytes", "negative", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			err := Replay(strings.NewReader(tt.in), &out, infer.DefaultConfig())
			var ie *InputError
			if !errors.As(err, &ie) {
				t.Fatalf("error = %v, want an *InputError", err)
			}
			if ie.Line != tt.line || ie.Column != tt.column || !strings.Contains(err.Error(), tt.mention) {
				t.Fatalf("error = %q (line %d, column %q), want line %d, column %q, mentioning %q", err, ie.Line, ie.Column, tt.line, tt.column, tt.mention)
			}
			rows := strings.Count(out.String(), "\n")
			if tt.rowsKept > 0 || rows > 0 {
				rows-- // header
			}
			if rows != tt.rowsKept {
				t.Fatalf("wrote %d rows before the error, want %d (nothing of the bad line)", rows, tt.rowsKept)
			}
		})
	}
}

func FuzzReplay(f *testing.F) {
	f.Add(linearCSV(3))
	f.Add(header + "1,0,1,,,0\n2,1,1,,,1\n")
	f.Add(header + "1,0,1,1,1,1\n1e300,1,1,1,1,1\n")
	f.Add("time\n\"1\n")
	f.Fuzz(func(t *testing.T, in string) {
		var out bytes.Buffer
		err := Replay(strings.NewReader(in), &out, infer.DefaultConfig())
		if err != nil {
			var ie *InputError
			if !errors.As(err, &ie) {
				t.Fatalf("non-input error %v", err)
			}
		}
		// Every row written must have the header's seven fields.
		for _, line := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
			if line != "" && strings.Count(line, ",") != 6 {
				t.Fatalf("malformed output row %q", line)
			}
		}
	})
}

func TestReplayWritesTheProjectionWhenAPredictWindowIsSet(t *testing.T) {
	cfg := infer.DefaultConfig()
	cfg.PredictWindow, cfg.PredictHorizon = time.Minute, time.Minute
	var out bytes.Buffer
	if err := Replay(strings.NewReader(linearCSV(900)), &out, cfg); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if h := strings.Split(lines[0], ","); h[len(h)-1] != infer.ProjectionName || len(h) != 2+contract.NumFeatures {
		t.Fatalf("header %q: want the features, then %s", lines[0], infer.ProjectionName)
	}
	if first := strings.Split(lines[1], ","); first[len(first)-1] != "" {
		t.Errorf("one sample projects nothing, got %q", first[len(first)-1])
	}
	// Memory climbs 1000 B/s: 60 s after the last sample it is 60 kB higher.
	last := strings.Split(lines[900], ",")
	got, err := strconv.ParseFloat(last[len(last)-1], 64)
	if want := (4e7 + 1000*(899+60)) / 1e8 * 100; err != nil || math.Abs(got-want) > 1e-9*want {
		t.Errorf("last projection %q, want %g", last[len(last)-1], want)
	}
}
