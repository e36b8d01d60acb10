"""The lead-time model: predict the failure, not the label.

Trains a HistGradientBoostingClassifier on the lab corpus (``lab/corpus/real-node``,
made by ``amf-lab corpus`` on a real kubelet + containerd node, every run with a
quiet lead-in of 0-10 min) to say "this container fails within H seconds", and
evaluates it the way the agent will use it: per run, the agent decides after
``debounce`` consecutive samples at or above the threshold, and a switchover
only beats the failure when that decision comes at least ``gate_lead`` seconds
before it (the hold before the primary is retired, plus a margin).

Features are recomputed from the corpus's raw counters by the sidecar itself
(``amf-sidecar replay`` with the candidate windows), so the training features are
exactly what the sidecar computes at run time. The network and disk features are
held constant (0) in training: the network counter is now the pod's own, but no
train family varies it (each broker carries only the lab's own quiet traffic,
3.8 kB/s; the traffic bursts are a held-out family), so a split on it would be a
split on noise; and this kernel's blkio counts nothing. ``check_unused`` proves
the trees do not split on them. Whether CPU helps is a candidate like the
windows (``FEATURE_SETS``), and so is teaching the healthy runs beside a
heavier broker (``HEADROOMS``); the cross-validation scores every left-out
healthy run beside one too (``HEAVIER_BROKER_BYTES``), as a healthy soak showed
a broker can be.

Then the lab chooses the default among the embedded detectors (``choose_default``)
on the held-out families, and checks the goals the default must meet
(``goals``): which failing runs can be caught at all (``catchability``), the
share of those caught in time, false alarms per pod-day, and alarms while a
fresh sidecar's windows fill (the quiet lead-in every run starts with).
"""

import csv
import gzip
import io
import json
import math
import os
import subprocess
import tempfile
import warnings

import numpy as np

import amfexplain
import amfexport
from amfdata import FEATURES, REPO_ROOT

CORPUS_DIR = os.path.join(REPO_ROOT, "lab", "corpus", "real-node")
CORPUS_FILE = "corpus.csv.gz"
DATASET_NAME = "AMF lab corpus, recorded on a real node (lab/corpus/real-node, see lab/corpus/DATASHEET.md)"
DATASET_URL = "lab/corpus/real-node"
SIDECAR = os.path.join(REPO_ROOT, "bin", "amf-sidecar")

# Regime split: the test families are profile shapes the model never sees in
# training (a leak with pauses, a spike without warning, oscillating CPU, memory
# held high, idle, MQTT traffic bursts), so the figures say how it does on new
# kinds of load.
# mem-sawtooth trains: without it every memory ramp among the train families
# ends in a kill, and the trees learn that growing memory is a failure.
TRAIN_FAMILIES = ("mem-ramp", "mem-step", "paper", "cpu-ramp", "cpu-burst", "steady-heavy", "mem-sawtooth")
TEST_FAMILIES = ("leak-pause", "spike", "cpu-oscillation", "mem-high-hold", "idle", "traffic-burst")

# Features the model may split on; the other two are held at 0 in training.
USED = ("cpu_percent", "memory_percent", "cpu_growth_rate", "memory_growth_rate")
# Candidate feature sets, each a subset of USED (the rest held at 0 as well).
# Every failure of the corpus is an OOM kill; CPU can tell a failing load
# from a healthy one only by the shapes the train families happen to have,
# and the trees may learn those instead of the memory that kills.
FEATURE_SETS = (("memory+cpu", USED), ("memory", ("memory_percent", "memory_growth_rate")))
# A broker may hold more memory of its own than any in the corpus did (a
# healthy soak's held 8.3 Mi, every training run's 6.0-7.4 Mi), and the trees
# see memory as a share of the limit, so a healthy load beside a heavier
# broker lands where they saw only failures. Cross-validation also scores
# every left-out healthy run beside a broker HEAVIER_BROKER_BYTES heavier (the
# same counters with that much more memory: each training run's broker plus
# 2 Mi spans 8.0-9.4 Mi, past the 8.3 Mi the soak alarmed beside); a candidate
# may train on such copies too (HEADROOMS).
HEAVIER_BROKER_BYTES = 2 * 2**20

SAMPLE_INTERVAL = "1s"  # amf-lab corpus samples every second
P1_WINDOWS = {"rate_window": "5m", "deriv_window": "10m", "subquery_step": "5s",
              "lookback": "5m"}
# Candidates, from P1's down to a few seconds. The 5-minute rate averages a
# fault's first minutes away; shorter windows react sooner but see more noise.
WINDOW_CANDIDATES = (
    P1_WINDOWS,
    {"rate_window": "1m", "deriv_window": "2m", "subquery_step": "5s", "lookback": "5m"},
    {"rate_window": "30s", "deriv_window": "1m", "subquery_step": "1s", "lookback": "5m"},
    {"rate_window": "15s", "deriv_window": "30s", "subquery_step": "1s", "lookback": "5m"},
    {"rate_window": "10s", "deriv_window": "20s", "subquery_step": "1s", "lookback": "5m"},
)
HORIZONS = (30.0, 60.0, 120.0)
# The model's own threshold (its manifest's): the sidecar reports a sample
# anomalous at or above it, and the agent's gates (amf.io/threshold, 0.5)
# count it. A higher one trades lead time for fewer alarms.
THRESHOLDS = (0.5, 0.7, 0.9)
# Monotonic trees: the risk of an OOM kill does not fall as memory or its growth
# rises. The constraint is a prior the corpus is too small to teach.
MONOTONIC = (False, True)
MONOTONIC_CST = tuple(1 if f in ("memory_percent", "memory_growth_rate") else 0 for f in FEATURES)
# What a failing run's samples within H of its kill teach. "every": all of them
# are failures. "above-healthy": only those above the most memory that a healthy
# run of the training set holds beside the broker's own (healthy_ceiling); the
# rest are left out of training. Under that ceiling a climb that will be killed
# looks, sample for sample, like a healthy one that will stop (a plateau one step
# before mem-step's kill is a healthy hold), so labelling it a failure teaches
# the trees to alarm on healthy runs. The ceiling is measured on the training
# runs of each fold, never on the runs being scored.
LABEL_RULES = ("every", "above-healthy")
# Training headrooms (bytes): 0, or the healthy runs also taught beside a
# broker that much heavier, with failures labelled only above the ceiling +
# the headroom; only with the "above-healthy" rule (under "every" the copies
# would contradict failures labelled below them).
HEADROOMS = (0, 2 * 2**20, 4 * 2**20)

# The agent's gates (actuate.DefaultGates): 3 consecutive anomalous samples
# decide; the primary is retired 15 s (hold) after the decision. The lab
# measures decision -> retired at 15.1 s, so a decision helps only when the
# failure is at least hold + 1 s away.
DEBOUNCE = 3
HOLD_S = 15.0
GATE_LEAD_S = HOLD_S + 1.0
THRESHOLD = 0.5  # the agent's (amf.io/threshold) and P1's
# The default when no detector meets the goals: the paper's model
# (infer/model.PaperName), the default before the lab's first choice. Not the
# last chosen name: a retrained leadtime that misses the goals is a new model.
INCUMBENT = "p1"
# What a healthy family may hold (lab/corpus: healthy profiles peak at 72 Mi,
# TestFamiliesKeepTheirPromise), beside the broker's own memory.
HEALTHY_CEILING_BYTES = 72 * 2**20
# The goals the default must meet on the held-out families.
GOAL_IN_TIME = 0.95            # of the failing runs that can be caught
GOAL_ALARMS_PER_POD_DAY = 1.0  # healthy runs


class CorpusError(Exception):
    """The corpus is missing or malformed."""


class Run:
    """One corpus run: raw rows in the replay format and its labels' inputs."""

    def __init__(self, run_id, family):
        self.id = run_id
        self.family = family
        self.rows = []          # raw replay columns as text
        self.t = []             # Unix seconds
        self.ttf = []           # seconds to failure, nan for runs that did not fail
        self.since_onset = []
        self.fault_from_s = 0.0  # seconds after onset when the load begins (the baseline's end)
        self._memory = None     # memory_bytes(run), parsed once

    @property
    def fails(self):
        return len(self.ttf) > 0 and not math.isnan(self.ttf[0])

    @property
    def failure_time(self):
        return self.t[0] + self.ttf[0] if self.fails else math.nan

    def in_fault(self):
        """Samples taken once the profile's load has begun."""
        return self.since_onset >= self.fault_from_s

    def duration_s(self):
        return self.t[-1] - self.t[0] if len(self.t) > 1 else 0.0


RAW_COLUMNS = ("time", "cpu_seconds_total", "memory_bytes", "memory_limit_bytes",
               "network_bytes_total", "disk_bytes_total")


def load_corpus(folder=None):
    """Read corpus.csv.gz into runs (in file order). Raises CorpusError."""
    folder = folder or CORPUS_DIR
    path = os.path.join(folder, CORPUS_FILE)
    if not os.path.isfile(path):
        raise CorpusError("%s not found: the lab corpus is made by `bin/amf-lab corpus "
                          "--seed 1 --runs 5 --out DIR` (see lab/corpus/DATASHEET.md); "
                          "pass its folder with --corpus DIR" % path)
    runs = {}
    with gzip.open(path, "rt", encoding="ascii", newline="") as f:
        r = csv.reader(f)
        header = next(r, None)
        need = ("run", "family") + RAW_COLUMNS + ("since_onset_s", "time_to_failure_s")
        if header is None or any(c not in header for c in need):
            raise CorpusError("%s: header lacks one of %s" % (path, ", ".join(need)))
        ix = {c: header.index(c) for c in need}
        for n, rec in enumerate(r, start=2):
            try:
                rid = rec[ix["run"]]
                run = runs.get(rid)
                if run is None:
                    run = runs[rid] = Run(rid, rec[ix["family"]])
                run.rows.append([rec[ix[c]] for c in RAW_COLUMNS])
                run.t.append(float(rec[ix["time"]]))
                ttf = rec[ix["time_to_failure_s"]]
                run.ttf.append(float(ttf) if ttf != "" else math.nan)
                run.since_onset.append(float(rec[ix["since_onset_s"]]))
            except (IndexError, ValueError) as e:
                raise CorpusError("%s line %d: %s" % (path, n, e)) from e
    if not runs:
        raise CorpusError("%s has no rows" % path)
    plan = os.path.join(folder, "runs.json")
    if os.path.isfile(plan):
        with open(plan, encoding="utf-8") as f:
            metas = json.load(f)
        for meta in metas:
            if meta.get("id") in runs:
                runs[meta["id"]].fault_from_s = baseline_s(meta.get("profile", ""))
    for run in runs.values():
        run.t = np.asarray(run.t)
        run.ttf = np.asarray(run.ttf)
        run.since_onset = np.asarray(run.since_onset)
    return list(runs.values())


def baseline_s(profile):
    """The length of a profile's leading idle segment ("55s;..." -> 55): the
    corpus starts every run with one, before the fault's load begins."""
    first = profile.split(";", 1)[0].strip()
    if not first or ":" in first:
        return 0.0
    total, num, unit = 0.0, "", ""
    for ch in first + " ":
        if ch.isdigit() or ch == ".":
            if unit:
                total += float(num) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3}[unit]
                num, unit = "", ""
            num += ch
        elif ch.isalpha():
            unit += ch
        elif num:
            total += float(num) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3}[unit]
            num, unit = "", ""
    return total


def corpus_sha256(folder=None):
    with open(os.path.join(folder or CORPUS_DIR, CORPUS_FILE), "rb") as f:
        return amfexport.sha256_bytes(f.read())


def replay_features(run, windows, sidecar=SIDECAR):
    """The six features at each of the run's sample times, computed by
    `amf-sidecar replay` with the given windows (plain scale), as an (n, 6) array
    with NaN where a feature is undefined."""
    if not os.access(sidecar, os.X_OK):
        raise CorpusError("%s is not an executable: build it with `make build`" % sidecar)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(RAW_COLUMNS)
    w.writerows(run.rows)
    cmd = [sidecar, "replay", "--in", "-",
           "--rate-window", windows["rate_window"], "--deriv-window", windows["deriv_window"],
           "--step", windows["subquery_step"], "--lookback", windows["lookback"]]
    p = subprocess.run(cmd, input=buf.getvalue(), capture_output=True, text=True)
    if p.returncode != 0:
        raise CorpusError("amf-sidecar replay of run %s failed: %s" % (run.id, p.stderr.strip()))
    lines = p.stdout.splitlines()
    hdr = lines[0].split(",")
    if hdr[1:] != list(FEATURES):
        raise CorpusError("amf-sidecar replay wrote columns %s, expected time + %s" % (hdr, FEATURES))
    X = np.array([[float(v) if v != "" else np.nan for v in ln.split(",")[1:]]
                  for ln in lines[1:]], dtype=np.float64)
    if len(X) != len(run.t):
        raise CorpusError("run %s: replay gave %d rows for %d samples" % (run.id, len(X), len(run.t)))
    return X


def model_inputs(X, used=USED):
    """Training/scoring inputs: the features not in used held at 0."""
    X = np.array(X, dtype=np.float64, copy=True)
    for i, f in enumerate(FEATURES):
        if f not in used:
            X[:, i] = 0.0
    return X


def raised(run, extra_bytes):
    """A copy of run beside a broker extra_bytes heavier: every memory reading
    that much higher, the limit, CPU and labels as they were. Its id says so."""
    r = Run("%s+%dMi" % (run.id, extra_bytes // 2**20), run.family)
    r.rows = [row[:2] + ["%d" % (int(float(row[2])) + extra_bytes)] + row[3:] for row in run.rows]
    r.t, r.ttf, r.since_onset, r.fault_from_s = run.t, run.ttf, run.since_onset, run.fault_from_s
    return r


def labels(run, horizon):
    """1 where the run's failure comes within horizon seconds."""
    ttf = run.ttf
    with np.errstate(invalid="ignore"):
        return ((ttf >= 0) & (ttf <= horizon)).astype(np.int64)


def make_hgbc(seed, monotonic=False):
    from sklearn.ensemble import HistGradientBoostingClassifier
    if monotonic:
        return HistGradientBoostingClassifier(random_state=seed, monotonic_cst=list(MONOTONIC_CST))
    return HistGradientBoostingClassifier(random_state=seed)


def training_mask(run, horizon=None, ceiling=None):
    """Which samples train: all of a healthy run; of a failing run only those
    after its load began. Before that, nothing distinguishes it from a healthy
    run's baseline (a failure nobody has started yet cannot be predicted), so
    labelling those samples either way would only teach noise.

    With a ceiling (bytes beside the broker's own memory, healthy_ceiling), a
    failing run's samples within horizon of the kill count only above it: the
    same argument, for the part of a fault that looks like a healthy load."""
    if not run.fails:
        return np.ones(len(run.t), dtype=bool)
    keep = run.in_fault()
    if ceiling is not None:
        with np.errstate(invalid="ignore"):
            near = (run.ttf >= 0) & (run.ttf <= horizon)
        keep = keep & ~(near & (memory_bytes(run) <= own_memory(run) + ceiling))
    return keep


def healthy_ceiling(runs):
    """The most memory any healthy run among runs holds beside the broker's own
    (bytes; 0 without a healthy run)."""
    return max((float(np.max(memory_bytes(r))) - own_memory(r) for r in runs if not r.fails), default=0.0)


def fit(runs, feats, horizon, seed, monotonic=False, label_rule="every", used=USED, headroom=0, heavier=None):
    """Trees trained on runs: (classifier, training rows, the ceiling the
    label rule used, None for "every"). With a headroom, the healthy runs'
    copies beside a broker that much heavier (heavier: bytes -> run id ->
    raised run, their features in feats) train too, and the ceiling rises by
    it."""
    if headroom and label_rule != "above-healthy":
        raise ValueError("a headroom needs the above-healthy label rule")
    ceiling = healthy_ceiling(runs) + headroom if label_rule == "above-healthy" else None
    if headroom:
        runs = runs + [heavier[headroom][r.id] for r in runs if not r.fails]
    masks = [training_mask(r, horizon, ceiling) for r in runs]
    X = np.vstack([model_inputs(feats[r.id], used)[m] for r, m in zip(runs, masks)])
    y = np.concatenate([labels(r, horizon)[m] for r, m in zip(runs, masks)])
    clf = make_hgbc(seed, monotonic)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.fit(X, y)
    return clf, len(y), ceiling


def decisions(p, t, debounce=DEBOUNCE, threshold=THRESHOLD):
    """The agent's decisions on one run's probabilities: the time of the
    debounce-th consecutive sample at or above threshold; after a decision a
    new one needs the streak to break first (one decision per episode)."""
    out, streak, fired = [], 0, False
    for pi, ti in zip(p, t):
        if pi >= threshold:
            streak += 1
            if streak == debounce and not fired:
                out.append(float(ti))
                fired = True
        else:
            streak, fired = 0, False
    return out


def evaluate_runs(runs, probs, horizon, gate_lead=GATE_LEAD_S, threshold=THRESHOLD):
    """Event and sample figures of per-run probabilities (dict run id -> array),
    anomalous at or above threshold (the predict_linear detector's is 1, the limit).

    - recall_at_gate: failing runs whose first timely decision (within the
      horizon of the failure) leaves at least gate_lead seconds;
    - lead times: failure - that decision, per failing run (None: none in time);
    - false alarms: decisions in healthy runs, and decisions in failing runs before
      the load began or more than horizon seconds before the failure; per hour of
      healthy runs;
    - quiet-start alarms: decisions before the run's load began, while the
      broker is quiet and the sidecar's windows fill (every run starts so: a
      fresh pod). Each is also counted as a false alarm above;
    - event precision: timely decisions / all decisions;
    - sample precision/recall at the threshold against the horizon labels.
    """
    fail_runs = [r for r in runs if r.fails]
    ok_runs = [r for r in runs if not r.fails]
    per_run, leads = [], []
    timely = early = healthy_alarms = quiet = 0
    tp = fp = fn = 0
    for r in runs:
        p = probs[r.id]
        y = labels(r, horizon)
        yhat = p >= threshold
        tp += int(np.sum(yhat & (y == 1)))
        fp += int(np.sum(yhat & (y == 0)))
        fn += int(np.sum(~yhat & (y == 1)))
        ds = decisions(p, r.t, threshold=threshold)
        fault_t = r.t[0] - r.since_onset[0] + r.fault_from_s
        q = sum(1 for d in ds if d < fault_t)
        quiet += q
        entry = {"run": r.id, "family": r.family, "fails": r.fails, "decisions": len(ds),
                 "quiet_start_alarms": q, "max_probability": float(np.max(p)) if len(p) else 0.0}
        if r.fails:
            ft = r.failure_time
            in_time = [d for d in ds if ft - d <= horizon and d >= fault_t]
            early += len(ds) - len(in_time)
            timely += 1 if in_time else 0
            lead = ft - in_time[0] if in_time else None
            entry["lead_s"] = None if lead is None else round(lead, 3)
            leads.append(lead)
        else:
            healthy_alarms += len(ds)
        per_run.append(entry)
    healthy_h = sum(r.duration_s() for r in ok_runs) / 3600.0
    got = [x for x in leads if x is not None]
    n_dec = timely + early + healthy_alarms  # repeats within the horizon are not counted
    return {
        "failing_runs": len(fail_runs),
        "healthy_runs": len(ok_runs),
        "healthy_hours": round(healthy_h, 4),
        "recall_at_gate": (sum(1 for x in got if x >= gate_lead) / len(fail_runs)) if fail_runs else None,
        "detected_before_failure": (len(got) / len(fail_runs)) if fail_runs else None,
        "lead_s": {"min": min(got) if got else None, "median": float(np.median(got)) if got else None,
                   "max": max(got) if got else None},
        "false_alarms": early + healthy_alarms,
        "false_alarms_healthy": healthy_alarms,
        "false_alarms_per_hour": (healthy_alarms / healthy_h) if healthy_h > 0 else None,
        "quiet_start_alarms": quiet,
        "event_precision": (timely / n_dec) if n_dec else None,
        "sample_precision": tp / (tp + fp) if tp + fp else None,
        "sample_recall": tp / (tp + fn) if tp + fn else None,
        "runs": per_run,
    }


def predict(clf, X, used=USED):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return clf.predict_proba(model_inputs(X, used))[:, 1]


def check_unused(clf, used=USED):
    """The trees never split on the features held constant in training."""
    for preds in clf._predictors:
        for pred in preds:
            for nd in pred.nodes:
                if not nd["is_leaf"] and FEATURES[int(nd["feature_idx"])] not in used:
                    raise AssertionError("a tree splits on %s" % FEATURES[int(nd["feature_idx"])])


def window_key(w):
    return "%s/%s/%s" % (w["rate_window"], w["deriv_window"], w["subquery_step"])


def select(cv):
    """The best candidate of a cross-validation table: most failing runs
    switched over in time minus false alarms (a missed failure is an outage, a
    false alarm a needless switchover: both count one), then fewer false alarms,
    then the longest median lead."""
    return min(cv, key=select_key)


def select_key(c):
    """select's order: smaller is better."""
    s = c["summary"]
    return (-(in_time_count(s) - s["false_alarms"]), s["false_alarms"], -(s["lead_s"]["median"] or 0.0))


def cross_validate(runs, feats, horizon, seed, monotonic=False, label_rule="every", used=USED,
                   headroom=0, heavier=None):
    """Leave one training family out: train on the others, score the left-out
    family's runs (and, with heavier, its healthy runs' copies beside a broker
    HEAVIER_BROKER_BYTES heavier); the per-run probabilities pooled over all folds (dict run
    id -> array), to be judged at each candidate threshold. A fold's ceiling
    (label_rule "above-healthy") is its training runs', so a left-out healthy
    family that holds more than the others counts against the rule."""
    fams = sorted({r.family for r in runs})
    probs = {}
    for fam in fams:
        tr = [r for r in runs if r.family != fam]
        te = [r for r in runs if r.family == fam]
        if heavier:
            te += [heavier[HEAVIER_BROKER_BYTES][r.id] for r in te if not r.fails]
        clf, _, _ = fit(tr, feats, horizon, seed, monotonic, label_rule, used, headroom, heavier)
        for r in te:
            probs[r.id] = predict(clf, feats[r.id], used)
    return probs


def in_time_count(s):
    """Failing runs switched over in time, from a summary."""
    return round((s["recall_at_gate"] or 0.0) * s["failing_runs"])


def rule_choice(test):
    """The choice of the lab's rule among the embedded detectors, from their
    held-out summaries (dict name -> evaluate_runs summary, the predict-linear
    one included). A default must not lose to predict_linear, the rule an
    operator writes instead, on either measure: failing runs switched over in
    time, and false alarms per healthy hour. Of those that do not, select's rule
    (the order of test breaks a tie: the current default first)."""
    base = test[PREDICT_LINEAR]

    def fa(s):
        return s["false_alarms_per_hour"] or 0.0

    verdicts = {}
    for name, s in test.items():
        why = []
        if in_time_count(s) < in_time_count(base):
            why.append("fewer runs in time (%d < %d)" % (in_time_count(s), in_time_count(base)))
        if fa(s) > fa(base):
            why.append("more false alarms per healthy hour (%.2f > %.2f)" % (fa(s), fa(base)))
        verdicts[name] = why
    eligible = [n for n in test if not verdicts[n]]
    best = select([{"name": n, "summary": test[n]} for n in eligible])["name"]
    return {"name": best, "eligible": eligible,
            "loses_to_predict_linear": {n: "; ".join(w) for n, w in verdicts.items() if w}}


def choose_default(test, catch, quiet_shipped, incumbent=INCUMBENT):
    """The default: the rule's choice (rule_choice) when it meets every goal
    (goals) on the held-out families; otherwise the incumbent, the paper's
    model. Replacing it changes what every pod without a --model runs, and a
    detector that meets the goals no better is not worth that: the report then
    says that no detector meets them.

    catch: the held-out failing runs' catchability; quiet_shipped: each
    detector's quiet-start alarms as shipped, on every run."""
    out = rule_choice(test)
    out["rule_choice"] = out["name"]
    out["goals"] = {n: goals(s, catch, quiet_shipped[n]) for n, s in test.items()}
    out["goals_met"] = {n: all(g["met"] for g in gs) for n, gs in out["goals"].items()}
    out["incumbent"] = incumbent
    if not out["goals_met"][out["rule_choice"]]:
        out["name"] = incumbent
    out["shipped_quiet_start_alarms"] = quiet_shipped
    return out


def memory_bytes(run):
    if run._memory is None or len(run._memory) != len(run.rows):
        run._memory = np.array([float(x[2]) for x in run.rows])
    return run._memory


def own_memory(run):
    """The broker's own memory: the median of the run's quiet part (its first
    sample when it has none)."""
    mem = memory_bytes(run)
    quiet = ~run.in_fault()
    return float(np.median(mem[quiet])) if quiet.any() else float(mem[0])


def catchability(run, interval_s=1.0):
    """Whether a failing run can be caught in time at all by a detector that
    stays quiet on what a healthy run holds. Healthy runs hold up to
    HEALTHY_CEILING_BYTES beside the broker's own memory, at any slope up to the
    failing ramps' (mem-high-hold, mem-sawtooth); below that ceiling a climb
    that will be killed looks like one that will stop, so a warning can only
    start once memory is above it and stays there until the kill. The gates
    need DEBOUNCE samples and GATE_LEAD_S after the first of them.

    Returns dict: catchable, above_s (seconds above the ceiling before the
    kill), ceiling (fraction of the limit), from_fraction (memory before the
    kill, fraction of the limit), reason."""
    mem = memory_bytes(run)
    limit = float(run.rows[0][3])
    ceiling = HEALTHY_CEILING_BYTES + own_memory(run)
    i = len(mem)
    while i > 0 and mem[i - 1] > ceiling:
        i -= 1
    above_s = 0.0 if i == len(mem) else float(run.failure_time - run.t[i])
    need = DEBOUNCE * interval_s + GATE_LEAD_S
    out = {"catchable": bool(above_s >= need), "above_s": round(above_s, 1), "ceiling": round(ceiling / limit, 4),
           "from_fraction": round(float(mem[-1]) / limit, 4)}
    if out["catchable"]:
        out["reason"] = "above what a healthy run holds for %.0f s before the kill" % above_s
    elif above_s == 0.0:
        out["reason"] = ("killed from %.0f %% of the limit, under what a healthy run holds: "
                         "a step past the limit, no warning possible" % (100 * out["from_fraction"]))
    else:
        out["reason"] = ("above what a healthy run holds only %.1f s before the kill; the gates need %.0f s"
                         % (above_s, need))
    return out


def caught_in_time(s, catch):
    """(switched over in time, can be caught) among a summary's failing runs."""
    can = [e for e in s["runs"] if e["fails"] and catch[e["run"]]["catchable"]]
    return sum(1 for e in can if e.get("lead_s") is not None and e["lead_s"] >= GATE_LEAD_S), len(can)


def goals(s, catch, quiet_all):
    """The default's goals on the held-out families, from its summary s, the
    catchability of their failing runs (dict run id -> catchability) and the
    quiet-start alarms of the shipped detector on every run of the corpus."""
    got, can = caught_in_time(s, catch)
    per_day = (s["false_alarms_per_hour"] or 0.0) * 24.0
    return [
        {"goal": "in time on >= %.0f %% of the failing runs that can be caught" % (100 * GOAL_IN_TIME),
         "value": "%d/%d" % (got, can), "met": can > 0 and bool(got >= GOAL_IN_TIME * can)},
        {"goal": "<= %.0f false alarm per pod-day of healthy runs" % GOAL_ALARMS_PER_POD_DAY,
         "value": "%.1f (%d in %.1f h)" % (per_day, s["false_alarms_healthy"], s["healthy_hours"]),
         "met": bool(per_day <= GOAL_ALARMS_PER_POD_DAY)},
        {"goal": "no alarm while a fresh sidecar's windows fill (quiet starts; held out / shipped, every run)",
         "value": "%d / %d" % (s["quiet_start_alarms"], quiet_all),
         "met": bool(s["quiet_start_alarms"] == 0 and quiet_all == 0)},
    ]


# The embedded models' manifests, by name (infer/model/embedded.go).
PREDICT_LINEAR = "predict-linear"
MANIFESTS = {"p1": "p1_manifest.json", "leadtime": "leadtime_manifest.json",
             PREDICT_LINEAR: "predict-linear_manifest.json"}


def embedded_manifest(name):
    """The embedded detector's manifest (infer/model), as a dict."""
    with open(os.path.join(REPO_ROOT, "infer", "model", MANIFESTS[name]), encoding="utf-8") as f:
        return json.load(f)


def embedded_probabilities(runs, name, sidecar=SIDECAR):
    """An embedded model on the runs as the sidecar runs it: features replayed
    with its manifest's windows, its normalisation (P1's is /0.5), scored by
    `amf-sidecar score --model name` (dict run id -> probabilities)."""
    man = embedded_manifest(name)
    if man["model_format"] == "predict-linear-v1":
        import amfpredictlinear  # here: it imports this module
        return amfpredictlinear.sidecar_scores(runs, name, sidecar)
    fw = man["feature_windows"]
    windows = {k: fw[k] for k in ("rate_window", "deriv_window", "subquery_step", "lookback")}
    norm = man["normalisation"]
    out = {}
    for r in runs:
        X = replay_features(r, windows, sidecar)
        X[:, 0] /= norm["cpu_reference_fraction"]
        X[:, 4] /= norm["cpu_reference_fraction"]
        X[:, 1] /= norm["memory_reference_fraction"]
        X[:, 5] /= norm["memory_reference_fraction"]
        out[r.id] = score_features(X, sidecar, model=name)
    return out


def score_features(X, sidecar=SIDECAR, model="p1"):
    """Probabilities of an embedded model (or a model file) on feature rows,
    computed by `amf-sidecar score --model model`."""
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(",".join(FEATURES) + "\n")
        for row in X:
            f.write(",".join("" if math.isnan(v) else repr(float(v)) for v in row) + "\n")
        name = f.name
    try:
        p = subprocess.run([sidecar, "score", "--model", model, "--in", name], capture_output=True, text=True)
    finally:
        os.unlink(name)
    if p.returncode != 0:
        raise CorpusError("amf-sidecar score --model %s failed: %s" % (model, p.stderr.strip()))
    rows = list(csv.reader(io.StringIO(p.stdout)))
    pi = rows[0].index("probability")
    return np.array([float(x[pi]) for x in rows[1:]])


# ---------------------------------------------------------------------------
# the `leadtime` command

def _fmt(x, nd=2):
    return "–" if x is None else ("%.*f" % (nd, x))


def _summary_row(name, s):
    lead = s["lead_s"]
    return "| %s | %d/%d | %s | %s / %s / %s | %d | %s | %d | %s | %s / %s |" % (
        name, in_time_count(s), s["failing_runs"],
        _fmt(s["detected_before_failure"]), _fmt(lead["min"], 1), _fmt(lead["median"], 1),
        _fmt(lead["max"], 1), s["false_alarms"], _fmt(s["false_alarms_per_hour"], 2),
        s["quiet_start_alarms"], _fmt(s["event_precision"]), _fmt(s["sample_precision"]),
        _fmt(s["sample_recall"]))


SUMMARY_HEAD = ("| model | failing runs switched over in time | detected before failure | "
                "lead time min / median / max (s) | false alarms | per healthy hour | "
                "of them at a quiet start | event precision | sample precision / recall |\n"
                "|---|---|---|---|---|---|---|---|---|")


def stale_binary(sidecar):
    """Raise CorpusError when the sidecar binary is older than an embedded
    model's files: it scores with the models it was built with, not the ones
    a training run has written since."""
    if not os.access(sidecar, os.X_OK):
        raise CorpusError("%s is not an executable: build it with `make build`" % sidecar)
    built = os.path.getmtime(sidecar)
    for man in MANIFESTS.values():
        for name in (man, man.replace("_manifest.json", "_model.txt")):
            path = os.path.join(REPO_ROOT, "infer", "model", name)
            if os.path.isfile(path) and os.path.getmtime(path) > built:
                raise CorpusError("%s is older than %s: it embeds the models it was built with; "
                                  "rebuild it with `make build`" % (sidecar, os.path.relpath(path, REPO_ROOT)))


def check(args):
    """amftrain.py check: the embedded detectors as shipped, scored by the
    sidecar, on a recorded corpus (any amf-lab corpus folder, such as a
    healthy soak recorded after training): one summary row each, judged with
    each detector's own threshold and the horizon given. Nothing is trained
    or written. Prints a Markdown table; returns the exit code."""
    stale_binary(args.sidecar)
    runs = load_corpus(args.corpus)
    print("Corpus: `%s` (sha256 %.12s…), %d runs (%d failing), %.2f healthy hours; judged with H %.0f s." % (
        os.path.join(args.corpus, CORPUS_FILE), corpus_sha256(args.corpus), len(runs),
        sum(1 for r in runs if r.fails), sum(r.duration_s() for r in runs if not r.fails) / 3600.0, args.horizon))
    print("")
    print(SUMMARY_HEAD)
    for name in MANIFESTS:
        thr = float(embedded_manifest(name)["threshold"])
        s = evaluate_runs(runs, embedded_probabilities(runs, name, args.sidecar), args.horizon, threshold=thr)
        print(_summary_row("%s (threshold %.1f)" % (name, thr), s))
    return 0


def render_report(rep):
    L = []
    a = L.append
    a("# The lead-time model, P1 and predict_linear: evaluation on the lab corpus")
    a("")
    a("Written by `/usr/bin/python3 infer/train/amftrain.py leadtime` (do not edit by hand).")
    a("Corpus: `%s` (sha256 %.12s…), %d runs, %d samples: %s." % (
        rep["corpus"]["path"], rep["corpus"]["sha256"], rep["corpus"]["runs"],
        rep["corpus"]["samples"], ", ".join("%s %d" % kv for kv in rep["corpus"]["families"].items())))
    a("")
    a("**What is predicted.** A sample is labelled 1 when the container fails (OOM kill) "
      "within the horizon H. **How it is judged.** As the agent acts: a decision is the "
      "%d-th consecutive sample with probability ≥ %.1f; a failing run counts as switched "
      "over in time when its first decision within H of the failure comes at least %.0f s "
      "before it (hold %.0f s + 1 s; the lab measures decision → primary retired at 15.1 s). "
      "A decision in a healthy run, before a failing run's load began, or more than H "
      "before the failure, is a false alarm. Every run starts with a quiet broker for "
      "0–10 min (its lead-in), so the windows of a fresh sidecar fill in every run: a "
      "decision there is a *quiet-start* alarm. Network and disk are held at 0 in "
      "training (the network counter is the pod's own, but no train family varies it; "
      "blkio counts nothing here), so no tree splits on them." % (
          DEBOUNCE, THRESHOLD, GATE_LEAD_S, HOLD_S))
    a("")
    a("**Regime split.** Train families: %s. Test families (never seen in training or "
      "selection): %s." % (", ".join(TRAIN_FAMILIES), ", ".join(TEST_FAMILIES)))
    a("")
    a("## Choosing windows and horizon (leave-one-family-out on the train families)")
    a("")
    nfam = len(rep["split"]["train"])
    a("Each row: HGBC (seed %d, with or without monotonic constraints: the risk does not "
      "fall as memory or its growth rises) trained on %d train families, scored on the "
      "left-out one, pooled over the %d folds, judged at the model's own threshold (the "
      "sidecar reports a sample anomalous at or above it). Chosen: most runs switched "
      "over in time minus false alarms (an outage and a needless switchover count one "
      "each), then fewer false alarms, then the longest median lead. Samples of failing "
      "runs taken before their load began are left out of training (nothing tells them "
      "from a healthy baseline); a decision there is a false alarm." % (rep["seed"], nfam - 1, nfam))
    a("")
    a("**Labels.** *every*: each sample of a failing run within H of its kill is a failure. "
      "*above healthy*: only those with more memory beside the broker's own than any healthy "
      "run of the fold's training families holds (its ceiling); the others are left out of "
      "training, as the quiet baseline is. Under that ceiling a climb that will be killed "
      "looks like a healthy one that will stop — a mem-step plateau one step before its kill "
      "is a healthy hold — and calling it a failure teaches the trees to alarm on healthy "
      "runs. A left-out healthy family that holds more than the fold's others counts against "
      "the rule, so the table judges it honestly.")
    a("")
    hv = rep["heavier_broker_bytes"] // 2**20
    a("**A heavier broker.** A broker may hold more memory of its own than any in the "
      "corpus did (the first healthy soak's held 6.0–9.8 Mi, and the trees alarmed beside "
      "one of 8.3 Mi; every training run's 6.0–7.4 Mi), and "
      "the trees see memory as a share of the limit. So every left-out healthy run is "
      "also scored beside a broker %d Mi heavier (the same counters with %d Mi more "
      "memory; each training run's broker + %d Mi spans 8.0–9.4 Mi): the column *beside a "
      "heavier broker* counts its false alarms. It is shown, not selected on: the top of "
      "the healthy range is taught by one train family (mem-sawtooth), so in its own fold "
      "its heavier copies lie above every healthy sample the trees saw, an extrapolation "
      "the folds cannot support (DESIGN.md, \"A heavier broker\"). *Headroom k Mi*: the "
      "training healthy runs are also taught beside a broker k Mi heavier, and failures "
      "are labelled only above the ceiling + k Mi. **Features**: *memory+cpu* splits on "
      "CPU and memory and their growth; *memory* on memory and its growth only (every "
      "failure of the corpus is an OOM kill)." % (hv, hv, hv))
    a("")
    a("%d candidates; the table shows the %d best by the rule and the best of each "
      "features × labels × headroom (all rows: `leadtime.json`)." % (len(rep["cross_validation"]), CV_SHOWN))
    a("")
    a("| windows (rate / deriv / step) | H (s) | features | labels | headroom | monotonic | threshold | in time | detected | lead min / median / max (s) | false alarms | per healthy hour | beside a heavier broker |")
    a("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ch = rep["chosen"]
    keys = ("windows", "horizon_s", "features", "labels", "headroom_bytes", "monotonic", "threshold")
    for c in cv_shown(rep["cross_validation"]):
        s = c["summary"]
        mark = " **(chosen)**" if all(c[k] == ch[k] for k in keys) else ""
        a("| %s%s | %.0f | %s | %s | %d Mi | %s | %.1f | %d/%d | %d/%d | %s / %s / %s | %d | %s | %d |" % (
            window_key(c["windows"]), mark, c["horizon_s"], c["features"], c["labels"].replace("-", " "),
            c["headroom_bytes"] // 2**20, "yes" if c["monotonic"] else "no", c["threshold"],
            in_time_count(s), s["failing_runs"],
            round((s["detected_before_failure"] or 0) * s["failing_runs"]), s["failing_runs"],
            _fmt(s["lead_s"]["min"], 1), _fmt(s["lead_s"]["median"], 1), _fmt(s["lead_s"]["max"], 1),
            s["false_alarms"], _fmt(s["false_alarms_per_hour"], 1), c["heavier_broker_false_alarms"]))
    pl = rep["predict_linear"]
    for c in pl["cross_validation"]:
        s = c["summary"]
        mark = " **(chosen)**" if c["window"] == pl["chosen"]["window"] and c["horizon_s"] == pl["chosen"]["horizon_s"] else ""
        a("| predict_linear, W %s%s | %.0f | memory | – | – | – | the limit | %d/%d | %d/%d | %s / %s / %s | %d | %s | %d |" % (
            c["window"], mark, c["horizon_s"],
            in_time_count(s), s["failing_runs"],
            round((s["detected_before_failure"] or 0) * s["failing_runs"]), s["failing_runs"],
            _fmt(s["lead_s"]["min"], 1), _fmt(s["lead_s"]["median"], 1), _fmt(s["lead_s"]["max"], 1),
            s["false_alarms"], _fmt(s["false_alarms_per_hour"], 1), c["heavier_broker_false_alarms"]))
    a("")
    a("The predict_linear rows are the rule an operator writes instead of a model, "
      "`%s` with W and H as in the row, through the same gates (score f / (1 + f) with f the "
      "projection as a fraction of the limit, so 0.5, the gates' threshold, is the limit). Nothing is fitted, so each left-out family's "
      "scores do not depend on the other folds: the pooled folds are the rule on every "
      "train run, and W, H are chosen by the same rule as the trees'." % pl["expr_template"])
    a("")
    a("## Held-out test families")
    a("")
    a("Lead-time model: windows %s, H %.0f s, features %s, %s, %s, threshold %.1f, trained on "
      "the train families only. P1: the "
      "embedded paper model as the sidecar runs it (5m/10m/5s, normalisation /0.5). "
      "predict_linear: `%s` (W, H chosen on the train families), scored by the sidecar "
      "(`amf-sidecar replay --model` then `score --model` on the shipped files). All "
      "judged with H %.0f s." % (
          window_key(ch["windows"]), ch["horizon_s"], ch["features"], _labels_phrase(ch, "train"),
          "monotonic" if ch["monotonic"] else "not monotonic", ch["threshold"], pl["expr"], ch["horizon_s"]))
    a("")
    a(SUMMARY_HEAD)
    a(_summary_row("lead-time (test families)", rep["test"]["leadtime"]))
    a(_summary_row("P1 (test families)", rep["test"]["p1"]))
    a(_summary_row("predict_linear (test families)", rep["test"]["predict_linear"]))
    a(_summary_row("P1 (all families)", rep["p1_all"]))
    a(_summary_row("predict_linear (all families)", pl["all"]))
    a("")
    a("The held-out healthy runs again, beside a broker %d Mi heavier (not a goal; the "
      "failure a healthy soak showed):" % hv)
    a("")
    a(SUMMARY_HEAD)
    for key, label in (("leadtime", "lead-time"), ("p1", "P1"), ("predict_linear", "predict_linear")):
        a(_summary_row("%s (test healthy runs, broker %d Mi heavier)" % (label, hv), rep["test_heavier"][key]))
    a("")
    a("Per run (test families; predict_linear's max score is f / (1 + f), f the projection as a fraction of the limit):")
    a("")
    a("| run | fails | lead-time model: lead (s) / decisions / max p | P1: lead (s) / decisions / max p | predict_linear: lead (s) / decisions / max score |")
    a("|---|---|---|---|---|")
    p1 = {e["run"]: e for e in rep["test"]["p1"]["runs"]}
    plr = {e["run"]: e for e in rep["test"]["predict_linear"]["runs"]}
    for e in rep["test"]["leadtime"]["runs"]:
        q, z = p1[e["run"]], plr[e["run"]]
        a("| %s | %s | %s / %d / %.3f | %s / %d / %.3f | %s / %d / %.3f |" % (
            e["run"], "yes" if e["fails"] else "no", _fmt(e.get("lead_s"), 1), e["decisions"],
            e["max_probability"], _fmt(q.get("lead_s"), 1), q["decisions"], q["max_probability"],
            _fmt(z.get("lead_s"), 1), z["decisions"], z["max_probability"]))
    a("")
    a("## Which held-out failing runs can be caught")
    a("")
    a("Healthy families hold up to %d Mi beside the broker's own memory (mem-high-hold, "
      "mem-sawtooth), climbing there as steeply as the failing ramps. Below that ceiling "
      "a climb that will be killed looks, sample for sample, like one that will stop: a "
      "detector that must stay quiet on healthy runs can start warning only once memory "
      "is above it for good. A run can be caught when that is at least %.0f s before the "
      "kill (%d samples of debounce + the %.0f s gate lead). The others are the crash "
      "failover's: the agent fails over at once on the kill." % (
          HEALTHY_CEILING_BYTES // 2**20, DEBOUNCE + GATE_LEAD_S, DEBOUNCE, GATE_LEAD_S))
    a("")
    a("| run | ceiling (of the limit) | above it before the kill | can be caught | why |")
    a("|---|---|---|---|---|")
    for rid, c in sorted(rep["catchability"].items()):
        a("| %s | %.0f %% | %.1f s | %s | %s |" % (rid, 100 * c["ceiling"], c["above_s"],
                                                "yes" if c["catchable"] else "no", c["reason"]))
    a("")
    d = rep["default"]
    a("## The default")
    a("")
    a("A default must not lose to predict_linear on the held-out families on either "
      "measure (failing runs switched over in time; false alarms per healthy hour); of "
      "those that do not, the selection rule above. The rule's choice is the default "
      "only if it meets every goal below; otherwise the default is the paper's model "
      "(`%s`): a detector that meets them no better is not worth changing what every "
      "pod without a `--model` runs." % d["incumbent"])
    a("")
    if d["name"] == d["rule_choice"]:
        a("**The default is `%s`**, the rule's choice, meeting every goal "
          "(`infer/model.DefaultName`; a Go test holds it to this report)." % d["name"])
    else:
        a("**No detector meets the goals.** The rule chooses `%s`, which does not meet "
          "them either, so the default stays `%s` (`infer/model.DefaultName`; a Go test "
          "holds it to this report)." % (d["rule_choice"], d["name"]))
    a("")
    a("| detector | in time (held out) | in time, of those that can be caught | false alarms per healthy hour | per pod-day | quiet-start alarms held out / shipped, every run | goals met | verdict |")
    a("|---|---|---|---|---|---|---|---|")
    names = {"p1": "P1", "leadtime": "lead-time", PREDICT_LINEAR: "predict_linear"}
    tests = {"p1": rep["test"]["p1"], "leadtime": rep["test"]["leadtime"], PREDICT_LINEAR: rep["test"]["predict_linear"]}
    for n, s in tests.items():
        got, can = caught_in_time(s, rep["catchability"])
        verdict = ("loses to predict_linear: " + d["loses_to_predict_linear"][n]
                   if n in d["loses_to_predict_linear"] else
                   "the rule's choice" if n == d["rule_choice"] else "does not lose, not chosen")
        if n == d["name"]:
            verdict = "**the default**; " + verdict
        a("| %s | %d/%d | %d/%d | %s | %s | %d / %d | %d of %d | %s |" % (
            names[n], in_time_count(s), s["failing_runs"], got, can, _fmt(s["false_alarms_per_hour"], 2),
            _fmt((s["false_alarms_per_hour"] or 0) * 24, 1), s["quiet_start_alarms"],
            d["shipped_quiet_start_alarms"][n], sum(1 for g in d["goals"][n] if g["met"]), len(d["goals"][n]),
            verdict))
    a("")
    a("The goals (held-out families):")
    a("")
    a("| goal | %s |" % " | ".join(names[n] for n in tests))
    a("|---|%s" % ("---|" * len(tests)))
    for i, g in enumerate(d["goals"][d["name"]]):
        a("| %s | %s |" % (g["goal"], " | ".join(
            ("%s" if d["goals"][n][i]["met"] else "%s (**not met**)") % d["goals"][n][i]["value"] for n in tests)))
    a("")
    a("## The shipped model")
    a("")
    sh = rep["shipped"]
    a("Trained on all %d families (%d samples) with the chosen windows, horizon and labels "
      "(%s): `infer/model/leadtime_model.txt` (%d trees, sha256 %.12s…) and its manifest; "
      "parity golden `infer/model/testdata/parity_leadtime.csv`. Its figures on the "
      "corpus it was trained on (not a test, shown to compare with P1 on the same runs):" % (
          len(rep["corpus"]["families"]), sh["training_rows"], _labels_phrase(rep["chosen"], "shipped"),
          sh["trees"], sh["sha256"]))
    a("")
    a(SUMMARY_HEAD)
    a(_summary_row("lead-time (shipped, all families)", sh["summary"]))
    a(_summary_row("P1 (all families)", rep["p1_all"]))
    a(_summary_row("predict_linear (shipped, all families)", pl["all"]))
    a("")
    a("The shipped predict_linear detector is the rule chosen on the train families "
      "(nothing to refit): `infer/model/predict-linear_model.txt` (its PromQL line, "
      "sha256 %.12s…) and its manifest." % pl["sha256"])
    a("")
    return "\n".join(L) + "\n"


CV_SHOWN = 20


def cv_shown(cv):
    """The rows of the cross-validation table the report shows: the CV_SHOWN
    best by select's rule, then the best of each features x labels x
    headroom not among them, in the rule's order."""
    order = sorted(range(len(cv)), key=lambda i: select_key(cv[i]))
    keep = order[:CV_SHOWN]
    seen = {(cv[i]["features"], cv[i]["labels"], cv[i]["headroom_bytes"]) for i in keep}
    for i in order:
        g = (cv[i]["features"], cv[i]["labels"], cv[i]["headroom_bytes"])
        if g not in seen:
            seen.add(g)
            keep.append(i)
    return [cv[i] for i in sorted(keep, key=lambda i: select_key(cv[i]))]


def _labels_phrase(ch, which):
    """How the chosen model's labels were made, for the report."""
    c = ch["ceiling_bytes"][which]
    if c is None:
        return "every sample within H of a kill a failure"
    hr = ch.get("headroom_bytes", 0)
    if hr:
        return ("failures labelled only above %.1f Mi beside the broker's own memory (its training runs' "
                "healthy ceiling + %d Mi), the healthy runs also taught beside a broker %d Mi heavier" % (
                    c / 2**20, hr // 2**20, hr // 2**20))
    return "failures labelled only above %.1f Mi beside the broker's own memory (its training runs' healthy ceiling)" % (c / 2**20)


def predict_linear_section(runs, train, test, h, args, log, heavier):
    """The predict_linear detector: W, H chosen on the train families,
    shipped to args.out_dir, then scored by the sidecar on the shipped files;
    test figures judged with the trees' horizon h."""
    import amfpredictlinear as pl  # here: it imports this module
    cv = pl.cross_validate(train, args.sidecar, log,
                           [heavier[HEAVIER_BROKER_BYTES][r.id] for r in train if not r.fails])
    best = select(cv)
    w, ph = best["window"], best["horizon_s"]
    probe = {r.id: pl.scores(pl.replay_projection(r, w, ph, args.sidecar)) for r in test}
    val = evaluate_runs(test, probe, ph, threshold=pl.THRESHOLD)
    man = pl.write_detector(args.out_dir, w, ph, corpus_sha256(args.corpus),
                            {"test_rows": int(sum(len(r.t) for r in test)),
                             "precision": val["sample_precision"] or 0.0,
                             "recall": val["sample_recall"] or 0.0, "threshold": pl.THRESHOLD})
    test_heavier = [heavier[HEAVIER_BROKER_BYTES][r.id] for r in test if not r.fails]
    got = pl.detector_scores(runs + test_heavier, args.out_dir, args.sidecar)
    # The shipped files, scored by the sidecar, are the rule evaluated here.
    for r in test:
        if not np.array_equal(got[r.id], probe[r.id]):
            raise CorpusError("run %s: the shipped predict_linear detector scores differ from its replayed projection" % r.id)
    return {"cross_validation": cv, "chosen": {"window": w, "horizon_s": ph},
            "expr": pl.expr(w, ph), "expr_template": pl.expr("W", 0).replace("[W], 0)", "[W], H)"),
            "sha256": man["model_sha256"],
            "test": evaluate_runs(test, {r.id: got[r.id] for r in test}, h, threshold=pl.THRESHOLD),
            "test_heavier": evaluate_runs(test_heavier, {r.id: got[r.id] for r in test_heavier}, h,
                                          threshold=pl.THRESHOLD),
            "all": evaluate_runs(runs, {r.id: got[r.id] for r in runs}, h, threshold=pl.THRESHOLD)}


def run(args, sklearn_version, write_golden, crafted_rows):
    """amftrain.py leadtime: cross-validate windows x horizons, test on the
    held-out families, compare with P1, ship the chosen model."""
    runs = load_corpus(args.corpus)
    fams = {}
    for r in runs:
        fams[r.family] = fams.get(r.family, 0) + 1
    log = (lambda s: print(s, flush=True)) if args.verbose else (lambda s: None)
    windows = [dict(w, sample_interval=SAMPLE_INTERVAL) for w in WINDOW_CANDIDATES]
    # Every healthy run beside a heavier broker, by each amount used.
    heavier = {k: {r.id: raised(r, k) for r in runs if not r.fails}
               for k in sorted(set(HEADROOMS) | {HEAVIER_BROKER_BYTES}) if k}
    copies = [c for by in heavier.values() for c in by.values()]
    feats = {}
    for w in windows:
        k = window_key(w)
        feats[k] = {r.id: replay_features(r, w, args.sidecar) for r in runs + copies}
        log("features %s: %d runs, %d beside a heavier broker" % (k, len(runs), len(copies)))
    train = [r for r in runs if r.family in TRAIN_FAMILIES]
    test = [r for r in runs if r.family in TEST_FAMILIES]
    if not train or not test:
        raise CorpusError("the corpus needs runs of both train (%s) and test (%s) families"
                          % (", ".join(TRAIN_FAMILIES), ", ".join(TEST_FAMILIES)))
    train_heavier = [heavier[HEAVIER_BROKER_BYTES][r.id] for r in train if not r.fails]
    cv = []
    variants = [(rule, hr) for rule in LABEL_RULES for hr in HEADROOMS if not hr or rule == "above-healthy"]
    for w in windows:
        for h in HORIZONS:
            for fs, used in FEATURE_SETS:
                for rule, hr in variants:
                    for mono in MONOTONIC:
                        probs = cross_validate(train, feats[window_key(w)], h, args.seed, mono, rule, used,
                                               hr, heavier)
                        for thr in THRESHOLDS:
                            s = evaluate_runs(train, probs, h, threshold=thr)
                            hv = evaluate_runs(train_heavier, probs, h, threshold=thr)
                            cv.append({"windows": w, "horizon_s": h, "features": fs, "labels": rule,
                                       "headroom_bytes": hr, "monotonic": mono, "threshold": thr, "summary": s,
                                       "heavier_broker_false_alarms": hv["false_alarms_healthy"]})
                            log("cv %s H=%.0f %s labels=%s headroom=%d monotonic=%s threshold=%.1f: in time %s, "
                                "FA %d (heavier broker %d), lead median %s" % (
                                    window_key(w), h, fs, rule, hr, mono, thr, s["recall_at_gate"],
                                    s["false_alarms"], hv["false_alarms_healthy"], s["lead_s"]["median"]))
    best = select(cv)
    w, h, fs, rule, hr, mono, thr = (best["windows"], best["horizon_s"], best["features"], best["labels"],
                                     best["headroom_bytes"], best["monotonic"], best["threshold"])
    used = dict(FEATURE_SETS)[fs]
    F = feats[window_key(w)]
    clf, _, train_ceiling = fit(train, F, h, args.seed, mono, rule, used, hr, heavier)
    lt_test = evaluate_runs(test, {r.id: predict(clf, F[r.id], used) for r in test}, h, threshold=thr)
    # The held-out healthy runs beside a heavier broker: not a goal of the
    # issue's, but the failure a healthy soak showed.
    test_heavier = [heavier[HEAVIER_BROKER_BYTES][r.id] for r in test if not r.fails]
    lt_heavier = evaluate_runs(test_heavier, {r.id: predict(clf, F[r.id], used) for r in test_heavier}, h,
                               threshold=thr)
    p1 = embedded_probabilities(runs + test_heavier, "p1", args.sidecar)
    p1_test = evaluate_runs(test, {r.id: p1[r.id] for r in test}, h)
    p1_heavier = evaluate_runs(test_heavier, {r.id: p1[r.id] for r in test_heavier}, h)
    p1_all = evaluate_runs(runs, p1, h)
    # The shipped model sees every family.
    final, n, ceiling = fit(runs, F, h, args.seed, mono, rule, used, hr, heavier)
    check_unused(final, used)
    shipped = evaluate_runs(runs, {r.id: predict(final, F[r.id], used) for r in runs}, h, threshold=thr)
    os.makedirs(args.out_dir, exist_ok=True)
    mp = os.path.join(args.out_dir, "leadtime_model.txt")
    jp = os.path.join(args.out_dir, "leadtime_manifest.json")
    test_rows = sum(len(r.t) for r in test)
    man = amfexport.write_model(
        mp, jp, final, FEATURES,
        protocol="lab-leadtime H=%.0fs features %s%s%s%s" % (
            h, fs, " monotonic" if mono else "",
            "" if ceiling is None else " labels above %.1f Mi beside the broker" % (ceiling / 2**20),
            " healthy runs also beside a broker %d Mi heavier" % (hr // 2**20) if hr else ""),
        seed=args.seed, training_rows=n,
        sklearn_version=sklearn_version, feature_windows=w, threshold=thr,
        normalisation={"cpu_reference_fraction": 1.0, "memory_reference_fraction": 1.0},
        dataset={"name": DATASET_NAME, "authors": ["the AMF project"], "url": DATASET_URL,
                 "files_sha256": {CORPUS_FILE: corpus_sha256(args.corpus)}},
        extra={"validation": {"test_rows": test_rows,
                              "precision": lt_test["sample_precision"] or 0.0,
                              "recall": lt_test["sample_recall"] or 0.0,
                              "threshold": thr},
               "trained_by": "infer/train/amftrain.py leadtime"})
    # Parity golden: rows of every run as the sidecar computes them (network
    # included: the model must ignore it), plus crafted NaN / threshold rows.
    rng = np.random.default_rng(args.seed)
    allX = np.vstack([F[r.id] for r in runs])
    src_all = ["%s_t%d" % (r.id, i) for r in runs for i in range(len(r.t))]
    idx = np.sort(rng.choice(len(allX), size=min(400, len(allX)), replace=False))
    X = [allX[i] for i in idx]
    src = [src_all[i] for i in idx]
    cr, cs = crafted_rows(final, allX[idx], rng)
    gp = os.path.join(args.out_dir, "testdata", "parity_leadtime.csv")
    write_golden(gp, final, X + cr, src + cs)
    # Explanation golden: the same rows' Saabas attribution from sklearn's arrays.
    ep = os.path.join(args.out_dir, "testdata", "explain_leadtime.csv")
    amfexplain.write_golden(ep, final, X + cr, src + cs)
    pl = predict_linear_section(runs, train, test, h, args, log, heavier)
    held_out = {"p1": p1_test, "leadtime": lt_test, PREDICT_LINEAR: pl["test"]}
    catch = {r.id: catchability(r) for r in test if r.fails}
    shipped_quiet = {"p1": p1_all["quiet_start_alarms"], "leadtime": shipped["quiet_start_alarms"],
                     PREDICT_LINEAR: pl["all"]["quiet_start_alarms"]}
    default = choose_default(held_out, catch, shipped_quiet)
    rep = {
        "schema_version": 1,
        "tool": "infer/train/amftrain.py leadtime",
        "sklearn_version": sklearn_version,
        "seed": args.seed,
        "corpus": {"path": os.path.relpath(os.path.join(args.corpus or CORPUS_DIR, CORPUS_FILE), REPO_ROOT),
                   "sha256": corpus_sha256(args.corpus), "runs": len(runs),
                   "samples": int(sum(len(r.t) for r in runs)), "families": fams},
        "gates": {"debounce": DEBOUNCE, "threshold": THRESHOLD, "hold_s": HOLD_S,
                  "gate_lead_s": GATE_LEAD_S},
        "split": {"train": list(TRAIN_FAMILIES), "test": list(TEST_FAMILIES)},
        "cross_validation": cv,
        "heavier_broker_bytes": HEAVIER_BROKER_BYTES,
        "chosen": {"windows": w, "horizon_s": h, "features": fs, "labels": rule, "headroom_bytes": hr,
                   "monotonic": mono, "threshold": thr,
                   "ceiling_bytes": {"train": train_ceiling, "shipped": ceiling}},
        "test": {"leadtime": lt_test, "p1": p1_test},
        "test_heavier": {"leadtime": lt_heavier, "p1": p1_heavier},
        "catchability": catch,
        "default": default,
        "p1_all": p1_all,
        "shipped": {"trees": int(final.n_iter_), "training_rows": n, "sha256": man["model_sha256"],
                    "summary": shipped},
        "predict_linear": pl,
    }
    rep["test"]["predict_linear"] = pl.pop("test")
    rep["test_heavier"]["predict_linear"] = pl.pop("test_heavier")
    # Every candidate's per-run figures would make the JSON 6 MB; selection and
    # the tables read the summaries.
    for c in rep["cross_validation"] + rep["predict_linear"]["cross_validation"]:
        c["summary"] = {k: v for k, v in c["summary"].items() if k != "runs"}
    os.makedirs(args.report, exist_ok=True)
    with open(os.path.join(args.report, "leadtime.json"), "w", encoding="utf-8") as f:
        json.dump(rep, f, indent=1)
        f.write("\n")
    with open(os.path.join(args.report, "leadtime.md"), "w", encoding="utf-8") as f:
        f.write(render_report(rep))
    print("leadtime: chose windows %s, H %.0f s, features %s, headroom %d Mi; test families: %s in time, "
          "%s false alarms/h; P1 on them: %s in time, %s false alarms/h" % (
              window_key(w), h, fs, hr // 2**20, _fmt(lt_test["recall_at_gate"]), _fmt(lt_test["false_alarms_per_hour"], 1),
              _fmt(p1_test["recall_at_gate"]), _fmt(p1_test["false_alarms_per_hour"], 1)))
    print("predict_linear: chose W %s, H %.0f s; test families: %s in time, %s false alarms/h" % (
        pl["chosen"]["window"], pl["chosen"]["horizon_s"], _fmt(rep["test"]["predict_linear"]["recall_at_gate"]),
        _fmt(rep["test"]["predict_linear"]["false_alarms_per_hour"], 1)))
    print("wrote %s (%d trees, sha256 %s), %s, %s, %s/leadtime.{md,json}" % (
        os.path.relpath(mp), final.n_iter_, man["model_sha256"], os.path.relpath(jp),
        os.path.relpath(gp), os.path.relpath(args.report)))
    return 0
