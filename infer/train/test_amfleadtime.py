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


def with_memory(r, mem):
    """The run with these memory_bytes (the other raw columns plain)."""
    r.rows = [[str(t), "0", str(m), "100", "0", "0"] for t, m in zip(r.t, mem)]
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

    def test_above_healthy_labels_leave_out_what_a_healthy_run_holds(self):
        # The healthy run holds 40 beside its own 10: the ceiling. The failing
        # run's own memory is 12 (its quiet part); within the horizon (ttf 5..0,
        # the last 6 samples) only samples above 12 + 40 train: 52 is not.
        h = with_memory(make_run("h", "mem-sawtooth", n=6, fault_from=2.0), [10, 10, 30, 50, 20, 10])
        f = with_memory(make_run("f", "mem-ramp", ttf0=9.0, n=10, fault_from=2.0),
                        [12, 12, 30, 45, 52, 40, 52, 53, 60, 70])
        cases = [
            ("the ceiling is the most a healthy run holds beside its own", lt.healthy_ceiling([h, f]), 40.0),
            ("no healthy run, no ceiling", lt.healthy_ceiling([f]), 0.0),
        ]
        for name, got, want in cases:
            with self.subTest(name):
                self.assertEqual(got, want)
        self.assertEqual(list(lt.training_mask(f, 5.0, 40.0)),
                         [False, False, True, True, False, False, False, True, True, True])
        self.assertEqual(list(lt.training_mask(f, 5.0)), [False] * 2 + [True] * 8)
        self.assertTrue(lt.training_mask(h, 5.0, 40.0).all())

    def test_a_heavier_broker_raises_every_memory_reading_and_nothing_else(self):
        h = with_memory(make_run("h", "idle", n=4, fault_from=2.0), [10, 10, 30, 50])
        r = lt.raised(h, 4 * 2**20)
        self.assertEqual(r.id, "h+4Mi")
        self.assertEqual(r.family, "idle")
        self.assertEqual(list(lt.memory_bytes(r) - lt.memory_bytes(h)), [4 * 2**20] * 4)
        self.assertEqual([row[:2] + row[3:] for row in r.rows], [row[:2] + row[3:] for row in h.rows])
        self.assertIs(r.t, h.t)
        self.assertEqual(r.fault_from_s, 2.0)
        # Beside the heavier broker the run holds as much as it did.
        self.assertEqual(lt.healthy_ceiling([r]), lt.healthy_ceiling([h]))

    def test_a_headroom_trains_the_heavier_copies_and_raises_the_ceiling(self):
        # A healthy run holding 40 beside its own 10, and its copy 20 heavier;
        # a failing run climbing to its kill. With headroom 20 the copy
        # trains (its rows count) and failures count only above 40 + 20.
        h = with_memory(make_run("h", "mem-sawtooth", n=6, fault_from=2.0), [10, 10, 30, 50, 20, 10])
        f = with_memory(make_run("f", "mem-ramp", ttf0=9.0, n=10, fault_from=2.0),
                        [12, 12, 30, 45, 52, 40, 60, 73, 80, 90])
        heavy = {20: {"h": lt.raised(h, 20)}}
        feats = {r.id: np.column_stack([np.zeros(len(r.t)), lt.memory_bytes(r), np.zeros((len(r.t), 4))])
                 for r in (h, f, heavy[20]["h"])}
        _, n0, c0 = lt.fit([h, f], feats, 5.0, 42, label_rule="above-healthy")
        _, n1, c1 = lt.fit([h, f], feats, 5.0, 42, label_rule="above-healthy", headroom=20, heavier=heavy)
        self.assertEqual((c0, c1), (40.0, 60.0))
        # f trains its 2 loaded samples outside H and those of its last 6
        # above its own 12 + the ceiling: 60, 73, 80, 90 above 52; 73, 80, 90
        # above 72. The heavier copy trains all of its 6.
        self.assertEqual((n0, n1), (6 + 2 + 4, 6 + 6 + 2 + 3))
        with self.assertRaises(ValueError):
            lt.fit([h, f], feats, 5.0, 42, label_rule="every", headroom=20, heavier=heavy)

    def test_cross_validation_scores_the_left_out_healthy_runs_beside_a_heavier_broker(self):
        h = with_memory(make_run("h", "mem-sawtooth", n=6), [10, 10, 30, 50, 20, 10])
        g = with_memory(make_run("g", "idle", n=6), [10] * 6)
        f = with_memory(make_run("f", "mem-ramp", ttf0=5.0, n=6), [12, 30, 50, 70, 80, 90])
        e = with_memory(make_run("e", "mem-step", ttf0=5.0, n=6), [12, 12, 50, 50, 90, 90])
        heavy = {lt.HEAVIER_BROKER_BYTES: {r.id: lt.raised(r, lt.HEAVIER_BROKER_BYTES) for r in (h, g)}}
        runs = [h, g, f, e]
        feats = {r.id: np.column_stack([np.zeros(len(r.t)), lt.memory_bytes(r), np.zeros((len(r.t), 4))])
                 for r in runs + list(heavy[lt.HEAVIER_BROKER_BYTES].values())}
        probs = lt.cross_validate(runs, feats, 5.0, 42, heavier=heavy)
        self.assertEqual(set(probs), {"h", "g", "f", "e", "h+2Mi", "g+2Mi"})
        self.assertEqual(set(lt.cross_validate(runs, feats, 5.0, 42)), {"h", "g", "f", "e"})

    def test_a_memory_model_never_splits_on_cpu(self):
        rng = np.random.default_rng(1)
        X = rng.random((400, 6))
        y = (X[:, 0] + X[:, 1] > 1.0).astype(int)  # CPU would help
        used = dict(lt.FEATURE_SETS)["memory"]
        clf = lt.make_hgbc(42)
        clf.fit(lt.model_inputs(X, used), y)
        lt.check_unused(clf, used)
        with self.assertRaises(AssertionError):
            lt.check_unused(clf.fit(lt.model_inputs(X), y), used)

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


def summary(in_time, failing, fa_per_h, false_alarms=None):
    return {"recall_at_gate": in_time / failing, "failing_runs": failing, "false_alarms_per_hour": fa_per_h,
            "false_alarms": fa_per_h if false_alarms is None else false_alarms, "lead_s": {"median": 30.0}}


class DefaultTest(unittest.TestCase):
    def test_a_default_must_not_lose_to_predict_linear_on_either_measure(self):
        cases = [
            ("more in time but more alarms loses",
             {"p1": summary(5, 10, 2.0), "leadtime": summary(3, 10, 0.5), lt.PREDICT_LINEAR: summary(2, 10, 1.0)},
             "leadtime", ["leadtime", lt.PREDICT_LINEAR]),
            ("fewer in time loses even with no alarm",
             {"p1": summary(1, 10, 0.0), "leadtime": summary(4, 10, 0.9), lt.PREDICT_LINEAR: summary(2, 10, 1.0)},
             "leadtime", ["leadtime", lt.PREDICT_LINEAR]),
            ("the rule itself when everything else loses",
             {"p1": summary(1, 10, 0.5), "leadtime": summary(9, 10, 3.0), lt.PREDICT_LINEAR: summary(2, 10, 1.0)},
             lt.PREDICT_LINEAR, [lt.PREDICT_LINEAR]),
            ("a tie keeps the current default",
             {"p1": summary(2, 10, 1.0), "leadtime": summary(2, 10, 1.0), lt.PREDICT_LINEAR: summary(2, 10, 1.0)},
             "p1", ["p1", "leadtime", lt.PREDICT_LINEAR]),
        ]
        for name, test, want, eligible in cases:
            with self.subTest(name):
                got = lt.rule_choice(test)
                self.assertEqual(got["name"], want)
                self.assertEqual(got["eligible"], eligible)
                self.assertEqual(set(got["loses_to_predict_linear"]), set(test) - set(eligible))
                for why in got["loses_to_predict_linear"].values():
                    self.assertRegex(why, r"fewer runs in time|more false alarms")


def memory_run(rid, mem_mib, fault_from, fails=True):
    """A run sampled every second with the given memory (MiB) under a 100 MiB
    limit, killed one second after its last sample."""
    n = len(mem_mib)
    r = make_run(rid, "leak-pause", ttf0=float(n) if fails else None, n=n, fault_from=fault_from)
    r.rows = [["0", "0", str(int(m * 2**20)), str(100 * 2**20), "0", "0"] for m in mem_mib]
    return r


class ChooseDefaultTest(unittest.TestCase):
    def test_the_rules_choice_replaces_the_default_only_if_it_meets_every_goal(self):
        def held_out(lead, fa_per_h):
            return dict(summary(1, 1, fa_per_h), runs=[{"run": "f", "fails": True, "lead_s": lead}],
                        false_alarms_healthy=0, healthy_hours=100.0, quiet_start_alarms=0)
        catch = {"f": {"catchable": True}}
        quiet = {"p1": 0, "leadtime": 0, lt.PREDICT_LINEAR: 0}
        cases = [
            ("meets them: replaces", {"p1": held_out(None, 2.0), "leadtime": held_out(30.0, 0.01),
                                      lt.PREDICT_LINEAR: held_out(None, 0.5)}, quiet, "leadtime"),
            ("misses one: the incumbent stays", {"p1": held_out(None, 2.0), "leadtime": held_out(30.0, 0.2),
                                                 lt.PREDICT_LINEAR: held_out(None, 0.5)}, quiet, "p1"),
            ("alarms at a quiet start as shipped: the incumbent stays",
             {"p1": held_out(None, 2.0), "leadtime": held_out(30.0, 0.01), lt.PREDICT_LINEAR: held_out(None, 0.5)},
             dict(quiet, leadtime=1), "p1"),
        ]
        for name, test, q, want in cases:
            with self.subTest(name):
                got = lt.choose_default(test, catch, q)
                self.assertEqual(got["rule_choice"], "leadtime")
                self.assertEqual(got["name"], want)
                self.assertEqual(got["goals_met"]["leadtime"], want == "leadtime")


class CatchabilityTest(unittest.TestCase):
    def test_a_run_is_caught_only_above_what_a_healthy_run_holds(self):
        own = [7.0] * 10  # the broker's own memory while quiet
        cases = [
            ("long above the ceiling", own + [60.0] * 10 + [90.0] * 30, True, 30.0),
            ("above it too briefly", own + [60.0] * 30 + [90.0] * 10, False, 10.0),
            ("a step from below", own + [20.0] * 30, False, 0.0),
            ("a dip below restarts the clock", own + [90.0] * 30 + [70.0] + [90.0] * 5, False, 5.0),
            ("the ceiling is beside the broker's own memory", [20.0] * 10 + [85.0] * 40, False, 0.0),
        ]
        for name, mem, want, above in cases:
            with self.subTest(name):
                c = lt.catchability(memory_run("r", mem, fault_from=10.0))
                self.assertEqual(c["catchable"], want, c)
                self.assertEqual(c["above_s"], above)
                self.assertTrue(c["reason"])

    def test_goals_count_only_the_runs_that_can_be_caught(self):
        s = {"runs": [{"run": "a", "fails": True, "lead_s": 30.0}, {"run": "b", "fails": True, "lead_s": 10.0},
                      {"run": "c", "fails": True, "lead_s": None}, {"run": "h", "fails": False}],
             "false_alarms_per_hour": 0.02, "false_alarms_healthy": 1, "healthy_hours": 50.0,
             "quiet_start_alarms": 0}
        catch = {"a": {"catchable": True}, "b": {"catchable": True}, "c": {"catchable": False}}
        in_time, per_day, quiet = lt.goals(s, catch, 0)
        self.assertEqual((in_time["value"], in_time["met"]), ("1/2", False))  # b is too late; c cannot be caught
        self.assertTrue(per_day["met"])  # 0.48 per pod-day
        self.assertTrue(quiet["met"])
        self.assertFalse(lt.goals(s, catch, 2)[2]["met"])  # the shipped detector alarms at a quiet start
        s["false_alarms_per_hour"] = 0.05
        self.assertFalse(lt.goals(s, catch, 0)[1]["met"])  # 1.2 per pod-day


class QuietStartTest(unittest.TestCase):
    def test_decisions_before_the_load_are_quiet_start_alarms(self):
        f = make_run("f", "mem-ramp", ttf0=30.0, n=12, fault_from=5.0)
        h = make_run("h", "idle", n=12, fault_from=5.0)
        p = np.array([.9, .9, .9, 0, 0, 0, 0, .9, .9, .9, 0, 0], dtype=float)
        s = lt.evaluate_runs([f, h], {"f": p, "h": p}, 120.0)
        self.assertEqual(s["quiet_start_alarms"], 2)  # t=2 in both; t=9 is after the load began
        self.assertEqual([e["quiet_start_alarms"] for e in s["runs"]], [1, 1])
        self.assertEqual(s["false_alarms"], 3)  # f's quiet one, both of h's


class CorpusLoadTest(unittest.TestCase):
    def test_missing_corpus_says_how_to_make_it(self):
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(lt.CorpusError, "amf-lab corpus"):
                lt.load_corpus(d)

    def test_check_refuses_a_sidecar_built_before_the_models(self):
        with tempfile.TemporaryDirectory() as d:
            old = os.path.join(d, "amf-sidecar")
            with open(old, "w") as f:
                f.write("#!/bin/sh\n")
            os.chmod(old, 0o755)
            os.utime(old, (0, 0))
            with self.assertRaisesRegex(lt.CorpusError, "older than infer/model/.*make build"):
                lt.stale_binary(old)
            os.utime(old, None)
            lt.stale_binary(old)  # built after the models: nothing to say

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
CORPUS_OK = os.path.isfile(os.path.join(lt.CORPUS_DIR, lt.CORPUS_FILE))


@unittest.skipUnless(SIDECAR_OK and CORPUS_OK,
                     "needs bin/amf-sidecar (make build) and lab/corpus/real-node/corpus.csv.gz")
class EndToEndTest(unittest.TestCase):
    def test_leadtime_command_ships_a_model_that_ignores_network_and_disk(self):
        with tempfile.TemporaryDirectory() as d:
            args = types.SimpleNamespace(corpus=None, sidecar=lt.SIDECAR, out_dir=os.path.join(d, "m"),
                                         report=os.path.join(d, "r"), seed=42, verbose=False)
            old = (lt.WINDOW_CANDIDATES, lt.HORIZONS, lt.MONOTONIC, lt.THRESHOLDS, lt.LABEL_RULES,
                   lt.FEATURE_SETS, lt.HEADROOMS, pl.WINDOWS, pl.HORIZONS)
            lt.WINDOW_CANDIDATES, lt.HORIZONS = old[0][:1] + old[0][2:3], (60.0,)
            lt.MONOTONIC, lt.THRESHOLDS, lt.LABEL_RULES = (True,), (0.5, 0.9), ("above-healthy",)
            lt.FEATURE_SETS, lt.HEADROOMS = old[5][1:], (4 * 2**20,)
            pl.WINDOWS, pl.HORIZONS = ("30s", "2m"), (30.0, 60.0)
            try:
                self.assertEqual(lt.run(args, "test", amftrain.write_golden, amftrain.crafted_rows), 0)
            finally:
                (lt.WINDOW_CANDIDATES, lt.HORIZONS, lt.MONOTONIC, lt.THRESHOLDS, lt.LABEL_RULES,
                 lt.FEATURE_SETS, lt.HEADROOMS, pl.WINDOWS, pl.HORIZONS) = old
            man = read_json(os.path.join(d, "m", "leadtime_manifest.json"))
            self.assertEqual(man["feature_windows"]["sample_interval"], "1s")
            self.assertEqual(man["normalisation"], {"cpu_reference_fraction": 1.0,
                                                    "memory_reference_fraction": 1.0})
            text = read_text(os.path.join(d, "m", "leadtime_model.txt"))
            self.assertEqual(man["model_sha256"], amfexport.sha256_bytes(text.encode()))
            _, trees = amfexport.parse_lightgbm_text(text)
            memory = [i for i, f in enumerate(lt.FEATURES) if f.startswith("memory")]
            for t in trees:
                for f in t.get("split_feature", []):
                    self.assertIn(f, memory)
            rep = read_json(os.path.join(d, "r", "leadtime.json"))
            self.assertEqual(len(rep["cross_validation"]), 4)  # 2 window sets x 2 thresholds
            self.assertEqual(man["threshold"], rep["chosen"]["threshold"])
            self.assertIn("monotonic", man["protocol"])
            # The label rule's ceiling: the most a healthy run holds beside the
            # broker (mem-sawtooth, ~74 Mi), measured, recorded and named.
            ceiling = rep["chosen"]["ceiling_bytes"]["shipped"]
            self.assertEqual(rep["chosen"]["labels"], "above-healthy")
            self.assertGreater(ceiling, 60 * 2**20)
            self.assertIn("labels above %.1f Mi" % (ceiling / 2**20), man["protocol"])
            self.assertIn("features memory", man["protocol"])
            self.assertIn("beside a broker 4 Mi heavier", man["protocol"])
            self.assertEqual(rep["chosen"]["headroom_bytes"], 4 * 2**20)
            # The held-out healthy runs beside the heavier broker, for each detector.
            healthy = {e["run"] + "+2Mi" for e in rep["test"]["leadtime"]["runs"] if not e["fails"]}
            for name in ("leadtime", "p1", "predict_linear"):
                self.assertEqual({e["run"] for e in rep["test_heavier"][name]["runs"]}, healthy, name)
            # The default: one of the three, never one that loses to predict_linear.
            dflt = rep["default"]
            self.assertIn(dflt["rule_choice"], ("p1", "leadtime", lt.PREDICT_LINEAR))
            self.assertNotIn(dflt["rule_choice"], dflt["loses_to_predict_linear"])
            self.assertEqual(len(dflt["goals"][dflt["name"]]), 3)
            self.assertIn(dflt["name"], (dflt["rule_choice"], dflt["incumbent"]))
            failing = {e["run"] for e in rep["test"]["leadtime"]["runs"] if e["fails"]}
            self.assertEqual(set(rep["catchability"]), failing)
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


    def test_check_scores_every_embedded_detector_on_another_corpus(self):
        # Two runs of the committed corpus as a corpus folder of their own, as
        # a later recording (a healthy soak) would be: one row per detector,
        # each at its own threshold.
        import contextlib
        import csv
        import io
        keep = {"idle-1", "leak-pause-1"}
        with tempfile.TemporaryDirectory() as d:
            with gzip.open(os.path.join(lt.CORPUS_DIR, lt.CORPUS_FILE), "rt", newline="") as f, \
                    gzip.open(os.path.join(d, lt.CORPUS_FILE), "wt", newline="") as g:
                r, w = csv.reader(f), csv.writer(g, lineterminator="\n")
                head = next(r)
                w.writerow(head)
                w.writerows(rec for rec in r if rec[head.index("run")] in keep)
            metas = read_json(os.path.join(lt.CORPUS_DIR, "runs.json"))
            with open(os.path.join(d, "runs.json"), "w", encoding="utf-8") as f:
                json.dump([m for m in metas if m["id"] in keep], f)
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                code = lt.check(types.SimpleNamespace(corpus=d, sidecar=lt.SIDECAR, horizon=120.0))
        self.assertEqual(code, 0)
        text = out.getvalue()
        self.assertIn("2 runs (1 failing)", text)
        for name in ("p1", "leadtime", lt.PREDICT_LINEAR):
            thr = float(lt.embedded_manifest(name)["threshold"])
            rows = [ln for ln in text.splitlines() if ln.startswith("| %s (threshold %.1f) |" % (name, thr))]
            self.assertEqual(len(rows), 1, text)
            self.assertTrue(rows[0].split("|")[2].strip().endswith("/1"), rows[0])


if __name__ == "__main__":
    unittest.main()
