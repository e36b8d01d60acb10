"""Export a fitted scikit-learn HistGradientBoostingClassifier (binary) to a
LightGBM v3 text model that github.com/dmitryikh/leaves loads, plus its
manifest.

Semantics carried over exactly (checked against sklearn 1.2.1's
``_predictor.pyx`` and leaves' ``lgtree.go``):

* sklearn: a NaN goes where ``missing_go_to_left`` says; otherwise
  ``x <= num_threshold`` goes left. A "split on NaN" has ``num_threshold=inf``.
* LightGBM/leaves: ``decision_type`` bit 0 = categorical (never set here),
  bit 1 = default_left, bits 2-3 = missing type (2 = NaN). With missing type
  NaN a NaN takes the default direction, everything else ``x <= threshold``
  (threshold kept as float64). So decision_type is 8, or 10 when NaN goes left.
* sklearn's raw score is ``((0 + baseline) + tree_0) + tree_1 + ...``; leaves
  computes ``(0 + tree_0') + tree_1 + ...``. Folding the baseline into tree 0's
  leaves (``tree_0' = baseline + tree_0``) makes the sums bit-identical, so
  ``sigmoid(sum) == predict_proba[:, 1]`` up to the last ulp of ``exp``.
* Numbers are written with ``repr`` (shortest round-trip form), which Go's
  ``strconv.ParseFloat`` reads back to the same float64.
"""

import fractions
import hashlib
import json
import math
import os
import re

import numpy as np

# Schema 2: the manifest states the whole feature spec (feature names, the five
# windows below, normalisation); the Go loader (infer/model) refuses a schema-2
# manifest without it and configures the sidecar's feature pipeline from it.
MANIFEST_SCHEMA_VERSION = 2
# The P1 pipeline: ToD-K8s-OOD was computed by Prometheus every 5 s with these
# windows (lookback = Prometheus' default lookback delta).
FEATURE_WINDOWS = {
    "rate_window": "5m",
    "deriv_window": "10m",
    "subquery_step": "5s",
    "lookback": "5m",
    "sample_interval": "5s",
}
# Limits and rules of infer/model (Windows.Check); kept equal by the Go tests,
# which load every manifest this module writes (make test-exporter).
MAX_WINDOW_NS = 24 * 3600 * 10**9
MAX_DERIV_STEPS = 10000
# The dataset's 100 % is about half the container limit (see DESIGN.md,
# "Scale of the dataset's percentages").
NORMALISATION_TOD_K8S_OOD = {
    "cpu_reference_fraction": 0.5,
    "memory_reference_fraction": 0.5,
}


class ExportError(Exception):
    pass


def _num(x):
    x = float(x)
    if math.isnan(x):
        raise ExportError("NaN value in model")
    return repr(x)


def _tree_arrays(nodes, add=None):
    """Turn one sklearn predictor's node array into LightGBM tree arrays.

    Internal nodes are numbered in pre-order (root = 0), leaves in the order
    they are met; a child that is a leaf k is written as ~k = -(k+1).
    ``add`` (the baseline) is added to every leaf value.
    """
    if nodes["is_categorical"].any():
        raise ExportError("categorical splits are not supported")
    internal, leaves = [], []
    ref = {}

    def visit(i):
        if nodes[i]["is_leaf"]:
            ref[i] = ~len(leaves)
            leaves.append(i)
            return
        ref[i] = len(internal)
        internal.append(i)
        visit(int(nodes[i]["left"]))
        visit(int(nodes[i]["right"]))

    visit(0)

    def leaf_value(i):
        v = float(nodes[i]["value"])
        if add is not None:
            v = float(add) + v  # same float64 addition sklearn performs
        return v

    out = {
        "num_leaves": len(leaves),
        "leaf_value": [leaf_value(i) for i in leaves],
        "leaf_count": [int(nodes[i]["count"]) for i in leaves],
    }
    if internal:
        out.update({
            "split_feature": [int(nodes[i]["feature_idx"]) for i in internal],
            "split_gain": [float(nodes[i]["gain"]) for i in internal],
            "threshold": [float(nodes[i]["num_threshold"]) for i in internal],
            "decision_type": [8 | (2 if nodes[i]["missing_go_to_left"] else 0)
                              for i in internal],
            "left_child": [ref[int(nodes[i]["left"])] for i in internal],
            "right_child": [ref[int(nodes[i]["right"])] for i in internal],
            "internal_value": [float(nodes[i]["value"]) for i in internal],
            "internal_count": [int(nodes[i]["count"]) for i in internal],
        })
    return out


def _tree_text(index, t):
    def ints(a):
        return " ".join(str(int(v)) for v in a)

    def floats(a):
        return " ".join(_num(v) for v in a)

    n = t["num_leaves"]
    lines = ["Tree=%d" % index, "num_leaves=%d" % n, "num_cat=0"]
    if n > 1:
        lines += [
            "split_feature=" + ints(t["split_feature"]),
            "split_gain=" + floats(t["split_gain"]),
            "threshold=" + floats(t["threshold"]),
            "decision_type=" + ints(t["decision_type"]),
            "left_child=" + ints(t["left_child"]),
            "right_child=" + ints(t["right_child"]),
        ]
    else:  # LightGBM writes the node arrays empty for a single-leaf tree
        lines += ["split_feature=", "split_gain=", "threshold=", "decision_type=",
                  "left_child=", "right_child="]
    lines += [
        "leaf_value=" + floats(t["leaf_value"]),
        "leaf_count=" + ints(t["leaf_count"]),
    ]
    if n > 1:
        lines += [
            "internal_value=" + floats(t["internal_value"]),
            "internal_count=" + ints(t["internal_count"]),
        ]
    else:
        lines += ["internal_value=", "internal_count="]
    lines += ["is_linear=0", "shrinkage=1"]
    # LightGBM: Tree::ToString() ends with "\n\n" and the model adds one more.
    return "\n".join(lines) + "\n\n\n"


def check_exportable(clf, n_features):
    if not hasattr(clf, "_predictors"):
        raise ExportError("the classifier is not fitted")
    if list(getattr(clf, "classes_", [])) != [0, 1]:
        raise ExportError("need a binary classifier with classes [0, 1], got %r"
                          % (list(getattr(clf, "classes_", [])),))
    if clf.n_trees_per_iteration_ != 1:
        raise ExportError("need one tree per iteration (binary), got %d"
                          % clf.n_trees_per_iteration_)
    if clf.n_features_in_ != n_features:
        raise ExportError("model has %d features, expected %d"
                          % (clf.n_features_in_, n_features))
    if getattr(clf, "is_categorical_", None) is not None and np.any(clf.is_categorical_):
        raise ExportError("categorical features are not supported")
    b = np.asarray(clf._baseline_prediction, dtype=np.float64).reshape(-1)
    if b.shape != (1,):
        raise ExportError("unexpected baseline shape %r" % (b.shape,))
    if not clf._predictors:
        raise ExportError("the model has no trees")
    return float(b[0])


def hgbc_to_lightgbm_text(clf, feature_names):
    """Return the LightGBM v3 text of a fitted binary HGBC."""
    feature_names = list(feature_names)
    for name in feature_names:
        if not name or any(c.isspace() or c == "=" for c in name):
            raise ExportError("feature name %r has a space or '='" % name)
    baseline = check_exportable(clf, len(feature_names))
    trees = []
    for it, preds in enumerate(clf._predictors):
        (pred,) = preds
        t = _tree_arrays(pred.nodes, add=baseline if it == 0 else None)
        trees.append(_tree_text(it, t))
    header = [
        "tree",
        "version=v3",
        "num_class=1",
        "num_tree_per_iteration=1",
        "label_index=0",
        "max_feature_idx=%d" % (len(feature_names) - 1),
        "objective=binary sigmoid:1",
        "feature_names=" + " ".join(feature_names),
        "feature_infos=" + " ".join("none" for _ in feature_names),
        "tree_sizes=" + " ".join(str(len(t.encode("ascii"))) for t in trees),
    ]
    params = {
        "boosting": "gbdt",
        "objective": "binary",
        "learning_rate": clf.learning_rate,
        "max_iter": clf.max_iter,
        "n_iter": clf.n_iter_,
        "max_leaf_nodes": clf.max_leaf_nodes,
        "min_samples_leaf": clf.min_samples_leaf,
        "l2_regularization": clf.l2_regularization,
        "max_bins": clf.max_bins,
        "random_state": clf.random_state,
    }
    tail = ["end of trees", "", "parameters:"]
    tail += ["[%s: %s]" % (k, v) for k, v in params.items()]
    tail += ["end of parameters", "", "pandas_categorical:null", ""]
    return "\n".join(header) + "\n\n" + "".join(trees) + "\n".join(tail)


def sha256_bytes(b):
    return hashlib.sha256(b).hexdigest()


_UNITS_NS = {"ns": 1, "us": 10**3, "\u00b5s": 10**3, "\u03bcs": 10**3, "ms": 10**6,
             "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9}
_DURATION_RE = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


def parse_duration_ns(s):
    """Go's time.ParseDuration for non-negative values, in integer ns."""
    if not isinstance(s, str) or not s:
        raise ExportError("duration %r is not a string such as \"5m\"" % (s,))
    pos, total = 0, fractions.Fraction(0)
    while pos < len(s):
        m = _DURATION_RE.match(s, pos)
        if not m or m.group(1) in ("", "."):
            raise ExportError("duration %r is not a Go duration such as \"5m\" or \"500ms\"" % s)
        total += fractions.Fraction(m.group(1)) * _UNITS_NS[m.group(2)]
        pos = m.end()
    return int(total)  # Go truncates fractions of a nanosecond


def check_feature_windows(w):
    """Refuse windows the Go loader would refuse, at export time."""
    names = list(FEATURE_WINDOWS)
    if not isinstance(w, dict) or sorted(w) != sorted(names):
        raise ExportError("feature_windows must have exactly %s, got %r" % (names, w))
    ns = {k: parse_duration_ns(w[k]) for k in names}
    for k in names:
        if ns[k] <= 0 or ns[k] % 10**6:
            raise ExportError("feature_windows.%s %r is not a positive whole number of milliseconds" % (k, w[k]))
        if ns[k] > MAX_WINDOW_NS:
            raise ExportError("feature_windows.%s %r is longer than 24h" % (k, w[k]))
    step = ns["subquery_step"]
    for k in ("rate_window", "deriv_window", "lookback"):
        if ns[k] % step:
            raise ExportError("feature_windows.%s %r is not a whole multiple of subquery_step %r"
                              % (k, w[k], w["subquery_step"]))
    if ns["deriv_window"] < 2 * step:
        raise ExportError("feature_windows.deriv_window %r holds fewer than 2 subquery steps"
                          % w["deriv_window"])
    if ns["deriv_window"] // step > MAX_DERIV_STEPS:
        raise ExportError("feature_windows.deriv_window %r holds more than %d subquery steps"
                          % (w["deriv_window"], MAX_DERIV_STEPS))
    if ns["lookback"] < ns["sample_interval"]:
        raise ExportError("feature_windows.lookback %r is shorter than the sample_interval %r"
                          % (w["lookback"], w["sample_interval"]))
    if ns["rate_window"] < 2 * ns["sample_interval"]:
        raise ExportError("feature_windows.rate_window %r is shorter than 2 sample intervals (%r)"
                          % (w["rate_window"], w["sample_interval"]))
    return w


def check_normalisation(n):
    keys = ("cpu_reference_fraction", "memory_reference_fraction")
    if not isinstance(n, dict) or sorted(n) != sorted(keys):
        raise ExportError("normalisation must have exactly %s, got %r" % (list(keys), n))
    for k in keys:
        v = n[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v <= 10):
            raise ExportError("normalisation.%s %r is not in (0, 10]" % (k, v))
    return n


def make_manifest(model_bytes, feature_names, *, protocol, seed, training_rows,
                  sklearn_version, dataset=None, normalisation=None,
                  feature_windows=None, threshold=0.5, extra=None):
    """The manifest of an exported model. feature_windows are the windows the
    training features were computed with (default: the P1 pipeline's); they
    travel with the model because the sidecar computes its features with them."""
    m = {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "model_format": "lightgbm-text-v3",
        "model_sha256": sha256_bytes(model_bytes),
        "objective": "binary sigmoid:1",
        "feature_names": list(feature_names),
        "threshold": threshold,
        "protocol": protocol,
        "seed": seed,
        "training_rows": int(training_rows),
        "trainer": "sklearn.ensemble.HistGradientBoostingClassifier",
        "sklearn_version": sklearn_version,
        "feature_windows": dict(feature_windows or FEATURE_WINDOWS),
        "normalisation": dict(normalisation or NORMALISATION_TOD_K8S_OOD),
        "dataset": dataset,
    }
    if extra:
        m.update(extra)
    check_feature_windows(m["feature_windows"])
    check_normalisation(m["normalisation"])
    return m


def write_model(path_txt, manifest_path, clf, feature_names, **manifest_kw):
    """Write the model text and its manifest; return the manifest dict."""
    text = hgbc_to_lightgbm_text(clf, feature_names)
    data = text.encode("ascii")
    manifest = make_manifest(data, feature_names, **manifest_kw)
    for p in (path_txt, manifest_path):
        d = os.path.dirname(os.path.abspath(p))
        os.makedirs(d, exist_ok=True)
    with open(path_txt, "wb") as f:
        f.write(data)
    with open(manifest_path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=False)
        f.write("\n")
    return manifest


def manifest_path_for(model_path):
    """The rule the Go loader uses: m.txt -> m.manifest.json."""
    base = model_path[:-4] if model_path.endswith(".txt") else model_path
    return base + ".manifest.json"


# ---------------------------------------------------------------------------
# A reference reader of the text format with leaves' semantics, used by the
# Python tests to check the exporter without Go.

def parse_lightgbm_text(text):
    blocks = [b for b in text.split("\n\n") if b.strip()]
    header = dict(line.split("=", 1) if "=" in line else (line, "")
                  for line in blocks[0].splitlines())
    n_trees = len(header["tree_sizes"].split())
    trees = []
    for b in blocks[1:1 + n_trees]:
        kv = dict(line.split("=", 1) for line in b.strip().splitlines())
        t = {"num_leaves": int(kv["num_leaves"]),
             "leaf_value": [float(v) for v in kv["leaf_value"].split()]}
        if t["num_leaves"] > 1:
            for k in ("split_feature", "decision_type", "left_child", "right_child"):
                t[k] = [int(v) for v in kv[k].split()]
            t["threshold"] = [float(v) for v in kv["threshold"].split()]
        trees.append(t)
    return header, trees


def predict_raw_reference(trees, x):
    """Raw score of one row, as leaves computes it."""
    total = 0.0
    for t in trees:
        if t["num_leaves"] == 1:
            total += t["leaf_value"][0] * 1.0
            continue
        i = 0
        while True:
            f = x[t["split_feature"][i]]
            dt = t["decision_type"][i]
            if math.isnan(f) and ((dt >> 2) & 3) == 2:
                left = bool(dt & 2)
            else:
                if math.isnan(f):
                    f = 0.0
                left = f <= t["threshold"][i]
            c = t["left_child"][i] if left else t["right_child"][i]
            if c < 0:
                total += t["leaf_value"][~c] * 1.0
                break
            i = c
    return total


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))
