package plot

import (
	"errors"
	"fmt"
	"math"
	"strconv"
)

// BarSeries is one kind of bar, e.g. "reactive" or "AMF".
type BarSeries struct {
	Name   string
	Values []float64 // one per group; NaN: no measurement (labelled "n/a")
}

// GroupedBars is a bar chart with one group of bars per category (e.g. per
// run) and one bar per series in each group, each labelled with its value.
type GroupedBars struct {
	Title  string
	XLabel string // under the group names, e.g. "run"
	YLabel string // e.g. "E2E SOT (s)"
	Groups []string
	Series []BarSeries
	// LogY draws a logarithmic y axis (decades), for values spanning orders of
	// magnitude like the paper's 0.1 s vs 80 s. A value ≤ 0 then has no bar; its
	// label still says the value.
	LogY bool
	// Unit is appended to value labels, e.g. " s".
	Unit string
	// Format writes value labels; default FormatValue.
	Format        func(float64) string
	Width, Height float64 // default 720 × 420
}

// SVG draws the chart. Bars are <rect class="bar">, value labels <text
// class="value">.
func (c GroupedBars) SVG() ([]byte, error) {
	if len(c.Groups) == 0 || len(c.Series) == 0 {
		return nil, errors.New("plot: grouped bars need at least one group and one series")
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range c.Series {
		if len(s.Values) != len(c.Groups) {
			return nil, fmt.Errorf("plot: series %q has %d values for %d groups", s.Name, len(s.Values), len(c.Groups))
		}
		for _, v := range s.Values {
			if math.IsInf(v, 0) {
				return nil, fmt.Errorf("plot: series %q has an infinite value", s.Name)
			}
			if math.IsNaN(v) || (c.LogY && v <= 0) {
				continue
			}
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	w, h := c.Width, c.Height
	if w <= 0 {
		w = 720
	}
	if h <= 0 {
		h = 420
	}
	format := c.Format
	if format == nil {
		format = FormatValue
	}
	const left, right, top, bottom = 70.0, 20.0, 64.0, 64.0
	x0, x1, y0, y1 := left, w-right, top, h-bottom

	var y axis
	switch {
	case math.IsInf(lo, 1): // nothing to draw: an empty axis
		if c.LogY {
			y = logAxis(0.1, 10, y1, y0, 0)
		} else {
			y = linearAxis(0, 1, y1, y0, 5)
		}
	case c.LogY:
		// Headroom for the label above the tallest bar.
		y = logAxis(lo, hi, y1, y0, 20)
	default:
		y = linearAxis(min(0, lo), max(0, hi*1.08), y1, y0, 5)
	}

	s := newSVG(w, h, c.Title)
	s.text("title", w/2, 24, "middle", c.Title, "font-size", num(titleFontSize), "font-weight", "bold")
	names := make([]string, len(c.Series))
	for i, se := range c.Series {
		names[i] = se.Name
	}
	lw := textLegendWidth(names)
	s.legend(w/2-lw/2, 46, names, func(i int, x, y float64) {
		s.rect("swatch", x, y-6, 12, 12, "fill", color(i))
	})

	// Grid and y axis.
	for _, t := range y.ticks {
		py := y.px(t)
		s.line("grid", x0, py, x1, py, "stroke", gridColor)
		s.text("tick", x0-6, py+4, "end", y.tickText(t))
	}
	s.line("axis", x0, y0, x0, y1, "stroke", axisColor)
	s.text("axis-label", 16, (y0+y1)/2, "middle", c.YLabel, "transform", "rotate(-90 16 "+num((y0+y1)/2)+")")

	// Bars from the baseline: 0 on a linear axis, the bottom on a log one.
	base := y1
	if !c.LogY {
		base = y.px(0)
	}
	gw := (x1 - x0) / float64(len(c.Groups))
	bw := gw * 0.8 / float64(len(c.Series))
	for g, name := range c.Groups {
		gx := x0 + float64(g)*gw
		s.text("group", gx+gw/2, y1+18, "middle", name)
		for i, se := range c.Series {
			v := se.Values[g]
			bx := gx + gw*0.1 + float64(i)*bw
			label := format(v)
			if !math.IsNaN(v) {
				label += c.Unit
			}
			ly := base - 4
			if !math.IsNaN(v) && (!c.LogY || v > 0) {
				py := y.px(v)
				top, height := min(py, base), math.Abs(base-py)
				s.rect("bar", bx+1, top, bw-2, height, "fill", color(i),
					"data-series", se.Name, "data-group", name, "data-value", strconv.FormatFloat(v, 'g', -1, 64))
				ly = py - 4
				if v < 0 {
					ly = py + 14
				}
			}
			s.text("value", bx+bw/2, ly, "middle", label, "font-size", num(fontSize-1))
		}
	}
	s.line("axis", x0, base, x1, base, "stroke", axisColor)
	s.text("axis-label", (x0+x1)/2, h-16, "middle", c.XLabel)
	return s.bytes(), nil
}

func textLegendWidth(names []string) float64 {
	w := 0.0
	for _, n := range names {
		w += 18 + textWidth(n, fontSize) + 16
	}
	return w - 16
}
