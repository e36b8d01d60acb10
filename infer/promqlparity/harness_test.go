package promqlparity

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/util/teststorage"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/infer"
)

// relTolerance is the agreement required between infer and Prometheus:
// |a-b| <= relTolerance*max(|a|,|b|). There is deliberately no absolute floor: both
// sides run the same float64 operations in the same order on the same points, so
// values near zero (constant series, flat memory) come out identical, and a floor
// would only hide a real difference in which points were used.
const relTolerance = 1e-9

// windows is one configuration of the PromQL windows. Windows are configuration in
// infer (a model is only valid with the windows it was trained with), so the
// comparison is run with several.
type windows struct {
	rate, deriv, step, lookback time.Duration
}

// windowSets are the configurations every scenario is compared under.
var windowSets = []windows{
	{rate: 5 * time.Minute, deriv: 10 * time.Minute, step: 5 * time.Second, lookback: 5 * time.Minute}, // the published pipeline
	{rate: time.Minute, deriv: 2 * time.Minute, step: time.Second, lookback: 5 * time.Minute},
	{rate: 30 * time.Second, deriv: 90 * time.Second, step: 7 * time.Second, lookback: 5 * time.Minute},
	{rate: 30 * time.Second, deriv: 90 * time.Second, step: 7 * time.Second, lookback: 45 * time.Second}, // lookback shorter than the deriv window
}

func (w windows) String() string {
	return fmt.Sprintf("rate=%s,deriv=%s,step=%s,lookback=%s",
		promDuration(w.rate), promDuration(w.deriv), promDuration(w.step), promDuration(w.lookback))
}

func (w windows) config() infer.Config {
	c := infer.DefaultConfig()
	c.RateWindow, c.DerivWindow, c.Step, c.Lookback = w.rate, w.deriv, w.step, w.lookback
	return c
}

// promDuration formats d as a PromQL duration ("5m", "1m30s", "250ms").
func promDuration(d time.Duration) string { return model.Duration(d).String() }

// Series names in Prometheus storage, one per field of infer.Sample.
const (
	cpuName   = "cpu_seconds_total"
	memName   = "memory_bytes"
	limitName = "memory_limit_bytes"
	netName   = "network_bytes_total"
	diskName  = "disk_bytes_total"
)

// queries returns, in feature order, the PromQL that defines each feature.
func (w windows) queries() [contract.NumFeatures]string {
	return w.queriesWithMemory(fmt.Sprintf("%s / %s * 100", memName, limitName))
}

// queriesNoLimit is queries for a container without a memory limit: infer divides by
// Config.MemoryReference instead.
func (w windows) queriesNoLimit() [contract.NumFeatures]string {
	ref := strconv.FormatFloat(w.config().MemoryReference, 'f', -1, 64)
	return w.queriesWithMemory(fmt.Sprintf("%s / %s * 100", memName, ref))
}

func (w windows) queriesWithMemory(memoryPercent string) [contract.NumFeatures]string {
	r, d, s := promDuration(w.rate), promDuration(w.deriv), promDuration(w.step)
	return [contract.NumFeatures]string{
		contract.CPUPercent:           fmt.Sprintf("rate(%s[%s]) * 100", cpuName, r),
		contract.MemoryPercent:        memoryPercent,
		contract.NetworkIOBytesPerSec: fmt.Sprintf("rate(%s[%s])", netName, r),
		contract.DiskIOBytesPerSec:    fmt.Sprintf("rate(%s[%s])", diskName, r),
		contract.CPUGrowthRate:        fmt.Sprintf("deriv(rate(%s[%s])[%s:%s])", cpuName, r, d, s),
		contract.MemoryGrowthRate:     fmt.Sprintf("deriv(%s[%s:%s])", memName, d, s),
	}
}

// event is one step of a run, in time order: a sample, which is added and then
// evaluated at its own time (as the live sidecar and replay do), or an evaluation
// alone at a time between samples, or a sample added without an evaluation (a caller
// that evaluates less often than it samples).
type event struct {
	evalOnly bool
	noEval   bool // a sample only added
	t        int64
	sample   infer.Sample // when !evalOnly; sample.T == t
}

// loadPrometheus appends the samples of events to a fresh in-memory TSDB. A NaN field
// is a series without a point at that time. The limit is appended only together with
// the memory reading, and only when it is a limit (> 0 and finite; otherwise infer
// uses its memory reference, see queriesNoLimit): infer divides each memory reading by
// the limit read with it, while PromQL matches the two series by lookback
// independently, so the two agree exactly when the limit is scraped with the memory
// (as the sidecar does) — which is what the generators produce.
func loadPrometheus(t testing.TB, events []event) storage.Queryable {
	t.Helper()
	st := teststorage.New(t, func(o *tsdb.Options) {
		o.WALSegmentSize = -1 // no write-ahead log: nothing outlives the test
		o.StripeSize = 16     // 5 series: the default 16384-way series map costs most of the setup
	})
	app := st.Appender(context.Background())
	var (
		cpu   = labels.FromStrings(labels.MetricName, cpuName, "pod", "broker-0")
		mem   = labels.FromStrings(labels.MetricName, memName, "pod", "broker-0")
		limit = labels.FromStrings(labels.MetricName, limitName, "pod", "broker-0")
		net   = labels.FromStrings(labels.MetricName, netName, "pod", "broker-0")
		disk  = labels.FromStrings(labels.MetricName, diskName, "pod", "broker-0")
	)
	var refs [5]storage.SeriesRef
	add := func(i int, l labels.Labels, ts int64, v float64) {
		if math.IsNaN(v) {
			return
		}
		ref, err := app.Append(refs[i], l, ts, v)
		if err != nil {
			t.Fatalf("prometheus append %s@%d=%v: %v", l, ts, v, err)
		}
		refs[i] = ref
	}
	for _, e := range events {
		if e.evalOnly {
			continue
		}
		s := e.sample
		add(0, cpu, s.T, s.CPUSeconds)
		add(1, mem, s.T, s.MemoryBytes)
		if !math.IsNaN(s.MemoryBytes) && s.MemoryLimitBytes > 0 && !math.IsInf(s.MemoryLimitBytes, 1) {
			add(2, limit, s.T, s.MemoryLimitBytes)
		}
		add(3, net, s.T, s.NetworkBytes)
		add(4, disk, s.T, s.DiskBytes)
	}
	if err := app.Commit(); err != nil {
		t.Fatalf("prometheus commit: %v", err)
	}
	return st
}

// newPromEngine returns a Prometheus 3 engine as the server configures it.
func newPromEngine(lookback time.Duration) *promql.Engine {
	return promql.NewEngine(promql.EngineOpts{
		MaxSamples:    50_000_000,
		Timeout:       time.Minute,
		LookbackDelta: lookback,
	})
}

// promResult is one feature as Prometheus computes it: ok is false when the query
// returned no sample.
type promResult struct {
	v  float64
	ok bool
}

// promEval runs the six feature queries as instant queries at ts.
func promEval(ctx context.Context, eng *promql.Engine, db storage.Queryable, qs *[contract.NumFeatures]string, ts int64) ([contract.NumFeatures]promResult, error) {
	var out [contract.NumFeatures]promResult
	for i, q := range qs {
		qry, err := eng.NewInstantQuery(ctx, db, nil, q, time.UnixMilli(ts))
		if err != nil {
			return out, fmt.Errorf("%s: %w", q, err)
		}
		res := qry.Exec(ctx)
		if res.Err != nil {
			qry.Close()
			return out, fmt.Errorf("%s at %d: %w", q, ts, res.Err)
		}
		vec, err := res.Vector()
		if err != nil {
			qry.Close()
			return out, fmt.Errorf("%s at %d: %w", q, ts, err)
		}
		switch len(vec) {
		case 0:
		case 1:
			if vec[0].H != nil {
				qry.Close()
				return out, fmt.Errorf("%s at %d: histogram result", q, ts)
			}
			out[i] = promResult{v: vec[0].F, ok: true}
		default:
			qry.Close()
			return out, fmt.Errorf("%s at %d: %d series, want at most 1", q, ts, len(vec))
		}
		qry.Close()
	}
	return out, nil
}

// expectedWhy is the reason infer must give when Prometheus returns nothing.
var expectedWhy = [contract.NumFeatures]infer.Undefined{
	contract.CPUPercent:           infer.TooFewSamples,
	contract.MemoryPercent:        infer.NoRecentSample,
	contract.NetworkIOBytesPerSec: infer.TooFewSamples,
	contract.DiskIOBytesPerSec:    infer.TooFewSamples,
	contract.CPUGrowthRate:        infer.TooFewRatePoints,
	contract.MemoryGrowthRate:     infer.TooFewRatePoints,
}

// relErr is |a-b| / max(|a|,|b|), 0 when a == b.
func relErr(a, b float64) float64 {
	if a == b {
		return 0
	}
	return math.Abs(a-b) / math.Max(math.Abs(a), math.Abs(b))
}

// agree reports whether infer's feature matches Prometheus' result, and why not.
func agree(i int, v infer.Vector, p promResult) (bool, string) {
	ours, why := v.Values[i], v.Why[i]
	if !p.ok {
		if why == infer.Defined || !math.IsNaN(ours) {
			return false, fmt.Sprintf("prometheus: no sample; infer: %v (%v)", ours, why)
		}
		if why != expectedWhy[i] {
			return false, fmt.Sprintf("both undefined, but infer says %q, want %q", why, expectedWhy[i])
		}
		return true, ""
	}
	if why != infer.Defined || math.IsNaN(ours) {
		return false, fmt.Sprintf("prometheus: %v; infer: undefined (%v), value %v", p.v, why, ours)
	}
	if math.IsNaN(p.v) || relErr(ours, p.v) > relTolerance {
		return false, fmt.Sprintf("prometheus: %v; infer: %v (relative error %.3g)", p.v, ours, relErr(ours, p.v))
	}
	return true, ""
}

// outcome sums up one comparison run.
type outcome struct {
	evals      int     // evaluation times compared
	defined    int     // feature values Prometheus defined (and infer matched or not)
	maxRelErr  float64 // largest relative error among agreeing defined values
	mismatches []string
}

const maxReported = 8

// compareRun feeds events to a new infer.Engine, evaluating after every sample and at
// every evaluation-only time, and compares each evaluation with Prometheus over the
// same data. It stops at the first error from either side.
func compareRun(t testing.TB, w windows, qs [contract.NumFeatures]string, events []event) outcome {
	t.Helper()
	eng, err := infer.NewEngine(w.config())
	if err != nil {
		t.Fatalf("infer.NewEngine(%v): %v", w, err)
	}
	db := loadPrometheus(t, events)
	pe := newPromEngine(w.lookback)
	ctx := context.Background()
	names := contract.FeatureNames()

	var out outcome
	for k, e := range events {
		if !e.evalOnly {
			if err := eng.Add(e.sample); err != nil {
				t.Fatalf("event %d: infer Add(%+v): %v", k, e.sample, err)
			}
			if e.noEval {
				continue
			}
		}
		v, err := eng.Eval(e.t)
		if err != nil {
			t.Fatalf("event %d: infer Eval(%d): %v", k, e.t, err)
		}
		p, err := promEval(ctx, pe, db, &qs, e.t)
		if err != nil {
			t.Fatalf("event %d: prometheus: %v", k, err)
		}
		out.evals++
		for i := range contract.NumFeatures {
			ok, msg := agree(i, v, p[i])
			if p[i].ok {
				out.defined++
				if ok {
					out.maxRelErr = max(out.maxRelErr, relErr(v.Values[i], p[i].v))
				}
			}
			if !ok {
				out.mismatches = append(out.mismatches, fmt.Sprintf("t=%d (event %d, %s, t%%step=%dms): %s = %s: %s",
					e.t, k, kind(e), e.t%w.step.Milliseconds(), names[i], qs[i], msg))
			}
		}
	}
	return out
}

func kind(e event) string {
	if e.evalOnly {
		return "evaluation only"
	}
	return "sample, then evaluation"
}

// report fails t with the mismatches of out, and how to reproduce them.
func report(t testing.TB, out outcome, repro string) {
	t.Helper()
	if len(out.mismatches) == 0 {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d feature values differ from Prometheus over %d evaluations (%s)\n", len(out.mismatches), out.evals, repro)
	for i, m := range out.mismatches {
		if i == maxReported {
			fmt.Fprintf(&b, "  ... and %d more\n", len(out.mismatches)-maxReported)
			break
		}
		fmt.Fprintf(&b, "  %s\n", m)
	}
	t.Error(b.String())
}
