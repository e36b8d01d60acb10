"""Tests of the Saabas attribution reference (amfexplain.py)."""

import os
import sys
import unittest
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import amfexplain  # noqa: E402
import amftrain  # noqa: E402


def fitted(seed, **kw):
    from sklearn.ensemble import HistGradientBoostingClassifier
    X, y = amftrain.synthetic(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return HistGradientBoostingClassifier(random_state=seed, **kw).fit(X, y), X


class SaabasTest(unittest.TestCase):
    def test_bias_plus_contributions_is_the_raw_score(self):
        clf, X = fitted(1, max_iter=20)
        bias, contrib = amfexplain.explain(clf, X[:200])
        raw = clf._raw_predict(X[:200])[:, 0]
        np.testing.assert_allclose(bias + contrib.sum(axis=1), raw, rtol=0, atol=1e-9)
        self.assertGreater(np.count_nonzero(contrib), 0)

    def test_a_feature_no_tree_splits_on_gets_nothing(self):
        clf, X = fitted(2, max_iter=20)
        used = {int(nd["feature_idx"]) for preds in clf._predictors for p in preds
                for nd in p.nodes if not nd["is_leaf"]}
        _, contrib = amfexplain.explain(clf, X[:100])
        for f in range(X.shape[1]):
            if f not in used:
                self.assertTrue(np.all(contrib[:, f] == 0), "feature %d" % f)
        self.assertTrue(used, "the trees split on nothing")

    def test_node_means_weigh_leaves_by_their_samples(self):
        nodes = np.zeros(3, dtype=[("is_leaf", "u1"), ("left", "u4"), ("right", "u4"),
                                   ("value", "f8"), ("count", "u4")])
        nodes[0] = (0, 1, 2, 0.0, 4)
        nodes[1] = (1, 0, 0, 1.0, 3)
        nodes[2] = (1, 0, 0, 5.0, 1)
        self.assertEqual(list(amfexplain.node_means(nodes)), [2.0, 1.0, 5.0])

    def test_a_path_the_model_does_not_take_is_refused(self):
        clf, X = fitted(3, max_iter=5)
        right = amfexplain._goes_left
        amfexplain._goes_left = lambda nd, v: True  # always left: not sklearn's rule
        try:
            with self.assertRaises(amfexplain.ExplainError):
                amfexplain.explain(clf, X[:200])
        finally:
            amfexplain._goes_left = right


if __name__ == "__main__":
    unittest.main()
