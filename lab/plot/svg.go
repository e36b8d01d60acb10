// Package plot draws the lab's small charts as SVG with the standard library
// only: GroupedBars (e.g. E2E service outage time per run, reactive vs AMF, as
// in the paper's Fig 8/9) and Timeline (stacked panels on a shared time axis,
// with labelled event markers). Output is deterministic, so it can be kept as
// golden files, and uses the generic sans-serif family, so it needs no fonts.
//
// It is lab test infrastructure: product code never imports it.
package plot

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// palette is Okabe & Ito's colour-blind-safe set, in an order where the first
// two (the usual "reactive" and "AMF") contrast well.
var palette = [...]string{"#D55E00", "#0072B2", "#009E73", "#E69F00", "#CC79A7", "#56B4E9", "#000000", "#F0E442"}

// color is the i-th series colour.
func color(i int) string { return palette[i%len(palette)] }

const (
	fontSize      = 12.0
	titleFontSize = 15.0
	textColor     = "#222222"
	gridColor     = "#dddddd"
	axisColor     = "#444444"
)

// textWidth estimates the width of s in the sans-serif font at size: without
// font metrics, 0.6 em per character is a safe upper bound for most glyphs.
func textWidth(s string, size float64) float64 {
	return 0.6 * size * float64(utf8.RuneCountInString(s))
}

// num formats a coordinate: two decimals at most, no trailing zeros, so the
// output is stable and small.
func num(f float64) string {
	f = math.Round(f*100) / 100
	if f == 0 {
		f = 0 // no "-0"
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

// svg accumulates an SVG document.
type svg struct {
	b bytes.Buffer
}

func newSVG(w, h float64, title string) *svg {
	s := &svg{}
	fmt.Fprintf(&s.b, `<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="sans-serif" font-size="%s">`+"\n",
		num(w), num(h), num(w), num(h), num(fontSize))
	s.b.WriteString("<title>")
	s.esc(title)
	s.b.WriteString("</title>\n")
	fmt.Fprintf(&s.b, `<rect class="background" x="0" y="0" width="%s" height="%s" fill="#ffffff"/>`+"\n", num(w), num(h))
	return s
}

func (s *svg) esc(t string) {
	_ = xml.EscapeText(&s.b, []byte(t)) // writing to a bytes.Buffer cannot fail
}

// attrs writes name="value" pairs; values are escaped.
func (s *svg) attrs(kv ...string) {
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "" {
			continue
		}
		s.b.WriteString(" " + kv[i] + `="`)
		s.esc(kv[i+1])
		s.b.WriteString(`"`)
	}
}

func (s *svg) rect(class string, x, y, w, h float64, kv ...string) {
	s.b.WriteString("<rect")
	s.attrs(append([]string{"class", class, "x", num(x), "y", num(y), "width", num(w), "height", num(h)}, kv...)...)
	s.b.WriteString("/>\n")
}

func (s *svg) line(class string, x1, y1, x2, y2 float64, kv ...string) {
	s.b.WriteString("<line")
	s.attrs(append([]string{"class", class, "x1", num(x1), "y1", num(y1), "x2", num(x2), "y2", num(y2)}, kv...)...)
	s.b.WriteString("/>\n")
}

// text writes a text element; anchor is start, middle or end.
func (s *svg) text(class string, x, y float64, anchor, t string, kv ...string) {
	s.b.WriteString("<text")
	s.attrs(append([]string{"class", class, "x", num(x), "y", num(y), "text-anchor", anchor, "fill", textColor}, kv...)...)
	s.b.WriteString(">")
	s.esc(t)
	s.b.WriteString("</text>\n")
}

func (s *svg) polyline(class string, pts [][2]float64, kv ...string) {
	var p strings.Builder
	for i, pt := range pts {
		if i > 0 {
			p.WriteByte(' ')
		}
		p.WriteString(num(pt[0]) + "," + num(pt[1]))
	}
	s.b.WriteString("<polyline")
	s.attrs(append([]string{"class", class, "points", p.String(), "fill", "none"}, kv...)...)
	s.b.WriteString("/>\n")
}

func (s *svg) open(tag string, kv ...string) {
	s.b.WriteString("<" + tag)
	s.attrs(kv...)
	s.b.WriteString(">\n")
}

func (s *svg) close(tag string) { s.b.WriteString("</" + tag + ">\n") }

func (s *svg) bytes() []byte {
	s.b.WriteString("</svg>\n")
	return s.b.Bytes()
}

// axis maps data values to pixels along one direction.
type axis struct {
	lo, hi   float64 // data range
	p0, p1   float64 // pixel range (p0 for lo)
	log      bool
	ticks    []float64
	tickText func(float64) string
}

func (a axis) px(v float64) float64 {
	if a.log {
		v, lo, hi := math.Log10(v), math.Log10(a.lo), math.Log10(a.hi)
		return a.p0 + (v-lo)/(hi-lo)*(a.p1-a.p0)
	}
	return a.p0 + (v-a.lo)/(a.hi-a.lo)*(a.p1-a.p0)
}

// linearAxis covers [lo, hi] with "nice" ticks (1, 2 or 5 × 10^k apart) and
// widens the range to the outer ticks.
func linearAxis(lo, hi, p0, p1 float64, maxTicks int) axis {
	if !(hi > lo) {
		lo, hi = lo-1, hi+1
	}
	step := niceStep((hi - lo) / float64(maxTicks))
	lo = math.Floor(lo/step+1e-9) * step
	hi = math.Ceil(hi/step-1e-9) * step
	a := axis{lo: lo, hi: hi, p0: p0, p1: p1}
	for i := 0; ; i++ {
		v := lo + float64(i)*step
		if v > hi+step/2 {
			break
		}
		a.ticks = append(a.ticks, v)
	}
	decimals := max(0, -int(math.Floor(math.Log10(step)+1e-9)))
	a.tickText = func(v float64) string { return strconv.FormatFloat(v, 'f', decimals, 64) }
	return a
}

// niceStep is the smallest 1, 2 or 5 × 10^k at least raw.
func niceStep(raw float64) float64 {
	if !(raw > 0) {
		return 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw*(1-1e-9) {
			return m * mag
		}
	}
	return 10 * mag
}

// logAxis covers [lo, hi] (both > 0) with a tick at every power of ten. The
// range spans whole decades, except that the top grows past the decade when
// hi would come closer than pad pixels to it (room for a label).
func logAxis(lo, hi, p0, p1, pad float64) axis {
	a := axis{log: true, p0: p0, p1: p1}
	l := math.Floor(math.Log10(lo) + 1e-9)
	h := math.Ceil(math.Log10(hi) - 1e-9)
	if h <= l {
		h = l + 1
	}
	// With k = pad / height, hi sits pad pixels below the top when
	// top − log hi = k (top − l).
	if k := pad / math.Abs(p1-p0); k < 1 {
		h = max(h, (math.Log10(hi)-k*l)/(1-k))
	}
	a.lo, a.hi = math.Pow(10, l), math.Pow(10, h)
	for e := l; e <= h+1e-9; e++ {
		a.ticks = append(a.ticks, math.Pow(10, e))
	}
	a.tickText = func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	return a
}

// FormatValue is the default value label: three significant digits, without
// exponent for the usual range of outage times (0.001 to 99 999).
func FormatValue(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v):
		return "n/a"
	case a == 0:
		return "0"
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	case a >= 0.001:
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// legend draws swatches and names in a row from (x, y), returning its width.
func (s *svg) legend(x, y float64, names []string, swatch func(i int, x, y float64)) float64 {
	start := x
	for i, n := range names {
		swatch(i, x, y)
		s.text("legend", x+18, y+4, "start", n)
		x += 18 + textWidth(n, fontSize) + 16
	}
	return x - start
}
