"""Tests of infer/train. Run: /usr/bin/python3 -m unittest discover -s infer/train -v

Dataset-dependent tests skip (with the reason) when the ToD-K8s-OOD data folder
is absent; pass another folder with AMF_DATA_DIR.
"""

import csv
import json
import math
import os
import sys
import tempfile
import unittest
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from sklearn.ensemble import HistGradientBoostingClassifier  # noqa: E402

import amfdata  # noqa: E402
import amfexport  # noqa: E402
import amftrain  # noqa: E402

DATA_DIR = os.environ.get("AMF_DATA_DIR") or None
HAVE_DATA = amfdata.data_available(DATA_DIR)
MODEL_DIR = os.path.join(amfdata.REPO_ROOT, "infer", "model")


def fit_synthetic(seed, **kw):
    X, y = amftrain.synthetic(seed, n=1500)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = HistGradientBoostingClassifier(random_state=seed, **kw).fit(X[:1000], y[:1000])
    return clf, X


class LoaderTest(unittest.TestCase):
    def test_crlf_and_empty_fields(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "x.csv")
            with open(p, "w", newline="") as f:
                f.write("timestamp,node,pod," + ",".join(amfdata.FEATURES) + ",true_label\r\n")
                f.write("1,edge,broker-7f57c8d79b-f2m5m,1,2,3,4,9.26E-08,,0\r\n")
                f.write("2,obu,ms-speed-854d68bfd8-zdd9p,85,2,3,4,5,6,1\r\n")
            fr = amfdata.load_csv(p)
            self.assertEqual(len(fr), 2)
            self.assertTrue(math.isnan(fr.X[0, 5]))
            self.assertEqual(fr.X[0, 4], 9.26e-08)
            self.assertEqual(list(fr.y), [0, 1])
            self.assertEqual(list(fr.complete()), [False, True])
            self.assertEqual(list(fr.group), ["edge/broker", "obu/ms-speed"])

    def test_missing_column_and_bad_number(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "x.csv")
            with open(p, "w") as f:
                f.write("cpu_percent,true_label\n1,0\n")
            with self.assertRaisesRegex(amfdata.DataError, "memory_percent"):
                amfdata.load_csv(p)
            with open(p, "w") as f:
                f.write(",".join(amfdata.FEATURES) + ",true_label\n1,2,x,4,5,6,0\n")
            with self.assertRaisesRegex(amfdata.DataError, r"x.csv:2: column network_io"):
                amfdata.load_csv(p)

    def test_absent_dataset_says_where_it_lives(self):
        with self.assertRaises(amfdata.DataError) as cm:
            amfdata.resolve_data_dir("/nonexistent/amf-data")
        self.assertIn("github.com/hassaanas/k8s-dataset-tod", str(cm.exception))
        self.assertIn("--data", str(cm.exception))


class FeatureSchemaTest(unittest.TestCase):
    def test_schema_is_the_go_contracts_and_the_embedded_models(self):
        # contract/feature_names.txt is the Go schema (its Go test keeps it
        # so); the models the sidecar embeds must name it too.
        self.assertEqual(len(amfdata.FEATURES), 6)
        for name in ("p1_manifest.json", "leadtime_manifest.json"):
            with open(os.path.join(amfdata.REPO_ROOT, "infer", "model", name), encoding="utf-8") as f:
                self.assertEqual(json.load(f)["feature_names"], list(amfdata.FEATURES), name)


class SplitModeTest(unittest.TestCase):
    def test_train_test_prints_one_json_object(self):
        import contextlib
        import io
        X, y = amftrain.synthetic(7, n=800)
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for name, sl in (("a.csv", slice(0, 500)), ("b.csv", slice(500, 800))):
                p = os.path.join(d, name)
                with open(p, "w", newline="") as f:
                    w = csv.writer(f, lineterminator="\r\n")
                    w.writerow(["node", "pod"] + list(amfdata.FEATURES) + ["true_label"])
                    for row, lab in zip(X[sl], y[sl]):
                        w.writerow(["edge", "broker-a-b"] + ["" if math.isnan(v) else repr(v) for v in row] + [lab])
                paths.append(p)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = amftrain.main(["--train", paths[0], "--test", paths[1]])
            self.assertEqual(rc, 0)
            lines = out.getvalue().strip().splitlines()
            self.assertEqual(len(lines), 1)
            r = json.loads(lines[0])
            self.assertEqual(r["model"], "hgbc")
            self.assertGreater(r["dropped_train_rows"], 0)
            for k in ("precision", "recall"):
                self.assertTrue(0.0 <= r[k] <= 1.0)


@unittest.skipUnless(HAVE_DATA, "ToD-K8s-OOD dataset not found (set AMF_DATA_DIR): "
                     + amfdata.where_to_get_it())
class DatasetTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.nominal, cls.stressed, cls.dir = amfdata.load_dataset(DATA_DIR)

    def test_shape(self):
        self.assertEqual(len(self.nominal), 12969)
        self.assertEqual(len(self.stressed), 12969)
        self.assertEqual(int((~self.stressed.complete()).sum()), 199)

    def test_label_rule(self):
        # true_label == (cpu_percent >= 80) OR (memory_percent >= 80), no exception.
        r = amftrain.label_rule(self.nominal, self.stressed)
        self.assertEqual(r["total_rows_checked"], 25756)
        self.assertEqual(r["total_mismatches"], 0)


class ExporterTest(unittest.TestCase):
    def check_reference_parity(self, clf, X):
        text = amfexport.hgbc_to_lightgbm_text(clf, amfdata.FEATURES)
        header, trees = amfexport.parse_lightgbm_text(text)
        self.assertEqual(len(trees), clf.n_iter_)
        raw = clf._raw_predict(X)[:, 0]
        proba = clf.predict_proba(X)[:, 1]
        for i, x in enumerate(X):
            r = amfexport.predict_raw_reference(trees, list(map(float, x)))
            self.assertEqual(r, float(raw[i]), "row %d raw not bit-identical" % i)
            self.assertLessEqual(abs(amfexport.sigmoid(r) - proba[i]), 1e-12)
        return text, header, trees

    def test_reference_parity_several_shapes(self):
        for seed in (1, 2):
            for kw in (dict(max_iter=15), dict(max_iter=40, max_leaf_nodes=64,
                                                min_samples_leaf=3, early_stopping=False),
                       dict(max_iter=5, min_samples_leaf=100000, early_stopping=False)):
                with self.subTest(seed=seed, kw=kw):
                    clf, X = fit_synthetic(seed, **kw)
                    rows = list(X[1000:1200]) + [np.full(6, np.nan), np.zeros(6)]
                    self.check_reference_parity(clf, np.array(rows))

    def test_text_format(self):
        clf, X = fit_synthetic(3, max_iter=20)
        text = amfexport.hgbc_to_lightgbm_text(clf, amfdata.FEATURES)
        lines = text.split("\n")
        self.assertEqual(lines[0], "tree")
        head = dict(l.split("=", 1) for l in lines[1:lines.index("")])
        self.assertEqual(head["version"], "v3")
        self.assertEqual(head["objective"], "binary sigmoid:1")
        self.assertEqual(head["num_class"], "1")
        self.assertEqual(head["max_feature_idx"], "5")
        self.assertEqual(head["feature_names"].split(), list(amfdata.FEATURES))
        # tree_sizes are the byte sizes of the Tree= blocks, as LightGBM writes them
        sizes = [int(s) for s in head["tree_sizes"].split()]
        start = text.index("Tree=0")
        for i, size in enumerate(sizes):
            self.assertTrue(text.startswith("Tree=%d\n" % i, start))
            start += size
        self.assertTrue(text.startswith("end of trees", start))
        for l in lines:
            self.assertLessEqual(l.count("="), 1, l)
            if l.startswith("decision_type=") and l != "decision_type=":
                self.assertTrue(set(int(v) for v in l.split("=")[1].split()) <= {8, 10})

    def test_single_leaf_tree(self):
        clf, X = fit_synthetic(4, max_iter=3, min_samples_leaf=100000, early_stopping=False)
        text, _, trees = self.check_reference_parity(clf, X[1000:1050])
        self.assertTrue(all(t["num_leaves"] == 1 for t in trees))
        self.assertIn("num_leaves=1\nnum_cat=0\nsplit_feature=\n", text)

    def test_refuses_non_binary(self):
        X = np.random.default_rng(0).normal(size=(300, 6))
        y = np.arange(300) % 3
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            clf = HistGradientBoostingClassifier(max_iter=3).fit(X, y)
        with self.assertRaises(amfexport.ExportError):
            amfexport.hgbc_to_lightgbm_text(clf, amfdata.FEATURES)

    def test_manifest(self):
        clf, _ = fit_synthetic(5, max_iter=5)
        with tempfile.TemporaryDirectory() as d:
            mp = os.path.join(d, "m.txt")
            jp = amfexport.manifest_path_for(mp)
            self.assertEqual(jp, os.path.join(d, "m.manifest.json"))
            amfexport.write_model(mp, jp, clf, amfdata.FEATURES, protocol="synthetic", seed=5,
                                  training_rows=1000, sklearn_version="x")
            with open(jp) as f:
                m = json.load(f)
            self.assertEqual(m["model_sha256"], amfdata.sha256_file(mp))
            self.assertEqual(m["feature_names"], list(amfdata.FEATURES))
            self.assertEqual(m["threshold"], 0.5)
            self.assertEqual(m["schema_version"], 2)
            # The whole P1 feature spec travels with the model.
            self.assertEqual(m["feature_windows"], {
                "rate_window": "5m", "deriv_window": "10m", "subquery_step": "5s",
                "lookback": "5m", "sample_interval": "5s"})
            self.assertEqual(m["normalisation"], {"cpu_reference_fraction": 0.5,
                                                  "memory_reference_fraction": 0.5})

    def test_manifest_records_the_windows_it_is_given(self):
        clf, _ = fit_synthetic(5, max_iter=5)
        w = {"rate_window": "1m", "deriv_window": "2m", "subquery_step": "1s",
             "lookback": "1m", "sample_interval": "1s"}
        with tempfile.TemporaryDirectory() as d:
            mp = os.path.join(d, "m.txt")
            jp = amfexport.manifest_path_for(mp)
            amfexport.write_model(mp, jp, clf, amfdata.FEATURES, protocol="synthetic", seed=5,
                                  training_rows=1000, sklearn_version="x", feature_windows=w,
                                  normalisation={"cpu_reference_fraction": 1.0,
                                                 "memory_reference_fraction": 1.0})
            with open(jp) as f:
                m = json.load(f)
            self.assertEqual(m["feature_windows"], w)
            self.assertEqual(m["normalisation"]["cpu_reference_fraction"], 1.0)

    def test_manifest_refuses_a_spec_the_sidecar_cannot_compute(self):
        p1 = dict(amfexport.FEATURE_WINDOWS)
        cases = [
            ("lookback missing", {k: v for k, v in p1.items() if k != "lookback"}, "exactly"),
            ("unknown window", dict(p1, smoothing="1m"), "exactly"),
            ("not a duration", dict(p1, rate_window="5 minutes"), "Go duration"),
            ("zero", dict(p1, subquery_step="0s"), "positive"),
            ("sub-millisecond", dict(p1, sample_interval="1500us"), "milliseconds"),
            ("rate not a multiple of the step", dict(p1, rate_window="302s"), "multiple"),
            ("lookback not a multiple of the step", dict(p1, lookback="7s"), "multiple"),
            ("deriv shorter than 2 steps", dict(p1, deriv_window="5s"), "2 subquery steps"),
            ("rate shorter than 2 samples", dict(p1, rate_window="5s"), "2 sample intervals"),
            ("lookback shorter than a sample", dict(p1, sample_interval="10m", rate_window="20m",
                                                     deriv_window="20m"), "lookback"),
            ("longer than a day", dict(p1, rate_window="25h"), "24h"),
        ]
        for name, w, msg in cases:
            with self.subTest(name):
                with self.assertRaisesRegex(amfexport.ExportError, msg):
                    amfexport.make_manifest(b"x", amfdata.FEATURES, protocol="t", seed=1,
                                            training_rows=1, sklearn_version="x",
                                            feature_windows=w)
        with self.assertRaisesRegex(amfexport.ExportError, "normalisation"):
            amfexport.make_manifest(b"x", amfdata.FEATURES, protocol="t", seed=1,
                                    training_rows=1, sklearn_version="x",
                                    normalisation={"zscore": True})

    def test_parse_duration_is_gos(self):
        for s, ns in (("5m", 300 * 10**9), ("1h30m", 5400 * 10**9), ("500ms", 5 * 10**8),
                      ("1.5s", 15 * 10**8), ("5m0s", 300 * 10**9), ("250us", 250000)):
            with self.subTest(s):
                self.assertEqual(amfexport.parse_duration_ns(s), ns)
        for s in ("", "5", "m", "1d", "-5m", "5 m"):
            with self.subTest(s):
                with self.assertRaises(amfexport.ExportError):
                    amfexport.parse_duration_ns(s)


@unittest.skipUnless(os.path.isfile(os.path.join(MODEL_DIR, "p1_model.txt")),
                     "no embedded default model yet (make model)")
class DefaultModelTest(unittest.TestCase):
    def test_golden_matches_exported_text(self):
        with open(os.path.join(MODEL_DIR, "p1_model.txt")) as f:
            text = f.read()
        with open(os.path.join(MODEL_DIR, "p1_manifest.json")) as f:
            man = json.load(f)
        self.assertEqual(man["model_sha256"],
                         amfdata.sha256_file(os.path.join(MODEL_DIR, "p1_model.txt")))
        self.assertEqual(man["protocol"], "P1")
        # `make model` rewrites this manifest with the exporter's P1 spec: the two agree.
        self.assertEqual(man["schema_version"], amfexport.MANIFEST_SCHEMA_VERSION)
        self.assertEqual(man["feature_windows"], amfexport.FEATURE_WINDOWS)
        self.assertEqual(man["normalisation"], amfexport.NORMALISATION_TOD_K8S_OOD)
        self.assertEqual(man["dataset"]["licence"], "CC BY 4.0")
        _, trees = amfexport.parse_lightgbm_text(text)
        with open(os.path.join(MODEL_DIR, "testdata", "parity_p1.csv")) as f:
            rows = list(csv.DictReader(f))
        self.assertGreater(len(rows), 300)
        self.assertTrue(any(r["cpu_percent"] == "" or r["memory_growth_rate"] == "" for r in rows))
        for r in rows:
            x = [float(r[k]) if r[k] != "" else float("nan") for k in amfdata.FEATURES]
            raw = amfexport.predict_raw_reference(trees, x)
            self.assertEqual(raw, float(r["raw"]))
            self.assertLessEqual(abs(amfexport.sigmoid(raw) - float(r["probability"])), 1e-12)


if __name__ == "__main__":
    unittest.main()
