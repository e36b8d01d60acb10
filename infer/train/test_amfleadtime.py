"""Tests of the lead-time model's pipeline (amfleadtime.py).

Pure logic runs everywhere; the end-to-end test needs bin/amf-sidecar (make
build) and the committed corpus, and skips with the reason otherwise.
"""

import gzip
import json
import math
import os
import sys
import tempfile
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import amfexport  # noqa: E402
import amfleadtime as lt  # noqa: E402
import amfpredictlinear as pl  # noqa: E402
import amftrain  # noqa: E402
import amfwindowage as wa  # noqa: E402


def read_text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def read_json(path):
    return json.loads(read_text(path))


def make_run(rid, family, ttf0=None, n=10, fault_from=0.0):
    r = lt.Run(rid, family)
    r.t = 1000.0 + np.arange(n, dtype=float)
    r.since_onset = np.arange(n, dtype=float)
    r.ttf = (np.full(n, math.nan) if ttf0 is None else ttf0 - np.arange(n, dtype=float))
    r.fault_from_s = fault_from
    return r


class PredictLinearTest(unittest.TestCase):
    def test_an_undefined_projection_does_not_fire_and_the_limit_scores_half(self):
        got = pl.scores([math.nan, -40.0, 50.0, 100.0, 130.0])
        self.assertEqual(list(got), [0.0, 0.0, 0.5 / 1.5, 0.5, 1.3 / 2.3])

    def test_rule_text_is_the_go_loaders(self):
        # linearRule.Expr: FormatDuration(W), FormatFloat(H seconds), FormatFloat(100*threshold).
        self.assertEqual(pl.expr("5m", 30.0),
                         "predict_linear(memory_bytes[5m], 30) / memory_limit_bytes * 100 >= 100")
        self.assertEqual(pl.expr("30s", 120.0, 0.75),
                         "predict_linear(memory_bytes[30s], 120) / memory_limit_bytes * 100 >= 300")

    def test_evaluation_uses_the_detectors_threshold(self):
        r = make_run("f", "x", ttf0=60.0)
        p = np.full(len(r.t), 0.9)
        self.assertEqual(lt.evaluate_runs([r], {"f": p}, 120.0, gate_lead=1.0)["detected_before_failure"], 1.0)
        self.assertEqual(lt.evaluate_runs([r], {"f": p}, 120.0, gate_lead=1.0, threshold=1.0)["detected_before_failure"], 0.0)


class DecisionTest(unittest.TestCase):
    def test_decision_is_the_debounce_th_consecutive_anomalous_sample(self):
        cases = [
            ("three in a row", [0.9, 0.9, 0.9, 0.1], [2.0]),
            ("broken streak restarts the count", [0.9, 0.9, 0.1, 0.9, 0.9, 0.9], [5.0]),
            ("one decision per episode", [0.9] * 8, [2.0]),
            ("a new episode decides again", [0.9, 0.9, 0.9, 0.1, 0.9, 0.9, 0.9], [2.0, 6.0]),
            ("threshold is inclusive", [0.5, 0.5, 0.5], [2.0]),
            ("never three", [0.9, 0.9, 0.4, 0.9, 0.9], []),
        ]
        for name, p, want in cases:
            with self.subTest(name):
                self.assertEqual(lt.decisions(np.array(p), np.arange(len(p), dtype=float)), want)


class LabelTest(unittest.TestCase):
    def test_label_is_failure_within_the_horizon(self):
        r = make_run("a", "mem-ramp", ttf0=5.0, n=8)  # ttf 5,4,...,-2
        self.assertEqual(list(lt.labels(r, 3.0)), [0, 0, 1, 1, 1, 1, 0, 0])

    def test_healthy_runs_are_all_zero(self):
        self.assertEqual(lt.labels(make_run("h", "idle"), 120.0).sum(), 0)

    def test_failing_runs_train_only_once_their_load_began(self):
        r = make_run("a", "mem-ramp", ttf0=50.0, n=10, fault_from=4.0)
        self.assertEqual(list(lt.training_mask(r)), [False] * 4 + [True] * 6)
        h = make_run("h", "idle", fault_from=4.0)
        self.assertTrue(lt.training_mask(h).all())

    def test_baseline_is_the_profiles_leading_idle_segment(self):
        for profile, want in [("55s;25s:mem=19Mi", 55.0), ("1m0s;3m5s", 60.0),
                              ("1m30.5s;x", 90.5), ("25s:mem=1Mi;10s", 0.0), ("", 0.0)]:
            with self.subTest(profile):
                self.assertAlmostEqual(lt.baseline_s(profile), want)


class EvaluateTest(unittest.TestCase):
    def test_figures_follow_the_agents_rules(self):
        # Failing run: load from t=2, failure at t=1000+30. A decision at t=1004
        # (3rd anomalous sample) leaves 26 s >= gate. A decision in the baseline
        # (before the load) is a false alarm.
        early = make_run("early", "mem-ramp", ttf0=30.0, n=12, fault_from=2.0)
        late = make_run("late", "mem-ramp", ttf0=12.0, n=12, fault_from=0.0)
        miss = make_run("miss", "spike", ttf0=11.0, n=11, fault_from=0.0)
        pre = make_run("pre", "mem-ramp", ttf0=40.0, n=12, fault_from=6.0)
        ok = make_run("ok", "idle", n=3600)
        probs = {
            "early": np.array([0, 0, .9, .9, .9, .9, 0, 0, 0, 0, 0, 0], dtype=float),
            "late": np.array([0, 0, 0, 0, 0, 0, 0, .9, .9, .9, .9, .9], dtype=float),
            "miss": np.zeros(11),
            "pre": np.array([.9, .9, .9, 0, 0, 0, 0, 0, .9, .9, .9, 0], dtype=float),
            "ok": np.concatenate([np.zeros(3590), np.full(10, .9)]),
        }
        s = lt.evaluate_runs([early, late, miss, pre, ok], probs, horizon=120.0)
        by = {e["run"]: e for e in s["runs"]}
        self.assertEqual(by["early"]["lead_s"], 26.0)
        self.assertEqual(by["late"]["lead_s"], 3.0)
        self.assertIsNone(by["miss"]["lead_s"])
        self.assertEqual(by["pre"]["lead_s"], 30.0)  # the decision at t=10, not the one at t=2
        self.assertEqual(s["failing_runs"], 4)
        self.assertAlmostEqual(s["recall_at_gate"], 2 / 4)  # early and pre
        self.assertAlmostEqual(s["detected_before_failure"], 3 / 4)
        self.assertEqual(s["false_alarms"], 2)  # pre's baseline decision + the healthy one
        self.assertEqual(s["false_alarms_healthy"], 1)
        self.assertAlmostEqual(s["false_alarms_per_hour"], 1 / (3599 / 3600))
        self.assertAlmostEqual(s["event_precision"], 3 / 5)

    def test_selection_weighs_an_outage_and_a_false_alarm_alike(self):
        def cand(name, in_time, fa, med):
            return {"name": name, "summary": {"recall_at_gate": in_time / 10, "failing_runs": 10,
                                              "false_alarms": fa, "false_alarms_per_hour": fa,
                                              "lead_s": {"median": med}}}
        cv = [cand("recall at any price", 9, 6, 50.0), cand("balanced", 7, 1, 40.0),
              cand("same score, fewer alarms", 6, 0, 30.0)]
        self.assertEqual(lt.select(cv)["name"], "same score, fewer alarms")
        cv.append(cand("better", 8, 1, 10.0))
        self.assertEqual(lt.select(cv)["name"], "better")


class CorpusLoadTest(unittest.TestCase):
    def test_missing_corpus_says_how_to_make_it(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(lt.CorpusError, "amf-lab corpus"):
                lt.load_corpus(d)

    def test_bad_row_names_the_line(self):
        with tempfile.TemporaryDirectory() as d:
            with gzip.open(os.path.join(d, lt.CORPUS_FILE), "wt") as f:
                f.write("run,family,time,cpu_seconds_total,memory_bytes,memory_limit_bytes,"
                        "network_bytes_total,disk_bytes_total,since_onset_s,time_to_failure_s,label\n")
                f.write("a,idle,1,0,0,1,0,0,0,,0\n")
                f.write("a,idle,x,0,0,1,0,0,1,,0\n")
            with self.assertRaisesRegex(lt.CorpusError, "line 3"):
                lt.load_corpus(d)


SIDECAR_OK = os.access(lt.SIDECAR, os.X_OK)
class WindowAgeTest(unittest.TestCase):
    def test_decisions_split_at_the_end_of_the_lead_in(self):
        # 20 samples, onset at t=1000; lead-in 10 s, load from 12 s; the
        # failure at 1019 (ttf0 19).
        cases = [
            ("an alarm while the windows fill is a lead-in false alarm",
             [0.9] * 3 + [0.1] * 17, None, {"lead_in": 1, "run": 0, "false": 0}),
            ("a streak across the split decides where it completes",
             [0.1] * 8 + [0.9] * 3 + [0.1] * 9, None, {"lead_in": 0, "run": 1, "false": 1}),
            ("a failing run caught after the load began, in time",
             [0.1] * 12 + [0.9] * 8, 19.0, {"lead_in": 0, "run": 1, "false": 0, "lead": 5.0, "in_time": False}),
            ("a decision before the load began is false, not a catch",
             [0.1] * 9 + [0.9] * 11, 19.0, {"lead_in": 0, "run": 1, "false": 1, "lead": None, "in_time": False}),
        ]
        for name, p, ttf0, want in cases:
            with self.subTest(name):
                r = make_run("r", "leak-pause" if ttf0 else "idle", ttf0=ttf0, n=20, fault_from=12.0)
                seg = wa.segments(r, np.array(p), 10.0, 120.0)
                self.assertEqual(seg["lead_in"]["decisions"], want["lead_in"])
                self.assertEqual(seg["run"]["decisions"], want["run"])
                self.assertEqual(seg["run"]["false_decisions"], want["false"])
                if ttf0 is not None:
                    self.assertEqual(seg["run"]["lead_s"], want["lead"])
                    self.assertEqual(seg["run"]["in_time"], want["in_time"])

    def test_in_time_needs_the_gate_lead(self):
        r = make_run("r", "leak-pause", ttf0=40.0, n=40, fault_from=0.0)
        seg = wa.segments(r, np.array([0.9] * 40), 0.0, 120.0)
        self.assertEqual(seg["run"]["lead_s"], 38.0)
        self.assertTrue(seg["run"]["in_time"])

    def test_a_run_without_lead_in_is_all_run(self):
        r = make_run("r", "idle", n=6)
        seg = wa.segments(r, np.array([0.9] * 6), None, 120.0)
        self.assertEqual(seg["lead_in"], {"decisions": 0, "max_probability": None})
        self.assertEqual((seg["run"]["decisions"], seg["run"]["false_decisions"]), (1, 1))

    def test_warm_up_silences_only_the_first_seconds(self):
        r = make_run("r", "idle", n=10)
        q = wa.warm(r, np.full(10, 0.9), 4.0)
        self.assertEqual(list(q), [0.0] * 4 + [0.9] * 6)
        self.assertEqual(lt.decisions(q, r.t), [1006.0])

    def test_lead_in_is_read_from_runs_json(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "runs.json"), "w", encoding="utf-8") as f:
                json.dump([{"id": "idle-1", "lead_in": "10m0s"}, {"id": "idle-2"}], f)
            got = wa.lead_in_s(d, [lt.Run("idle-1", "idle"), lt.Run("idle-2", "idle")])
        self.assertEqual(got, {"idle-1": 600.0, "idle-2": 0.0})


CORPUS_OK = os.path.isfile(os.path.join(lt.CORPUS_DIR, lt.CORPUS_FILE))


@unittest.skipUnless(SIDECAR_OK and CORPUS_OK,
                     "needs bin/amf-sidecar (make build) and lab/corpus/data/corpus.csv.gz")
class EndToEndTest(unittest.TestCase):
    def test_leadtime_command_ships_a_model_that_ignores_network_and_disk(self):
        with tempfile.TemporaryDirectory() as d:
            args = types.SimpleNamespace(corpus=None, sidecar=lt.SIDECAR, out_dir=os.path.join(d, "m"),
                                         report=os.path.join(d, "r"), seed=42, verbose=False)
            old = (lt.WINDOW_CANDIDATES, lt.HORIZONS, pl.WINDOWS, pl.HORIZONS)
            lt.WINDOW_CANDIDATES, lt.HORIZONS = old[0][:1] + old[0][2:3], (60.0,)
            pl.WINDOWS, pl.HORIZONS = ("30s", "2m"), (30.0, 60.0)
            try:
                self.assertEqual(lt.run(args, "test", amftrain.write_golden, amftrain.crafted_rows), 0)
            finally:
                lt.WINDOW_CANDIDATES, lt.HORIZONS, pl.WINDOWS, pl.HORIZONS = old
            man = read_json(os.path.join(d, "m", "leadtime_manifest.json"))
            self.assertEqual(man["feature_windows"]["sample_interval"], "1s")
            self.assertEqual(man["normalisation"], {"cpu_reference_fraction": 1.0,
                                                    "memory_reference_fraction": 1.0})
            text = read_text(os.path.join(d, "m", "leadtime_model.txt"))
            self.assertEqual(man["model_sha256"], amfexport.sha256_bytes(text.encode()))
            _, trees = amfexport.parse_lightgbm_text(text)
            for t in trees:
                for f in t.get("split_feature", []):
                    self.assertNotIn(f, lt.UNUSED_IDX)
            rep = read_json(os.path.join(d, "r", "leadtime.json"))
            self.assertEqual(len(rep["cross_validation"]), 2)
            self.assertEqual(set(rep["split"]["train"]) & set(rep["split"]["test"]), set())
            golden = read_text(os.path.join(d, "m", "testdata", "parity_leadtime.csv")).splitlines()
            self.assertGreater(len(golden), 100)
            # The predict_linear detector: chosen among its candidates, shipped
            # as its PromQL line, judged on the test families.
            self.assertEqual(len(rep["predict_linear"]["cross_validation"]), 4)
            ch = rep["predict_linear"]["chosen"]
            self.assertIn((ch["window"], ch["horizon_s"]), [(w, h) for w in ("30s", "2m") for h in (30.0, 60.0)])
            pman = read_json(os.path.join(d, "m", pl.MANIFEST_FILE))
            ptext = read_text(os.path.join(d, "m", pl.MODEL_FILE))
            self.assertEqual(pman["model_sha256"], amfexport.sha256_bytes(ptext.encode()))
            self.assertEqual(ptext.strip(), pl.expr(ch["window"], ch["horizon_s"]))
            self.assertEqual(pman["predict_linear"]["window"], ch["window"])
            test_ids = {e["run"] for e in rep["test"]["leadtime"]["runs"]}
            self.assertEqual({e["run"] for e in rep["test"]["predict_linear"]["runs"]}, test_ids)


LEAD_IN_OK = os.path.isfile(os.path.join(wa.LEAD_IN_DIR, lt.CORPUS_FILE))


@unittest.skipUnless(SIDECAR_OK and CORPUS_OK and LEAD_IN_OK,
                     "needs bin/amf-sidecar (make build), lab/corpus/data and lab/corpus/lead-in")
class WindowAgeEndToEndTest(unittest.TestCase):
    def test_window_age_scores_both_recordings_of_every_lead_in_run(self):
        with tempfile.TemporaryDirectory() as d:
            args = types.SimpleNamespace(corpus=None, lead_in=None, sidecar=lt.SIDECAR, report=d, seed=42)
            self.assertEqual(wa.run(args), 0)
            rep = read_json(os.path.join(d, "window-age.json"))
        recorded = lt.load_corpus(wa.LEAD_IN_DIR)
        runs = [r for r in recorded if r.family not in lt.TRAIN_FAMILIES]
        self.assertEqual(rep["run_ids"], [r.id for r in runs])
        with_train = any(r.family in lt.TRAIN_FAMILIES for r in recorded)
        self.assertEqual(len(rep["models"]), 5 if with_train else 4)
        # The held-out model is the lead-time report's: the same figures.
        lead = read_json(os.path.join(lt.REPO_ROOT, "infer", "train", "report", "leadtime.json"))["test"]["leadtime"]
        got = rep["main_test"]["leadtime (train families)"]
        self.assertEqual((got["recall_at_gate"], got["false_alarms"]), (lead["recall_at_gate"], lead["false_alarms"]))
        self.assertEqual(set(rep["lead_in_corpus"]["lead_in"]), {"600s"})
        for m in rep["models"]:
            for r in runs:
                young, full = rep["runs"][m]["young"][r.id], rep["runs"][m]["full"][r.id]
                # The lead-in is in the full recording only, and scored.
                self.assertIsNone(young["lead_in"]["max_probability"])
                self.assertIsNotNone(full["lead_in"]["max_probability"])
                self.assertEqual(young["fails"], full["fails"])


if __name__ == "__main__":
    unittest.main()
