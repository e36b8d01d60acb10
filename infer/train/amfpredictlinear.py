"""The predict_linear detector: the alert an operator writes instead of a model.

    predict_linear(memory_bytes[W], H) / memory_limit_bytes * 100 >= 100

a straight line through the last W of memory, alarming when it meets the limit
within H. It is judged exactly as the lead-time model is (amfleadtime): its W and
H are chosen on the train families with the same selection rule, it is tested
once on the held-out families through the same gates (debounce, gate lead), and
it is shipped as an embedded detector (infer/model/linear.go,
``--model predict-linear``) whose files this module writes.

Its score goes through the gates as a probability would (the agent compares it
with 0.5, the signal carries it in [0, 1]): with f the projection as a fraction
of the limit, clamped at 0, the score is f / (1 + f), 0.5 exactly at the limit,
and the threshold 0.5 is the user's ``> limit``. The projection is computed by the sidecar
itself (``amf-sidecar replay --predict-window W --predict-horizon H``), with
PromQL's semantics (checked against Prometheus in infer/promqlparity).

Leave-one-family-out for a rule: nothing is fitted, so the score of a left-out
family's run does not depend on the other families and the pooled folds are the
rule on every train run. Selection over (W, H) is the trees' (amfleadtime.select).
CPU is not projected: no run of the corpus fails on CPU (the kill is an OOM
kill, and a CPU limit throttles rather than kills), so a CPU line can only add
false alarms.
"""

import csv
import io
import json
import os
import shutil
import subprocess
import tempfile

import numpy as np

import amfexport
import amfleadtime as lt
from amfdata import FEATURES

NAME = "predict-linear"
MODEL_FILE = NAME + "_model.txt"
MANIFEST_FILE = NAME + "_manifest.json"
FORMAT = "predict-linear-v1"
OBJECTIVE = "f = predict_linear(memory_bytes[W], H) / memory_limit_bytes; score f/(1+f) >= threshold"
PROJECTION = "memory_percent_projected"  # infer.ProjectionName

# W from a few samples' worth to the deriv window of P1; H the label horizons
# of the trees, so both are judged on the same horizons.
WINDOWS = ("30s", "1m", "2m", "5m", "10m")
HORIZONS = lt.HORIZONS
THRESHOLD = 0.5


def _go_float(x):
    """strconv.FormatFloat(x, 'f', -1, 64) for the values used here."""
    s = repr(float(x))
    return s[:-2] if s.endswith(".0") else s


def expr(window, horizon_s, threshold=THRESHOLD):
    """The rule as PromQL, as the Go loader renders it (linearRule.Expr): it
    alarms at the fraction f of the limit with f / (1 + f) = threshold."""
    return "predict_linear(memory_bytes[%s], %s) / memory_limit_bytes * 100 >= %s" % (
        window, _go_float(horizon_s), _go_float(threshold / (1 - threshold) * 100))


def scores(projected):
    """The rule's score of each sample, f / (1 + f) with f the projection as a
    fraction of the limit clamped at 0; 0 where it is undefined (an alert whose
    expression returns nothing does not fire)."""
    p = np.asarray(projected, dtype=np.float64)
    f = np.maximum(np.where(np.isnan(p), 0.0, p / 100.0), 0.0)
    return f / (1.0 + f)


def _parse_replay(text, what):
    lines = text.splitlines()
    hdr = lines[0].split(",")
    if hdr[-1] != PROJECTION or hdr[1:-1] != list(FEATURES):
        raise lt.CorpusError("%s wrote columns %s, expected time + %s + %s" % (what, hdr, FEATURES, PROJECTION))
    return lines, np.array([float(ln.rsplit(",", 1)[1] or "nan") for ln in lines[1:]])


def replay_projection(run, window, horizon_s, sidecar=lt.SIDECAR):
    """The projection at each of the run's samples, by `amf-sidecar replay`."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(lt.RAW_COLUMNS)
    w.writerows(run.rows)
    cmd = [sidecar, "replay", "--in", "-", "--predict-window", window,
           "--predict-horizon", "%ss" % _go_float(horizon_s)]
    p = subprocess.run(cmd, input=buf.getvalue(), capture_output=True, text=True)
    if p.returncode != 0:
        raise lt.CorpusError("amf-sidecar replay of run %s failed: %s" % (run.id, p.stderr.strip()))
    _, proj = _parse_replay(p.stdout, "amf-sidecar replay")
    if len(proj) != len(run.t):
        raise lt.CorpusError("run %s: replay gave %d rows for %d samples" % (run.id, len(proj), len(run.t)))
    return proj


def cross_validate(train, sidecar, log, heavier=()):
    """Every (W, H) on the train families, with H as the label horizon (as
    each tree candidate is); and the false alarms on heavier, their healthy
    runs beside a heavier broker (shown, not selected on, as the trees')."""
    cv = []
    for w in WINDOWS:
        for h in HORIZONS:
            probs = {r.id: scores(replay_projection(r, w, h, sidecar)) for r in list(train) + list(heavier)}
            s = lt.evaluate_runs(train, probs, h, threshold=THRESHOLD)
            hv = lt.evaluate_runs(heavier, probs, h, threshold=THRESHOLD)
            cv.append({"window": w, "horizon_s": h, "summary": s,
                       "heavier_broker_false_alarms": hv["false_alarms_healthy"]})
            log("cv predict_linear[%s] H=%.0f: in time %s, FA/h %s" % (
                w, h, s["recall_at_gate"], s["false_alarms_per_hour"]))
    return cv


def write_detector(out_dir, window, horizon_s, corpus_sha256, validation):
    """Write the embedded detector's model file (its PromQL line) and manifest;
    return the manifest."""
    text = (expr(window, horizon_s) + "\n").encode("ascii")
    man = {
        "schema_version": amfexport.MANIFEST_SCHEMA_VERSION,
        "model_format": FORMAT,
        "model_sha256": amfexport.sha256_bytes(text),
        "objective": OBJECTIVE,
        "feature_names": list(FEATURES),
        "threshold": THRESHOLD,
        "protocol": "lab-leadtime predict_linear W=%s H=%.0fs" % (window, horizon_s),
        "seed": 0,
        "training_rows": 0,
        # The six features are still computed (status, metrics) with P1's
        # windows; the rule reads only the projection.
        "feature_windows": dict(lt.P1_WINDOWS, sample_interval=lt.SAMPLE_INTERVAL),
        "normalisation": {"cpu_reference_fraction": 1.0, "memory_reference_fraction": 1.0},
        "dataset": {"name": lt.DATASET_NAME, "authors": ["the AMF project"], "url": lt.DATASET_URL,
                    "files_sha256": {lt.CORPUS_FILE: corpus_sha256}},
        "validation": validation,
        "trained_by": "infer/train/amftrain.py leadtime (W, H chosen on the train families; nothing fitted)",
        "predict_linear": {"window": window, "horizon": "%ss" % _go_float(horizon_s)},
    }
    amfexport.check_feature_windows(man["feature_windows"])
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, MODEL_FILE), "wb") as f:
        f.write(text)
    with open(os.path.join(out_dir, MANIFEST_FILE), "w", encoding="utf-8") as f:
        json.dump(man, f, indent=2)
        f.write("\n")
    return man


def detector_scores(runs, out_dir, sidecar=lt.SIDECAR):
    """The written detector on the runs as the sidecar runs it, on exactly the
    files shipped to out_dir (dict run id -> scores)."""
    with tempfile.TemporaryDirectory() as d:
        # The loader's file rule: NAME.txt beside NAME.manifest.json.
        path = os.path.join(d, NAME + ".txt")
        shutil.copyfile(os.path.join(out_dir, MODEL_FILE), path)
        shutil.copyfile(os.path.join(out_dir, MANIFEST_FILE), os.path.join(d, NAME + ".manifest.json"))
        return sidecar_scores(runs, path, sidecar)


def sidecar_scores(runs, path, sidecar=lt.SIDECAR):
    """The detector path (a model file, or the embedded name) on the runs:
    `amf-sidecar replay --model` (its manifest's projection) piped to
    `amf-sidecar score --model`, so the figures are the Go loader's and rule's
    (dict run id -> scores)."""
    out = {}
    for r in runs:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(lt.RAW_COLUMNS)
        w.writerows(r.rows)
        p = subprocess.run([sidecar, "replay", "--in", "-", "--model", path],
                           input=buf.getvalue(), capture_output=True, text=True)
        if p.returncode != 0:
            raise lt.CorpusError("amf-sidecar replay --model %s of run %s failed: %s" % (path, r.id, p.stderr.strip()))
        _parse_replay(p.stdout, "amf-sidecar replay --model")
        q = subprocess.run([sidecar, "score", "--model", path, "--in", "-"],
                           input=p.stdout, capture_output=True, text=True)
        if q.returncode != 0:
            raise lt.CorpusError("amf-sidecar score --model %s failed: %s" % (path, q.stderr.strip()))
        rows = list(csv.reader(io.StringIO(q.stdout)))
        pi = rows[0].index("probability")
        out[r.id] = np.array([float(x[pi]) for x in rows[1:]])
        if len(out[r.id]) != len(r.t):
            raise lt.CorpusError("run %s: score gave %d rows for %d samples" % (r.id, len(out[r.id]), len(r.t)))
    return out

