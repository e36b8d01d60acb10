package model

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/amf-edge/amf/contract"
)

// Explanations say which features drove a score.
//
// For the trees the method is Saabas' path attribution (A. Saabas, "Interpreting
// random forests", 2014; the treeinterpreter package): every node of a tree has
// an expected value, the mean of the leaves below it weighted by how many
// training samples reached each (leaf_count), so a leaf's is its value. Walking
// x's decision path from the root, each split credits its feature with
//
//	E[child] - E[node]
//
// and the credits telescope to leaf - E[root]. Summed over the trees,
//
//	Bias + Σ Contributions = Σ E[root] + Σ (leaf - E[root]) = Raw(x),
//
// exact for the model up to the rounding of the reordered float64 sums. The
// contributions are on the raw (log-odds) scale, where the trees add up; the
// probability is sigmoid(Raw).
//
// For the predict_linear detector the explanation is the line itself: the
// time until it meets the limit (SecondsToLimit).

// ErrNoExplanation is returned for a model whose text cannot be explained: a
// tree without leaf_count, or a predict_linear detector asked for trees.
var ErrNoExplanation = errors.New("no explanation")

// Explanation is the attribution of one tree model score.
type Explanation struct {
	Bias          float64                       // Σ over trees of the root's expected value
	Contributions [contract.NumFeatures]float64 // per feature, on the raw (log-odds) scale
}

// Raw is Bias plus the contributions: the model's raw margin for x.
func (e Explanation) Raw() float64 {
	s := e.Bias
	for _, c := range e.Contributions {
		s += c
	}
	return s
}

// Contribution is one feature's share of a score.
type Contribution struct {
	Feature string  // a FeatureNames entry
	Value   float64 // raw (log-odds) scale; > 0 pushes towards anomalous
}

// negligible is the share of the largest contribution below which a
// contribution is float rounding of the telescoping sums (a split whose two
// sides have the same expected value), not a push.
const negligible = 1e-9

// Top returns the n features that pushed the score up most, largest first
// (ties in feature order); features that pushed it down, or by a negligible
// amount, are left out, since they did not drive an anomaly.
func (e Explanation) Top(n int) []Contribution {
	largest := 0.0
	for _, c := range e.Contributions {
		largest = max(largest, math.Abs(c))
	}
	idx := make([]int, 0, contract.NumFeatures)
	for i, c := range e.Contributions {
		if c > negligible*largest {
			idx = append(idx, i)
		}
	}
	sort.SliceStable(idx, func(a, b int) bool { return e.Contributions[idx[a]] > e.Contributions[idx[b]] })
	if len(idx) > n {
		idx = idx[:n]
	}
	out := make([]Contribution, len(idx))
	names := contract.FeatureNames()
	for k, i := range idx {
		out[k] = Contribution{Feature: names[i], Value: e.Contributions[i]}
	}
	return out
}

// FormatTop renders contributions as one short line for logs and messages:
// "memory_growth_rate +2.31, memory_percent +0.84" (3 significant digits).
func FormatTop(cs []Contribution) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		v := strconv.FormatFloat(c.Value, 'g', 3, 64)
		if c.Value >= 0 {
			v = "+" + v
		}
		parts[i] = c.Feature + " " + v
	}
	return strings.Join(parts, ", ")
}

// Explain attributes the tree model's raw score of x to the features (see the
// method above). It is a pure function of the model and x. The
// predict_linear detector has no trees: ErrNoExplanation (its explanation is
// SecondsToLimit).
func (m *Model) Explain(x *[contract.NumFeatures]float64) (Explanation, error) {
	if m.linear != nil {
		return Explanation{}, fmt.Errorf("model %s is the predict_linear rule, not trees (its explanation is the time to the limit): %w", m.source, ErrNoExplanation)
	}
	if m.means == nil {
		return Explanation{}, fmt.Errorf("model %s: %w: %v", m.source, ErrNoExplanation, m.meansErr)
	}
	var e Explanation
	for k := range m.trees {
		e.Bias += pathContributions(&m.trees[k], m.means[k], x, &e.Contributions)
	}
	return e, nil
}

// pathContributions adds tree t's Saabas credits for x to c and returns the
// tree's bias, E[root]. mean holds the expected value of each internal node.
func pathContributions(t *lgbTree, mean []float64, x *[contract.NumFeatures]float64, c *[contract.NumFeatures]float64) (bias float64) {
	if len(t.left) == 0 {
		return t.leaf[0] // a single leaf: all bias, no split to credit
	}
	i := int32(0)
	for {
		next := t.child(i, x)
		var e float64
		if next < 0 {
			e = t.leaf[^next]
		} else {
			e = mean[next]
		}
		c[t.feature[i]] += e - mean[i]
		if next < 0 {
			return mean[0]
		}
		i = next
	}
}

// treeMeans is nodeMeans of every tree, or nil and why one is unknown.
func treeMeans(trees []lgbTree) ([][]float64, error) {
	out := make([][]float64, len(trees))
	for k := range trees {
		m, err := nodeMeans(&trees[k])
		if err != nil {
			return nil, fmt.Errorf("tree %d: %w", k, err)
		}
		out[k] = m
	}
	return out, nil
}

// nodeMeans returns the expected value of every internal node of t: the
// leaf_count-weighted mean of the leaves below it.
func nodeMeans(t *lgbTree) ([]float64, error) {
	if len(t.left) == 0 {
		return nil, nil
	}
	if t.leafCount == nil {
		return nil, errors.New("a tree has no leaf_count, so its nodes' expected values are unknown")
	}
	mean := make([]float64, len(t.left))
	var visit func(c int32) (sum, count float64)
	visit = func(c int32) (sum, count float64) {
		if c < 0 {
			n := t.leafCount[^c]
			return n * t.leaf[^c], n
		}
		ls, ln := visit(t.left[c])
		rs, rn := visit(t.right[c])
		sum, count = ls+rs, ln+rn
		mean[c] = sum / count
		return sum, count
	}
	if _, n := visit(0); !(n > 0) {
		return nil, errors.New("a tree's leaf_count sums to 0")
	}
	for _, v := range mean {
		if math.IsNaN(v) {
			// A subtree no training sample reached: its mean is undefined.
			return nil, errors.New("a subtree has leaf_count 0 throughout")
		}
	}
	return mean, nil
}

// SecondsToLimit is the predict_linear detector's explanation: how long until
// the line through the last W of memory meets the limit (the fraction L of it
// the rule alarms at, 1 for the embedded rule), from the projection H ahead
// (percent of the limit) and the line's slope (percent of the limit per
// second): the line is at projected H seconds from now, so it reaches L*100 at
//
//	H + (L*100 - projected) / slope
//
// (negative: it is past the limit already). +Inf when the line does not
// climb; NaN when the projection is undefined or the model is not the rule.
func (m *Model) SecondsToLimit(projectedMemoryPercent, percentPerSecond float64) float64 {
	if m.linear == nil || math.IsNaN(projectedMemoryPercent) || math.IsNaN(percentPerSecond) {
		return math.NaN()
	}
	if percentPerSecond <= 0 {
		return math.Inf(1)
	}
	return m.linear.horizon.Seconds() + (m.linear.limitFraction()*100-projectedMemoryPercent)/percentPerSecond
}

// Why is the one-line explanation of a score, for /status and logs: the top
// three features by contribution for a tree model ("memory_growth_rate +2.31,
// memory_percent +0.84 (Saabas, log-odds)"), the line's time to the limit for
// the predict_linear detector. projectedMemoryPercent and percentPerSecond
// are the engine's projection (infer.Projection; ignored by trees). "" when
// there is nothing to say (no projection yet, a model without leaf counts).
func (m *Model) Why(x *[contract.NumFeatures]float64, projectedMemoryPercent, percentPerSecond float64) string {
	if m.linear != nil {
		s := m.SecondsToLimit(projectedMemoryPercent, percentPerSecond)
		switch {
		case math.IsNaN(s):
			return ""
		case math.IsInf(s, 1):
			return fmt.Sprintf("memory's line is flat or falling, %.1f %% of the limit in %s (%s)", projectedMemoryPercent, FormatDuration(m.linear.horizon), m.linear.Expr())
		case s <= 0:
			return fmt.Sprintf("memory's line met the limit %.1f s ago, climbing %.3g %% of the limit per second (%s)", -s, percentPerSecond, m.linear.Expr())
		}
		return fmt.Sprintf("memory's line meets the limit in %.1f s, climbing %.3g %% of the limit per second (%s)", s, percentPerSecond, m.linear.Expr())
	}
	e, err := m.Explain(x)
	if err != nil {
		return ""
	}
	return FormatTop(e.Top(3)) + " (Saabas, log-odds)"
}
