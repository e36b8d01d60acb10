"""Saabas path attribution of a HistGradientBoostingClassifier, from
scikit-learn's own tree arrays: the independent reference that
infer/model/explain.go is checked against (the explain golden files).

Every node's expected value is the mean of the leaf values below it weighted by
the training samples that reached each leaf (``count``). On x's decision path
each split credits its feature with E[child] - E[node]; summed over the trees,
the baseline plus the roots' expected values (the bias) plus the credits is the
raw score. This module reads nothing of the exported LightGBM text: it walks
``clf._predictors`` with scikit-learn's decision rule (NaN goes where
``missing_go_to_left`` says, else ``x <= num_threshold`` goes left), and checks
its sums against ``clf._raw_predict``.
"""

import math

import numpy as np

from amfdata import FEATURES


class ExplainError(Exception):
    """The attribution does not add up to the model's raw score."""


def node_means(nodes):
    """Expected value of every node of one predictor's node array."""
    mean = np.empty(len(nodes), dtype=np.float64)

    def visit(i):
        nd = nodes[i]
        if nd["is_leaf"]:
            c = float(nd["count"])
            mean[i] = float(nd["value"])
            return c * mean[i], c
        ls, lc = visit(int(nd["left"]))
        rs, rc = visit(int(nd["right"]))
        mean[i] = (ls + rs) / (lc + rc)
        return ls + rs, lc + rc

    visit(0)
    return mean


def _goes_left(nd, v):
    if math.isnan(v):
        return bool(nd["missing_go_to_left"])
    return v <= float(nd["num_threshold"])


def explain(clf, X, tol=1e-9):
    """(bias, contributions) of each row of X: arrays (n,) and (n, 6) on the
    raw (log-odds) scale, with bias + contributions.sum(1) == the raw score
    within tol (checked; ExplainError otherwise)."""
    X = np.asarray(X, dtype=np.float64)
    baseline = float(np.asarray(clf._baseline_prediction, dtype=np.float64).reshape(-1)[0])
    trees = [(p.nodes, node_means(p.nodes)) for preds in clf._predictors for p in preds]
    bias = np.full(len(X), baseline + sum(m[0] for _, m in trees))
    contrib = np.zeros((len(X), len(FEATURES)))
    for k, x in enumerate(X):
        for nodes, mean in trees:
            i = 0
            while not nodes[i]["is_leaf"]:
                nd = nodes[i]
                c = int(nd["left"]) if _goes_left(nd, x[int(nd["feature_idx"])]) else int(nd["right"])
                contrib[k, int(nd["feature_idx"])] += mean[c] - mean[i]
                i = c
    raw = clf._raw_predict(X)[:, 0]
    err = np.abs(bias + contrib.sum(axis=1) - raw)
    if len(err) and not np.all(err <= tol * np.maximum(1.0, np.abs(raw))):
        raise ExplainError("Saabas attribution misses the raw score by up to %g" % float(np.max(err)))
    return bias, contrib


CONTRIBUTION_COLUMNS = ["contribution_" + f for f in FEATURES]


def write_golden(path, clf, X, sources):
    """CSV: source, the six features (empty = NaN), bias, one contribution per
    feature, and sklearn's raw score, all as Python repr (round-trip exact)."""
    bias, contrib = explain(clf, X)
    raw = clf._raw_predict(np.asarray(X, dtype=np.float64))[:, 0]

    def r(v):
        return "" if math.isnan(v) else repr(float(v))
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write(",".join(["source"] + list(FEATURES) + ["bias"] + CONTRIBUTION_COLUMNS + ["raw"]) + "\n")
        for src, x, b, c, rw in zip(sources, X, bias, contrib, raw):
            f.write(",".join([src] + [r(v) for v in x] + [repr(float(b))] +
                             [repr(float(v)) for v in c] + [repr(float(rw))]) + "\n")
    return len(X)
