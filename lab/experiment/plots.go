package experiment

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"github.com/amf-edge/amf/lab/plot"
)

// plots writes sot.svg (E2E SOT per run, reactive vs AMF, like the paper's
// Fig 8/9) and timeline.svg (probability, memory and events of one run: the
// first AMF run, else the first observe or reactive run).
func (res *Results) plots(dir string) error {
	by := map[Mode][]RunResult{}
	for _, r := range res.Runs {
		by[r.Mode] = append(by[r.Mode], r)
	}
	n := max(len(by[Reactive]), len(by[AMF]))
	if n > 0 {
		c := plot.GroupedBars{Title: "End-to-end service outage per run", XLabel: "run", YLabel: "E2E SOT (s)", LogY: true, Unit: " s"}
		for i := 1; i <= n; i++ {
			c.Groups = append(c.Groups, strconv.Itoa(i))
		}
		for _, m := range []Mode{Reactive, AMF} {
			s := plot.BarSeries{Name: map[Mode]string{Reactive: "reactive (Kubernetes restart)", AMF: "AMF (switchover)"}[m]}
			for i := 0; i < n; i++ {
				v := math.NaN()
				if i < len(by[m]) && by[m][i].SOTAt != "" {
					v = by[m][i].SOTMs / 1000
				}
				s.Values = append(s.Values, v)
			}
			c.Series = append(c.Series, s)
		}
		if err := writeSVG(filepath.Join(dir, "sot.svg"), c.SVG); err != nil {
			return err
		}
	}
	var run *RunResult
	for _, m := range []Mode{AMF, Observe, Reactive} {
		if len(by[m]) > 0 {
			run = &by[m][0]
			break
		}
	}
	if run == nil {
		return nil
	}
	var prob, mem plot.Series
	prob.Name, mem.Name = "anomaly probability", "memory (% of limit)"
	for _, p := range run.Timeline {
		if p.Probability != nil {
			prob.Points = append(prob.Points, plot.Point{X: p.T, Y: *p.Probability})
		}
		if p.MemoryPct != nil {
			mem.Points = append(mem.Points, plot.Point{X: p.T, Y: *p.MemoryPct})
		}
	}
	t := plot.Timeline{
		Title: fmt.Sprintf("%s run %d: the staged fault (0 = onset)", run.Mode, run.Index),
		Panels: []plot.Panel{
			{YLabel: "probability", YMin: 0, YMax: 1, Series: []plot.Series{prob}, Lines: []plot.HLine{{Y: 0.5, Label: "threshold"}}},
			{YLabel: "memory %", YMin: 0, YMax: 110, Series: []plot.Series{mem}, Lines: []plot.HLine{{Y: 100, Label: "limit"}}},
		},
		Markers: []plot.Marker{{X: 0, Label: "onset"}},
	}
	for _, m := range []struct {
		v     *float64
		label string
	}{{run.Detection, "detection"}, {run.Confirmation, "confirmation"}, {run.StandbyReady, "standby Ready"}, {run.PrimaryRetired, "primary retired"}, {run.NewPrimaryReady, "new primary Ready (on the state)"}, {run.OOM, "OOM"}} {
		if m.v != nil {
			t.Markers = append(t.Markers, plot.Marker{X: *m.v, Label: m.label})
		}
	}
	return writeSVG(filepath.Join(dir, "timeline.svg"), t.SVG)
}

func writeSVG(path string, draw func() ([]byte, error)) error {
	b, err := draw()
	if err != nil {
		return fmt.Errorf("plot %s: %w", filepath.Base(path), err)
	}
	return os.WriteFile(path, b, 0o644)
}
