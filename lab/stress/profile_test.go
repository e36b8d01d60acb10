package stress

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

const mi = 1 << 20

func TestParseProfile(t *testing.T) {
	s := time.Second
	tests := []struct {
		spec string
		want []Phase
	}{
		{"60s", []Phase{{Duration: 60 * s}}},
		{"60s:mem=60Mi,cpu=0.4;60s:mem=150Mi,ramp=10Mi/s", []Phase{
			{Duration: 60 * s, Memory: 60 * mi, CPU: 0.4},
			{Duration: 60 * s, Memory: 150 * mi, Ramp: 10 * mi}}},
		// The paper's staged fault.
		{"60s;120s:mem=60Mi,cpu=0.4;60s:mem=150Mi", []Phase{
			{Duration: 60 * s}, {Duration: 120 * s, Memory: 60 * mi, CPU: 0.4}, {Duration: 60 * s, Memory: 150 * mi}}},
		{" 1m30s : mem = 1.5Gi , cpu = 400m ", []Phase{{Duration: 90 * s, Memory: 3 << 29, CPU: 0.4}}},
		{"1s:mem=100M", []Phase{{Duration: s, Memory: 100e6}}},
		{"1s:mem=64KiB,ramp=1k/s", []Phase{{Duration: s, Memory: 64 << 10, Ramp: 1000}}},
		{"1s:mem=4096", []Phase{{Duration: s, Memory: 4096}}},
		{"1s:mem=4096B", []Phase{{Duration: s, Memory: 4096}}},
		{"1s:mem=0,cpu=0", []Phase{{Duration: s}}},
		{"1s:cpu=1.5", []Phase{{Duration: s, CPU: 1.5}}},
		{"1s:cpu=.25", []Phase{{Duration: s, CPU: 0.25}}},
		{"500ms:ramp=1Mi/s", []Phase{{Duration: 500 * time.Millisecond, Ramp: mi}}},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			p, err := ParseProfile(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p.Phases, tc.want) {
				t.Fatalf("got %+v\nwant %+v", p.Phases, tc.want)
			}
			// String writes the same profile back.
			q, err := ParseProfile(p.String())
			if err != nil || !reflect.DeepEqual(q, p) {
				t.Fatalf("String %q parses to %+v, %v", p.String(), q, err)
			}
		})
	}
}

func TestParseProfileErrors(t *testing.T) {
	tests := []struct {
		spec   string
		phase  int
		column int    // 1-based
		text   string // the faulty text quoted in the error
		msg    string // part of what to do
	}{
		{"", 1, 1, "", "empty profile"},
		{"60s;", 2, 5, "", "remove the extra ';'"},
		{"60s;;1s", 2, 5, "", "empty phase"},
		{"60", 1, 1, "60", "Go duration such as 90s"},
		{"0s", 1, 1, "0s", "must be positive"},
		{"-5s", 1, 1, "-5s", "must be positive"},
		{"25h", 1, 1, "25h", "over 24h0m0s"},
		{":mem=1Mi", 1, 1, "", "missing duration"},
		{"60s:", 1, 5, "", "empty setting"},
		{"60s:mem=1Mi,", 1, 13, "", "extra ','"},
		{"60s:mem", 1, 5, "mem", "missing '='"},
		{"60s:memory=1Mi", 1, 5, "memory=1Mi", `unknown key "memory"`},
		{"60s:mem=1Mi,mem=2Mi", 1, 13, "mem=2Mi", "set twice"},
		{"10s;60s:mem=60m", 2, 13, "60m", "ambiguous"},
		{"60s:mem=60Xi", 1, 9, "60Xi", `unknown unit "Xi"`},
		{"60s:mem=-1Mi", 1, 9, "-1Mi", "non-negative size"},
		{"60s:mem=1e6", 1, 9, "1e6", "unknown unit"},
		{"60s:mem=NaN", 1, 9, "NaN", "non-negative size"},
		{"60s:mem=1.2.3Mi", 1, 9, "1.2.3Mi", "non-negative size"},
		{"60s:mem=2Ti", 1, 9, "2Ti", "over 1Ti"},
		{"60s:ramp=10Mi", 1, 10, "10Mi", "end it with /s"},
		{"60s:ramp=x/s", 1, 10, "x/s", "ramp: want a non-negative size"},
		{"60s:cpu=80%", 1, 9, "80%", "not a percentage"},
		{"60s:cpu=Inf", 1, 9, "Inf", "number of cores"},
		{"60s:cpu=-0.4", 1, 9, "-0.4", "number of cores"},
		{"60s:cpu=65", 1, 9, "65", "over 64"},
		{"1s; 2s :cpu= 0.5.5", 2, 14, "0.5.5", "cpu: want"},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			_, err := ParseProfile(tc.spec)
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("got %v, want a *SyntaxError", err)
			}
			if se.Phase != tc.phase || se.Offset+1 != tc.column || se.Text != tc.text || !strings.Contains(se.Msg, tc.msg) {
				t.Fatalf("got phase %d column %d text %q msg %q\nwant phase %d column %d text %q msg containing %q",
					se.Phase, se.Offset+1, se.Text, se.Msg, tc.phase, tc.column, tc.text, tc.msg)
			}
			if want := tc.spec[se.Offset:]; !strings.HasPrefix(want, se.Text) {
				t.Errorf("text %q is not at offset %d of %q", se.Text, se.Offset, tc.spec)
			}
			t.Log(err)
		})
	}
}

func TestScale(t *testing.T) {
	p, err := ParseProfile("60s;120s:mem=60Mi,cpu=0.4;60s:mem=150Mi,ramp=10Mi/s")
	if err != nil {
		t.Fatal(err)
	}
	q, err := p.Scale(0.1)
	if err != nil {
		t.Fatal(err)
	}
	want := "6s;12s:mem=60Mi,cpu=0.4;6s:mem=150Mi,ramp=10Mi/s"
	if q.String() != want {
		t.Errorf("scaled %q, want %q", q, want)
	}
	if q.Duration() != 24*time.Second || p.Duration() != 240*time.Second {
		t.Errorf("durations %v %v", q.Duration(), p.Duration())
	}
	for _, f := range []float64{0, -1, 1e-12, 1e9} {
		if _, err := p.Scale(f); err == nil {
			t.Errorf("scale %v accepted", f)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, p := range []Profile{
		{},
		{Phases: []Phase{{}}},
		{Phases: []Phase{{Duration: time.Second, Memory: -1}}},
		{Phases: []Phase{{Duration: time.Second, Ramp: -1}}},
		{Phases: []Phase{{Duration: time.Second, CPU: -0.1}}},
		{Phases: []Phase{{Duration: time.Second}, {Duration: time.Second, CPU: 100}}},
	} {
		if err := p.Validate(); err == nil {
			t.Errorf("%+v accepted", p)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 1: "1", 1000: "1000", 1024: "1Ki", 1536: "1536", 60 * mi: "60Mi", 3 << 29: "1536Mi", 1 << 40: "1Ti"} {
		if got := FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}
