package model

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/amf-edge/amf/contract"
)

// Limits on what a model may contain. The default model is ~160 KB with 77
// trees of at most 31 leaves.
const (
	MaxModelBytes    = 8 << 20
	MaxManifestBytes = 1 << 20
	maxTrees         = 100000
	maxLeaves        = 1 << 16
	maxAbsLeafValue  = 1e6
)

// Bits of LightGBM's decision_type, as leaves reads them.
const (
	dtCategorical = 1 << 0
	dtDefaultLeft = 1 << 1
	dtMissingMask = 3 << 2
	missingNone   = 0
	missingZero   = 1
	missingNaN    = 2
	zeroThreshold = 1e-35 // LightGBM's kZeroThreshold, as in leaves
)

// lgbTree is one validated tree in LightGBM's layout: internal node i has
// children left[i], right[i]; a child c < 0 is leaf ^c.
type lgbTree struct {
	feature   []int32
	threshold []float64
	dtype     []uint8
	left      []int32
	right     []int32
	leaf      []float64
	// leafCount is how many training samples reached each leaf (leaf_count;
	// nil when the text has none). Explain weighs the leaves with it.
	leafCount []float64
}

type lgbModel struct {
	version      string
	featureNames []string // from the header, when present
	trees        []lgbTree
}

// parseLGBText validates LightGBM text in the subset leaves reads correctly
// and this package accepts. It reads numbers with the same strconv calls
// and separators as leaves, so both see the same values.
func parseLGBText(b []byte) (*lgbModel, error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: model file is empty", ErrEmpty)
	}
	if len(b) > MaxModelBytes {
		return nil, fmt.Errorf("%w: model is %d bytes, limit %d", ErrTooLarge, len(b), MaxModelBytes)
	}
	for i, c := range b {
		if (c < 0x20 || c > 0x7e) && c != '\n' && c != '\r' && c != '\t' {
			return nil, fmt.Errorf("%w: byte %d is 0x%02x: not a text model", ErrFormat, i, c)
		}
	}
	p := &lineReader{lines: strings.Split(string(b), "\n")}
	if first := p.next(); first != "tree" {
		return nil, fmt.Errorf("%w: first line is %q, a LightGBM text model starts with \"tree\"", ErrFormat, clip(first))
	}
	head, err := p.block("header")
	if err != nil {
		return nil, err
	}
	m := &lgbModel{}
	if m.version, err = head.want("version", "v2", "v3"); err != nil {
		return nil, err
	}
	if _, err := head.want("num_class", "1"); err != nil {
		return nil, err
	}
	if _, err := head.want("num_tree_per_iteration", "1"); err != nil {
		return nil, err
	}
	if _, err := head.want("max_feature_idx", strconv.Itoa(contract.NumFeatures-1)); err != nil {
		return nil, err
	}
	if _, err := head.want("objective", ObjectiveBinarySigmoid); err != nil {
		return nil, err
	}
	if names, ok := head.kv["feature_names"]; ok {
		m.featureNames = strings.Split(names, " ")
		if err := checkNames(m.featureNames); err != nil {
			return nil, fmt.Errorf("%w: model header feature_names: %v", ErrFeatures, err)
		}
	}
	sizes, ok := head.kv["tree_sizes"]
	if !ok {
		return nil, fmt.Errorf("%w: header has no tree_sizes", ErrFormat)
	}
	nTrees := len(strings.Split(sizes, " "))
	for _, s := range strings.Split(sizes, " ") {
		if v, err := strconv.Atoi(s); err != nil || v <= 0 {
			return nil, fmt.Errorf("%w: tree_sizes entry %q is not a positive integer", ErrFormat, clip(s))
		}
	}
	if nTrees > maxTrees {
		return nil, fmt.Errorf("%w: %d trees, limit %d", ErrFormat, nTrees, maxTrees)
	}
	m.trees = make([]lgbTree, 0, nTrees)
	for i := 0; i < nTrees; i++ {
		// LightGBM separates blocks by one (after the header) or two blank lines;
		// leaves mis-reads three or more.
		blanks := p.skipBlank()
		if blanks < 1 || blanks > 2 {
			return nil, fmt.Errorf("%w: %d blank lines before tree %d (want 1 or 2)", ErrFormat, blanks, i)
		}
		if p.eof() {
			return nil, fmt.Errorf("%w: file ends after %d of %d trees (truncated?)", ErrFormat, i, nTrees)
		}
		if line := p.next(); line != "Tree="+strconv.Itoa(i) {
			return nil, fmt.Errorf("%w: expected \"Tree=%d\", found %q", ErrFormat, i, clip(line))
		}
		blk, err := p.block(fmt.Sprintf("tree %d", i))
		if err != nil {
			return nil, err
		}
		t, err := parseTree(blk)
		if err != nil {
			if p.eof() {
				return nil, fmt.Errorf("%w: tree %d: %v (the file ends inside this tree: truncated?)", ErrFormat, i, err)
			}
			return nil, fmt.Errorf("%w: tree %d: %v", ErrFormat, i, err)
		}
		m.trees = append(m.trees, t)
	}
	p.skipBlank()
	if !p.eof() {
		if line := p.next(); line != "end of trees" {
			return nil, fmt.Errorf("%w: after %d trees (tree_sizes) found %q, want \"end of trees\"", ErrFormat, nTrees, clip(line))
		}
	}
	return m, nil
}

type lineReader struct {
	lines []string
	pos   int
}

func (r *lineReader) eof() bool { return r.pos >= len(r.lines) }

func (r *lineReader) next() string {
	if r.eof() {
		return ""
	}
	s := strings.TrimSpace(r.lines[r.pos])
	r.pos++
	return s
}

func (r *lineReader) skipBlank() int {
	n := 0
	for !r.eof() && strings.TrimSpace(r.lines[r.pos]) == "" {
		r.pos++
		n++
	}
	return n
}

type kvBlock struct {
	name string
	kv   map[string]string
}

// block reads key=value lines up to a blank line or the end.
func (r *lineReader) block(name string) (*kvBlock, error) {
	b := &kvBlock{name: name, kv: map[string]string{}}
	for !r.eof() {
		line := r.next()
		if line == "" {
			r.pos--
			break
		}
		k, v, ok := strings.Cut(line, "=")
		if k == "average_output" {
			return nil, fmt.Errorf("%w: %s: average_output (random forest mode) is not supported", ErrFormat, name)
		}
		if !ok || strings.Contains(v, "=") || k == "" {
			return nil, fmt.Errorf("%w: %s: line %d %q is not key=value", ErrFormat, name, r.pos, clip(line))
		}
		if _, dup := b.kv[k]; dup {
			return nil, fmt.Errorf("%w: %s: key %q appears twice", ErrFormat, name, k)
		}
		b.kv[k] = v
	}
	return b, nil
}

func (b *kvBlock) want(key string, allowed ...string) (string, error) {
	v, ok := b.kv[key]
	if !ok {
		return "", fmt.Errorf("%w: %s has no %s (want %s=%s)", ErrFormat, b.name, key, key, strings.Join(allowed, " or "))
	}
	for _, a := range allowed {
		if v == a {
			return v, nil
		}
	}
	return "", fmt.Errorf("%w: %s=%q is not supported (want %s)", ErrFormat, key, clip(v), strings.Join(allowed, " or "))
}

func fields(b *kvBlock, key string, n int) ([]string, error) {
	v, ok := b.kv[key]
	if !ok {
		return nil, fmt.Errorf("no %s", key)
	}
	f := strings.Split(v, " ") // leaves splits on single spaces
	if len(f) != n {
		return nil, fmt.Errorf("%s has %d values, want %d", key, len(f), n)
	}
	return f, nil
}

func parseTree(b *kvBlock) (lgbTree, error) {
	var t lgbTree
	nl, ok := b.kv["num_leaves"]
	if !ok {
		return t, fmt.Errorf("no num_leaves")
	}
	n, err := strconv.Atoi(nl)
	if err != nil || n < 1 || n > maxLeaves {
		return t, fmt.Errorf("num_leaves %q is not in [1, %d]", clip(nl), maxLeaves)
	}
	if nc, ok := b.kv["num_cat"]; !ok || nc != "0" {
		return t, fmt.Errorf("num_cat must be 0 (categorical splits are not supported)")
	}
	if lin, ok := b.kv["is_linear"]; ok && lin != "0" {
		return t, fmt.Errorf("linear trees are not supported (is_linear=%q)", clip(lin))
	}
	lv, err := fields(b, "leaf_value", n)
	if err != nil {
		return t, err
	}
	t.leaf = make([]float64, n)
	for i, s := range lv {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(v) || math.Abs(v) > maxAbsLeafValue {
			return t, fmt.Errorf("leaf_value[%d] %q is not a finite number within ±%g", i, clip(s), maxAbsLeafValue)
		}
		t.leaf[i] = v
	}
	if _, ok := b.kv["leaf_count"]; ok {
		lc, err := fields(b, "leaf_count", n)
		if err != nil {
			return t, err
		}
		t.leafCount = make([]float64, n)
		for i, s := range lc {
			c, err := strconv.ParseUint(s, 10, 53)
			if err != nil {
				return t, fmt.Errorf("leaf_count[%d] %q is not a sample count", i, clip(s))
			}
			t.leafCount[i] = float64(c)
		}
	}
	if n == 1 {
		return t, nil
	}
	m := n - 1
	sf, err := fields(b, "split_feature", m)
	if err != nil {
		return t, err
	}
	th, err := fields(b, "threshold", m)
	if err != nil {
		return t, err
	}
	dt, err := fields(b, "decision_type", m)
	if err != nil {
		return t, err
	}
	lc, err := fields(b, "left_child", m)
	if err != nil {
		return t, err
	}
	rc, err := fields(b, "right_child", m)
	if err != nil {
		return t, err
	}
	t.feature = make([]int32, m)
	t.threshold = make([]float64, m)
	t.dtype = make([]uint8, m)
	t.left = make([]int32, m)
	t.right = make([]int32, m)
	for i := 0; i < m; i++ {
		f, err := strconv.ParseUint(sf[i], 10, 32)
		if err != nil || f >= contract.NumFeatures {
			return t, fmt.Errorf("split_feature[%d] %q is not a feature index in [0, %d)", i, clip(sf[i]), contract.NumFeatures)
		}
		t.feature[i] = int32(f)
		v, err := strconv.ParseFloat(th[i], 64)
		if err != nil || math.IsNaN(v) {
			return t, fmt.Errorf("threshold[%d] %q is not a number", i, clip(th[i]))
		}
		t.threshold[i] = v
		d, err := strconv.ParseUint(dt[i], 10, 32)
		if err != nil || d > 15 {
			return t, fmt.Errorf("decision_type[%d] %q is not in [0, 15]", i, clip(dt[i]))
		}
		if d&dtCategorical != 0 {
			return t, fmt.Errorf("decision_type[%d]=%d is a categorical split (not supported)", i, d)
		}
		if (d&dtMissingMask)>>2 == 3 {
			return t, fmt.Errorf("decision_type[%d]=%d has an unknown missing type", i, d)
		}
		t.dtype[i] = uint8(d)
		for _, c := range []struct {
			name string
			s    string
			dst  *int32
		}{{"left_child", lc[i], &t.left[i]}, {"right_child", rc[i], &t.right[i]}} {
			v, err := strconv.ParseInt(c.s, 10, 32)
			if err != nil {
				return t, fmt.Errorf("%s[%d] %q is not an integer", c.name, i, clip(c.s))
			}
			if (v >= 0 && (v == 0 || v >= int64(m))) || (v < 0 && ^v >= int64(n)) {
				return t, fmt.Errorf("%s[%d]=%d points outside the tree (%d internal nodes, %d leaves)", c.name, i, v, m, n)
			}
			*c.dst = int32(v)
		}
	}
	return t, checkShape(&t, n)
}

// checkShape requires the child links to form one tree rooted at node 0 that
// reaches every internal node and every leaf exactly once.
func checkShape(t *lgbTree, n int) error {
	m := n - 1
	seenNode := make([]bool, m)
	seenLeaf := make([]bool, n)
	stack := []int32{0}
	seenNode[0] = true
	visited := 0
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		visited++
		for _, c := range [2]int32{t.left[i], t.right[i]} {
			if c < 0 {
				if seenLeaf[^c] {
					return fmt.Errorf("leaf %d is reached twice", ^c)
				}
				seenLeaf[^c] = true
				continue
			}
			if seenNode[c] {
				return fmt.Errorf("node %d is reached twice (cycle or shared subtree)", c)
			}
			seenNode[c] = true
			stack = append(stack, c)
		}
	}
	if visited != m {
		return fmt.Errorf("only %d of %d internal nodes are reachable from the root", visited, m)
	}
	for k, ok := range seenLeaf {
		if !ok {
			return fmt.Errorf("leaf %d is not reachable", k)
		}
	}
	return nil
}

// raw computes the tree's output with leaves' decision rules
// (lgtree.go numericalDecision). Used only to cross-check leaves at load.
func (t *lgbTree) raw(x *[contract.NumFeatures]float64) float64 {
	if len(t.left) == 0 {
		return t.leaf[0]
	}
	i := int32(0)
	for {
		c := t.child(i, x)
		if c < 0 {
			return t.leaf[^c]
		}
		i = c
	}
}

// child is the child of internal node i that x goes to, by leaves' decision
// rules (lgtree.go numericalDecision): a leaf k as ^k.
func (t *lgbTree) child(i int32, x *[contract.NumFeatures]float64) int32 {
	fval := x[t.feature[i]]
	d := t.dtype[i]
	mt := (d & dtMissingMask) >> 2
	if math.IsNaN(fval) && mt != missingNaN {
		fval = 0
	}
	var left bool
	if (mt == missingZero && fval > -zeroThreshold && fval <= zeroThreshold) || (mt == missingNaN && math.IsNaN(fval)) {
		left = d&dtDefaultLeft != 0
	} else {
		left = fval <= t.threshold[i]
	}
	if left {
		return t.left[i]
	}
	return t.right[i]
}

func (m *lgbModel) raw(x *[contract.NumFeatures]float64) float64 {
	s := 0.0
	for i := range m.trees {
		s += m.trees[i].raw(x) * 1.0
	}
	return s
}

// probes returns feature vectors that exercise missing values, zeros and
// the split thresholds of the model, for the leaves cross-check.
func (m *lgbModel) probes() [][contract.NumFeatures]float64 {
	nan := math.NaN()
	out := [][contract.NumFeatures]float64{
		{}, {nan, nan, nan, nan, nan, nan}, {1, 1, 1, 1, 1, 1}, {-1, -1, -1, -1, -1, -1},
		{1e9, 1e9, 1e9, 1e9, 1e9, 1e9}, {100, 100, nan, 0, nan, 1e3},
	}
	// Vectors on thresholds: the k-th split of each tree, on its feature.
	for k := 0; k < 4; k++ {
		var at, above [contract.NumFeatures]float64
		for i := range m.trees {
			t := &m.trees[i]
			if k < len(t.feature) && !math.IsInf(t.threshold[k], 0) {
				at[t.feature[k]] = t.threshold[k]
				above[t.feature[k]] = math.Nextafter(t.threshold[k], math.Inf(1))
			}
		}
		out = append(out, at, above)
	}
	return out
}

func clip(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}
