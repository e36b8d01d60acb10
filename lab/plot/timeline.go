package plot

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Point is one sample of a series: X in seconds from the timeline's origin.
type Point struct{ X, Y float64 }

// Series is a line. A NaN Y breaks it (no sample there).
type Series struct {
	Name   string
	Points []Point // in increasing X
}

// HLine is a horizontal reference line across a panel, e.g. the detector's 0.5
// threshold or the 100 % memory limit.
type HLine struct {
	Y     float64
	Label string
}

// Panel is one strip of a timeline with its own y axis.
type Panel struct {
	YLabel string
	// YMin and YMax fix the y range (e.g. 0 and 1 for a probability); when
	// both are 0 the range comes from the data and the lines.
	YMin, YMax float64
	Series     []Series
	Lines      []HLine
	Height     float64 // default 140
}

// Marker is a labelled event on the time axis (onset, detection, OOM…),
// drawn as a vertical line through every panel.
type Marker struct {
	X     float64 // seconds from the origin
	Label string
}

// Timeline is stacked panels sharing one time axis, with event markers.
type Timeline struct {
	Title  string
	XLabel string // default "time (s)"
	// XMin and XMax fix the time range; when both are 0 it covers the data
	// and the markers.
	XMin, XMax float64
	Panels     []Panel
	Markers    []Marker
	Width      float64 // default 900
}

// Seconds is t as a timeline X: seconds since origin.
func Seconds(origin, t time.Time) float64 { return t.Sub(origin).Seconds() }

// SVG draws the timeline. Lines are <polyline class="series"> (one per
// unbroken run of points), markers <line class="marker"> with <text
// class="marker-label">, reference lines <line class="hline">.
func (t Timeline) SVG() ([]byte, error) {
	if len(t.Panels) == 0 {
		return nil, errors.New("plot: a timeline needs at least one panel")
	}
	xlo, xhi := t.XMin, t.XMax
	if xlo == 0 && xhi == 0 {
		xlo, xhi = math.Inf(1), math.Inf(-1)
		for _, p := range t.Panels {
			for _, s := range p.Series {
				for _, pt := range s.Points {
					if !math.IsNaN(pt.X) {
						xlo, xhi = min(xlo, pt.X), max(xhi, pt.X)
					}
				}
			}
		}
		for _, m := range t.Markers {
			xlo, xhi = min(xlo, m.X), max(xhi, m.X)
		}
		if math.IsInf(xlo, 1) {
			xlo, xhi = 0, 1
		}
	}
	if math.IsNaN(xlo+xhi) || math.IsInf(xlo+xhi, 0) || xhi < xlo {
		return nil, fmt.Errorf("plot: bad time range [%v, %v]", xlo, xhi)
	}
	w := t.Width
	if w <= 0 {
		w = 900
	}
	xlabel := t.XLabel
	if xlabel == "" {
		xlabel = "time (s)"
	}
	const left, right, bottom, gap = 70.0, 160.0, 50.0, 16.0
	x0, x1 := left, w-right
	x := linearAxis(xlo, xhi, x0, x1, 10)
	if t.XMin != 0 || t.XMax != 0 { // a fixed range is kept as given
		x.lo, x.hi = xlo, xhi
		x.ticks = ticksWithin(x.ticks, xlo, xhi)
	}

	// Marker labels go in rows above the panels, each on the first row where
	// it overlaps no other label.
	rows := markerRows(t.Markers, x)
	nrows := 0
	for _, r := range rows {
		nrows = max(nrows, r+1)
	}
	top := 40 + float64(nrows)*15 + 6
	h := top + bottom
	for i, p := range t.Panels {
		if i > 0 {
			h += gap
		}
		h += panelHeight(p)
	}

	s := newSVG(w, h, t.Title)
	s.text("title", w/2, 24, "middle", t.Title, "font-size", num(titleFontSize), "font-weight", "bold")
	py := top
	for i, p := range t.Panels {
		if i > 0 {
			py += gap
		}
		ph := panelHeight(p)
		if err := s.panel(p, i, x, py, py+ph, i == len(t.Panels)-1); err != nil {
			return nil, err
		}
		py += ph
	}
	bottomY := py
	for i, m := range t.Markers {
		if math.IsNaN(m.X) || m.X < x.lo || m.X > x.hi {
			continue
		}
		mx := x.px(m.X)
		s.line("marker", mx, top-4, mx, bottomY, "stroke", axisColor, "stroke-dasharray", "4 3", "data-label", m.Label)
		ly := 40 + float64(rows[i])*15 + 8
		s.text("marker-label", clampLabel(mx, m.Label, w), ly, "middle", m.Label, "font-size", num(fontSize-1))
	}
	s.text("axis-label", (x0+x1)/2, h-12, "middle", xlabel)
	return s.bytes(), nil
}

func panelHeight(p Panel) float64 {
	if p.Height > 0 {
		return p.Height
	}
	return 140
}

// ticksWithin keeps the ticks in [lo, hi].
func ticksWithin(ts []float64, lo, hi float64) []float64 {
	var out []float64
	for _, v := range ts {
		if v >= lo-1e-9 && v <= hi+1e-9 {
			out = append(out, v)
		}
	}
	return out
}

// markerRows assigns each marker's label a row so labels in a row do not
// overlap.
func markerRows(ms []Marker, x axis) []int {
	rows := make([]int, len(ms))
	var ends []float64 // right edge of the last label in each row
	for i, m := range ms {
		if math.IsNaN(m.X) {
			continue
		}
		half := textWidth(m.Label, fontSize-1)/2 + 4
		c := x.px(m.X)
		r := 0
		for r < len(ends) && ends[r] > c-half {
			r++
		}
		if r == len(ends) {
			ends = append(ends, 0)
		}
		ends[r] = c + half
		rows[i] = r
	}
	return rows
}

// clampLabel moves a centred label's x so it stays inside the image.
func clampLabel(cx float64, label string, w float64) float64 {
	half := textWidth(label, fontSize-1) / 2
	return min(max(cx, half+2), w-half-2)
}

// panel draws one panel between pixel rows top and bottom.
func (s *svg) panel(p Panel, idx int, x axis, top, bottom float64, last bool) error {
	lo, hi := p.YMin, p.YMax
	if lo == 0 && hi == 0 {
		lo, hi = math.Inf(1), math.Inf(-1)
		for _, se := range p.Series {
			for _, pt := range se.Points {
				if !math.IsNaN(pt.Y) {
					lo, hi = min(lo, pt.Y), max(hi, pt.Y)
				}
			}
		}
		for _, l := range p.Lines {
			lo, hi = min(lo, l.Y), max(hi, l.Y)
		}
		if math.IsInf(lo, 1) {
			lo, hi = 0, 1
		}
	}
	if math.IsNaN(lo+hi) || math.IsInf(lo+hi, 0) || hi < lo {
		return fmt.Errorf("plot: panel %d (%q): bad y range [%v, %v]", idx+1, p.YLabel, lo, hi)
	}
	y := linearAxis(lo, hi, bottom, top, 4)
	if p.YMin != 0 || p.YMax != 0 {
		y.lo, y.hi = lo, hi
		y.ticks = ticksWithin(y.ticks, lo, hi)
	}
	s.open("g", "class", "panel", "data-panel", p.YLabel)
	for _, t := range y.ticks {
		py := y.px(t)
		s.line("grid", x.p0, py, x.p1, py, "stroke", gridColor)
		s.text("tick", x.p0-6, py+4, "end", y.tickText(t))
	}
	for _, t := range x.ticks {
		px := x.px(t)
		s.line("grid", px, top, px, bottom, "stroke", gridColor)
		if last {
			s.text("tick", px, bottom+16, "middle", x.tickText(t))
		}
	}
	s.rect("frame", x.p0, top, x.p1-x.p0, bottom-top, "fill", "none", "stroke", axisColor)
	mid := (top + bottom) / 2
	s.text("axis-label", 16, mid, "middle", p.YLabel, "transform", "rotate(-90 16 "+num(mid)+")")

	for _, l := range p.Lines {
		if l.Y < y.lo || l.Y > y.hi {
			continue
		}
		py := y.px(l.Y)
		s.line("hline", x.p0, py, x.p1, py, "stroke", "#888888", "stroke-dasharray", "6 4")
		if l.Label != "" {
			s.text("hline-label", x.p1-4, py-4, "end", l.Label, "font-size", num(fontSize-1))
		}
	}
	for i, se := range p.Series {
		var run [][2]float64
		flush := func() {
			if len(run) > 0 {
				s.polyline("series", run, "stroke", color(i), "stroke-width", "1.5", "data-series", se.Name)
			}
			run = run[:0]
		}
		for _, pt := range se.Points {
			if math.IsNaN(pt.Y) || math.IsNaN(pt.X) || pt.X < x.lo || pt.X > x.hi {
				flush()
				continue
			}
			// Values outside a fixed y range are drawn at its edge.
			run = append(run, [2]float64{x.px(pt.X), y.px(min(max(pt.Y, y.lo), y.hi))})
		}
		flush()
		// Legend to the right of the panel.
		ly := top + 14 + float64(i)*16
		s.line("swatch", x.p1+10, ly-4, x.p1+24, ly-4, "stroke", color(i), "stroke-width", "3")
		s.text("legend", x.p1+30, ly, "start", se.Name)
	}
	s.close("g")
	return nil
}
