package plot

import (
	"bytes"
	"encoding/xml"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// element is a parsed SVG element: its name, attributes and text.
type element struct {
	name  string
	attrs map[string]string
	text  string
}

// parseSVG checks that b is well-formed XML with an <svg> root in the SVG
// namespace and returns its elements in document order.
func parseSVG(t *testing.T, b []byte) []element {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	d.Strict = true
	var els []element
	var stack []int
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("invalid XML: %v\n%s", err, b)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			e := element{name: tok.Name.Local, attrs: map[string]string{}}
			for _, a := range tok.Attr {
				e.attrs[a.Name.Local] = a.Value
			}
			if len(els) == 0 && (e.name != "svg" || tok.Name.Space != "http://www.w3.org/2000/svg") {
				t.Fatalf("root element %v, want svg in the SVG namespace", tok.Name)
			}
			els = append(els, e)
			stack = append(stack, len(els)-1)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if len(stack) > 0 {
				els[stack[len(stack)-1]].text += string(tok)
			}
		}
	}
	if len(els) == 0 {
		t.Fatal("empty document")
	}
	return els
}

// class returns the elements of a class.
func class(els []element, c string) []element {
	var out []element
	for _, e := range els {
		if e.attrs["class"] == c {
			out = append(out, e)
		}
	}
	return out
}

func texts(els []element) []string {
	var out []string
	for _, e := range els {
		out = append(out, e.text)
	}
	return out
}

// golden compares b with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, b []byte) {
	t.Helper()
	p := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(b, want) {
		t.Errorf("%s differs from the golden file (go test ./lab/plot/ -update rewrites it after a deliberate change)", p)
	}
}

// The paper's reactive outages grow with Kubernetes' restart back-off; AMF's
// stay around a message interval or two.
func sotChart(log bool) GroupedBars {
	return GroupedBars{
		Title:  "E2E service outage time per run",
		XLabel: "run",
		YLabel: "E2E SOT (s)",
		Groups: []string{"1", "2", "3", "4", "5"},
		Series: []BarSeries{
			{Name: "reactive", Values: []float64{2.67, 12.9, 23.41, 43.7, 83.31}},
			{Name: "AMF", Values: []float64{0.21, 0.18, 0.25, 0.19, 0.22}},
		},
		LogY: log,
		Unit: " s",
	}
}

func TestGroupedBars(t *testing.T) {
	tests := []struct {
		name       string
		chart      GroupedBars
		bars       int
		labels     []string
		golden     string
		firstTicks []string
	}{
		{"log", sotChart(true), 10,
			[]string{"2.67 s", "0.210 s", "12.9 s", "0.180 s", "23.4 s", "0.250 s", "43.7 s", "0.190 s", "83.3 s", "0.220 s"},
			"grouped_bars_log.svg", []string{"0.1", "1", "10", "100"}},
		{"linear", sotChart(false), 10, nil, "grouped_bars_linear.svg", []string{"0", "20", "40", "60", "80", "100"}},
		{"missing and zero values", GroupedBars{
			Title: "gaps", Groups: []string{"a", "b", "c"}, LogY: true,
			Series: []BarSeries{{Name: "x", Values: []float64{1, math.NaN(), 0}}, {Name: "y", Values: []float64{10, 100, 1000}}},
		}, 4, []string{"1.00", "10.0", "n/a", "100", "0", "1000"}, "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := tc.chart.SVG()
			if err != nil {
				t.Fatal(err)
			}
			els := parseSVG(t, b)
			if n := len(class(els, "bar")); n != tc.bars {
				t.Errorf("%d bars, want %d", n, tc.bars)
			}
			values := texts(class(els, "value"))
			if want := len(tc.chart.Groups) * len(tc.chart.Series); len(values) != want {
				t.Errorf("%d value labels, want %d", len(values), want)
			}
			if tc.labels != nil && strings.Join(values, "|") != strings.Join(tc.labels, "|") {
				t.Errorf("labels %q, want %q", values, tc.labels)
			}
			if tc.firstTicks != nil {
				if got := texts(class(els, "tick")); strings.Join(got, "|") != strings.Join(tc.firstTicks, "|") {
					t.Errorf("y ticks %q, want %q", got, tc.firstTicks)
				}
			}
			if got := texts(class(els, "legend")); len(got) != len(tc.chart.Series) {
				t.Errorf("legend %q", got)
			}
			if tc.golden != "" {
				golden(t, tc.golden, b)
			}
		})
	}
}

func TestGroupedBarsTallestBarFits(t *testing.T) {
	for _, log := range []bool{false, true} {
		b, err := sotChart(log).SVG()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range class(parseSVG(t, b), "value") {
			if y := attrFloat(t, e, "y"); y < 64 {
				t.Errorf("log %v: label %q at y %v, above the plot area", log, e.text, y)
			}
		}
	}
}

func TestGroupedBarsErrors(t *testing.T) {
	for name, c := range map[string]GroupedBars{
		"no groups":     {Series: []BarSeries{{Name: "x"}}},
		"no series":     {Groups: []string{"a"}},
		"short series":  {Groups: []string{"a", "b"}, Series: []BarSeries{{Name: "x", Values: []float64{1}}}},
		"infinite data": {Groups: []string{"a"}, Series: []BarSeries{{Name: "x", Values: []float64{math.Inf(1)}}}},
	} {
		if _, err := c.SVG(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// A staged fault as the lab records it: anomaly probability and memory, with
// the events of a make-before-break switchover and the primary's OOM.
func faultTimeline() Timeline {
	var prob, mem []Point
	for s := 0; s <= 240; s += 5 {
		x := float64(s)
		p, m := 0.05, 30.0
		switch {
		case s >= 60 && s < 180:
			p, m = 0.3+float64(s-60)/200, 60+float64(s-60)/12
		case s >= 180:
			p, m = 0.97, 70+float64(s-180)*0.6
		}
		if s == 120 {
			p = math.NaN() // a missed sample breaks the line
		}
		prob = append(prob, Point{x, p})
		mem = append(mem, Point{x, m})
	}
	return Timeline{
		Title: "Staged fault on the edge broker",
		Panels: []Panel{
			{YLabel: "anomaly probability", YMin: 0, YMax: 1, Series: []Series{{Name: "primary", Points: prob}},
				Lines: []HLine{{Y: 0.5, Label: "threshold 0.5"}}},
			{YLabel: "memory (% of limit)", Series: []Series{{Name: "primary", Points: mem}},
				Lines: []HLine{{Y: 100, Label: "limit"}}},
		},
		Markers: []Marker{
			{X: 60, Label: "onset"}, {X: 112, Label: "detection"}, {X: 115, Label: "confirmation"},
			{X: 131, Label: "standby Ready"}, {X: 146, Label: "primary retired"}, {X: 228, Label: "OOM"},
		},
	}
}

func TestTimeline(t *testing.T) {
	tl := faultTimeline()
	b, err := tl.SVG()
	if err != nil {
		t.Fatal(err)
	}
	els := parseSVG(t, b)
	// The NaN breaks the probability into two lines; 49 samples, 48 drawn.
	series := class(els, "series")
	if len(series) != 3 {
		t.Fatalf("%d polylines, want 3", len(series))
	}
	points := 0
	for _, s := range series {
		points += len(strings.Fields(s.attrs["points"]))
	}
	if points != 48+49 {
		t.Errorf("%d points, want %d", points, 48+49)
	}
	markers := class(els, "marker")
	labels := texts(class(els, "marker-label"))
	if len(markers) != 6 || strings.Join(labels, "|") != "onset|detection|confirmation|standby Ready|primary retired|OOM" {
		t.Errorf("%d markers, labels %q", len(markers), labels)
	}
	if n := len(class(els, "hline")); n != 2 {
		t.Errorf("%d reference lines, want 2", n)
	}
	if n := len(class(els, "panel")); n != 2 {
		t.Errorf("%d panels, want 2", n)
	}
	// detection and confirmation are 3 s apart: their labels must not share a row.
	ml := class(els, "marker-label")
	if attrFloat(t, ml[1], "y") == attrFloat(t, ml[2], "y") {
		t.Error("overlapping marker labels share a row")
	}
	// Markers cross every panel: from above the first to the bottom of the last.
	frames := class(els, "frame")
	last := frames[len(frames)-1]
	bottom := attrFloat(t, last, "y") + attrFloat(t, last, "height")
	for _, m := range markers {
		if attrFloat(t, m, "y1") > attrFloat(t, frames[0], "y") || attrFloat(t, m, "y2") != bottom {
			t.Errorf("marker %q spans %v–%v, panels %v–%v", m.attrs["data-label"], m.attrs["y1"], m.attrs["y2"], frames[0].attrs["y"], bottom)
		}
	}
	golden(t, "timeline.svg", b)
}

func TestTimelineErrors(t *testing.T) {
	for name, tl := range map[string]Timeline{
		"no panel":   {},
		"bad range":  {XMin: 10, XMax: 5, Panels: []Panel{{}}},
		"bad yrange": {Panels: []Panel{{YMin: 1, YMax: -1}}},
	} {
		if _, err := tl.SVG(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	// An empty panel is still a valid drawing.
	b, err := Timeline{Panels: []Panel{{YLabel: "nothing yet"}}}.SVG()
	if err != nil {
		t.Fatal(err)
	}
	parseSVG(t, b)
}

func TestEscapesText(t *testing.T) {
	b, err := GroupedBars{Title: `<a & "b">`, Groups: []string{"x<y"}, Series: []BarSeries{{Name: "s&t", Values: []float64{1}}}}.SVG()
	if err != nil {
		t.Fatal(err)
	}
	els := parseSVG(t, b)
	if got := texts(class(els, "title")); len(got) != 1 || got[0] != `<a & "b">` {
		t.Errorf("title %q", got)
	}
	if got := class(els, "bar"); len(got) != 1 || got[0].attrs["data-series"] != "s&t" {
		t.Errorf("bars %+v", got)
	}
}

func TestFormatValue(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 0.2: "0.200", 2.671: "2.67", 83.31: "83.3", 123.4: "123", 0.0001234: "0.000123", -1.5: "-1.50"} {
		if got := FormatValue(v); got != want {
			t.Errorf("FormatValue(%v) = %q, want %q", v, got, want)
		}
	}
	if FormatValue(math.NaN()) != "n/a" {
		t.Error("NaN")
	}
}

func TestNiceStep(t *testing.T) {
	for raw, want := range map[float64]float64{0.7: 1, 1: 1, 1.1: 2, 3: 5, 7: 10, 16.7: 20, 0.013: 0.02, 0: 1} {
		if got := niceStep(raw); math.Abs(got-want) > 1e-12 {
			t.Errorf("niceStep(%v) = %v, want %v", raw, got, want)
		}
	}
}

func attrFloat(t *testing.T, e element, name string) float64 {
	t.Helper()
	var f float64
	if _, err := fmt.Sscan(e.attrs[name], &f); err != nil {
		t.Fatalf("attribute %s=%q of %s: %v", name, e.attrs[name], e.name, err)
	}
	return f
}
