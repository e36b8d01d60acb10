"""Young windows: the models on runs whose feature windows are full.

Every run of the lab corpus (``lab/corpus/data``) starts 30–60 s before its
load, so the 5-minute rate and the 10-minute deriv are never full in it: the
lead-time model is trained and tested on young windows only, while a sidecar
that has run for a while computes full ones. ``amf-lab corpus --lead-in 10m``
records the same seeded runs with ten more minutes of quiet broker first
(``lab/corpus/lead-in``). This command scores both recordings of each run, as
the agent would act on them, with

- the P1 model and the shipped lead-time model (embedded, scored by
  ``amf-sidecar score`` on features from ``amf-sidecar replay`` with each
  model's manifest windows and normalisation), and
- the lead-time model trained on the train families only (the held-out model
  of the lead-time report; the compared runs are of test families), and, when
  the lead-in corpus also holds runs of train families, the same model trained
  on their lead-in recordings too (windows of every age in training),

and reports, per run: decisions while the lead-in fills the windows (a quiet
broker: every one is a false alarm), and from the end of the lead-in on (the
planned run itself) beside the same run recorded without the lead-in.
"""

import json
import os

import numpy as np

import amfleadtime as lt
from amfdata import REPO_ROOT

LEAD_IN_DIR = os.path.join(REPO_ROOT, "lab", "corpus", "lead-in")
# What-if warm-ups: the sidecar would not act on its score for this long after
# its first sample (a crash is still failed over at once).
WARM_UPS_S = (60.0, 300.0)


def segments(run, probs, lead_in_s, horizon):
    """One run's decisions split at the end of its lead-in (lead_in_s seconds
    after the onset; None for a run recorded without one).

    Returns a dict: lead_in (decisions and max p before that point: all false
    alarms), and run (after it): decisions, max p and, for a failing run, the
    lead of the first decision within the horizon of the failure and after the
    load began (None: none), and the false decisions (the others)."""
    t, so, p = run.t, run.since_onset, probs
    ds = lt.decisions(p, t)
    # A run without a lead-in is all run, also the samples before its onset.
    split_t = -np.inf if lead_in_s is None else t[0] - so[0] + lead_in_s
    before = [d for d in ds if d < split_t]
    after = [d for d in ds if d >= split_t]
    pre, post = p[t < split_t], p[t >= split_t]
    seg = {"lead_in": {"decisions": len(before), "max_probability": float(np.max(pre)) if len(pre) else None},
           "run": {"decisions": len(after), "max_probability": float(np.max(post)) if len(post) else None}}
    if run.fails:
        fault_t = t[0] - so[0] + run.fault_from_s
        ft = run.failure_time
        timely = [d for d in after if ft - d <= horizon and d >= fault_t]
        seg["run"]["lead_s"] = round(float(ft - timely[0]), 3) if timely else None
        seg["run"]["in_time"] = bool(timely and ft - timely[0] >= lt.GATE_LEAD_S)
        seg["run"]["false_decisions"] = len(after) - len(timely)
    else:
        seg["run"]["false_decisions"] = len(after)
    return seg


def warm(run, p, warm_up_s):
    """p as the agent would see it from a sidecar with a warm-up: no sample
    counts as anomalous before warm_up_s seconds after the run's first."""
    q = np.array(p, dtype=np.float64, copy=True)
    q[run.t < run.t[0] + warm_up_s] = 0.0
    return q


def lead_in_s(folder, runs):
    """Each run's lead-in in seconds, from runs.json's lead_in (0 when absent)."""
    path = os.path.join(folder, "runs.json")
    with open(path, encoding="utf-8") as f:
        metas = json.load(f)
    out = {r.id: 0.0 for r in runs}
    for m in metas:
        if m.get("id") in out and m.get("lead_in"):
            out[m["id"]] = lt.baseline_s(m["lead_in"])
    return out


def summarise(entries):
    """Totals over runs of one model on one recording."""
    fails = [e for e in entries if e["fails"]]
    ok = [e for e in entries if not e["fails"]]
    return {
        "failing_runs": len(fails),
        "in_time": sum(1 for e in fails if e["run"]["in_time"]),
        "lead_s": sorted(e["run"]["lead_s"] for e in fails if e["run"]["lead_s"] is not None),
        "healthy_runs": len(ok),
        "false_alarms_lead_in": sum(e["lead_in"]["decisions"] for e in entries),
        "false_alarms_run": sum(e["run"]["false_decisions"] for e in entries),
        "false_alarms_run_healthy": sum(e["run"]["false_decisions"] for e in ok),
    }


def render(rep):
    L = []
    a = L.append
    a("# Young windows: the models on runs with full feature windows")
    a("")
    a("Written by `/usr/bin/python3 infer/train/amftrain.py window-age` (do not edit by hand).")
    a("Lead-in corpus: `%s` (sha256 %.12s…), %d runs, each recorded with %s of quiet broker "
      "before its planned baseline; compared with the same runs (same seeds) in `%s`." % (
          rep["lead_in_corpus"]["path"], rep["lead_in_corpus"]["sha256"], rep["lead_in_corpus"]["runs"],
          ", ".join(sorted(set(rep["lead_in_corpus"]["lead_in"]))), rep["corpus"]["path"]))
    if rep["lead_in_corpus"].get("train_family_runs"):
        a("")
        a("Its %d runs of train families only train the last model below." % rep["lead_in_corpus"]["train_family_runs"])
    a("")
    a("Decisions as the agent makes them (%d consecutive samples ≥ %.1f). **During the lead-in** "
      "the broker is idle while its 5m/10m windows fill: every decision is a false alarm. "
      "**Run** is the planned run (baseline, then load), which the main corpus holds with young "
      "windows and the lead-in corpus with full ones. A failing run is in time when its first "
      "decision within %.0f s of the OOM kill, after the load began, leaves ≥ %.0f s." % (
          lt.DEBOUNCE, lt.THRESHOLD, rep["horizon_s"], lt.GATE_LEAD_S))
    a("")
    a("| model | recording | failing runs in time | lead (s) | false alarms during the lead-in | false alarms in the run (healthy runs) |")
    a("|---|---|---|---|---|---|")
    for m in rep["models"]:
        for rec in ("young", "full"):
            s = rep["summary"][m][rec]
            a("| %s | %s | %d/%d | %s | %s | %d (%d) |" % (
                m, "without lead-in (young windows)" if rec == "young" else "with lead-in (full windows)",
                s["in_time"], s["failing_runs"], ", ".join(lt._fmt(x, 1) for x in s["lead_s"]) or "–",
                "–" if rec == "young" else str(s["false_alarms_lead_in"]),
                s["false_alarms_run"], s["false_alarms_run_healthy"]))
    a("")
    if rep["lead_in_train_runs"]:
        a("The last model is the held-out one trained also on the lead-in recordings of "
          "train-family runs (%s): it sees windows of every age, quiet ones included." % (
              ", ".join(rep["lead_in_train_runs"])))
        a("")
    a("The held-out models on all of the main corpus's test-family runs (%s; young "
      "windows; the first row is the lead-time report's held-out figure):" % ", ".join(lt.TEST_FAMILIES))
    a("")
    a("| model | failing runs in time | lead min / median / max (s) | false alarms | per healthy hour |")
    a("|---|---|---|---|---|")
    for m, e in rep["main_test"].items():
        a("| %s | %d/%d | %s / %s / %s | %d | %s |" % (
            m, round((e["recall_at_gate"] or 0) * e["failing_runs"]), e["failing_runs"],
            lt._fmt(e["lead_s"]["min"], 1), lt._fmt(e["lead_s"]["median"], 1), lt._fmt(e["lead_s"]["max"], 1),
            e["false_alarms"], lt._fmt(e["false_alarms_per_hour"], 1)))
    a("")
    a("## With a warm-up")
    a("")
    a("What if the sidecar did not act on its score for the first W after it started "
      "(its windows are then at least W old; the recordings start with the sidecar). "
      "W = 0 is the table above.")
    a("")
    a("| model | warm-up | young windows: in time / false alarms | full windows: in time / false alarms in the run / during the lead-in |")
    a("|---|---|---|---|")
    for m in rep["models"]:
        for wu in ["0"] + sorted(rep["warm_up"], key=float):
            ss = rep["summary"][m] if wu == "0" else rep["warm_up"][wu][m]
            y, fu = ss["young"], ss["full"]
            a("| %s | %g s | %d/%d / %d | %d/%d / %d / %d |" % (
                m, float(wu), y["in_time"], y["failing_runs"], y["false_alarms_run"],
                fu["in_time"], fu["failing_runs"], fu["false_alarms_run"], fu["false_alarms_lead_in"]))
    a("")
    a("Per run: decisions in the run / max probability (lead s when a failing run is caught in "
      "time); with the lead-in, decisions during it first.")
    a("")
    a("| run | fails | " + " | ".join("%s young | %s full" % (m, m) for m in rep["models"]) + " |")
    a("|---|---|" + "---|---|" * len(rep["models"]))
    for rid in rep["run_ids"]:
        cells = []
        fails = None
        for m in rep["models"]:
            for rec in ("young", "full"):
                e = rep["runs"][m][rec][rid]
                fails = e["fails"]
                c = "%d / %.3f" % (e["run"]["decisions"], e["run"]["max_probability"] or 0.0)
                if e["fails"] and e["run"]["lead_s"] is not None:
                    c += " (%s s)" % lt._fmt(e["run"]["lead_s"], 1)
                if rec == "full":
                    c = "%d, %s" % (e["lead_in"]["decisions"], c)
                cells.append(c)
        a("| %s | %s | %s |" % (rid, "yes" if fails else "no", " | ".join(cells)))
    a("")
    return "\n".join(L) + "\n"


def run(args):
    """amftrain.py window-age: score both recordings of the lead-in corpus's runs."""
    folder = args.lead_in or LEAD_IN_DIR
    recorded = lt.load_corpus(folder)
    li = lead_in_s(folder, recorded)
    if not all(li.values()):
        raise lt.CorpusError("%s: runs %s were recorded without a lead-in (runs.json lead_in); record "
                             "them with `bin/amf-lab corpus --lead-in 10m ...`" % (
                                 folder, ", ".join(k for k, v in li.items() if not v)))
    main = lt.load_corpus(args.corpus)
    by_id = {r.id: r for r in main}
    missing = [r.id for r in recorded if r.id not in by_id]
    if missing:
        raise lt.CorpusError("runs %s of the lead-in corpus are not in the main corpus: record them "
                             "with the main corpus's seed" % ", ".join(missing))
    # Runs of test families are compared; those of train families (if any)
    # only train a further held-out model, which sees windows of every age.
    full = [r for r in recorded if r.family not in lt.TRAIN_FAMILIES]
    lead_train = [r for r in recorded if r.family in lt.TRAIN_FAMILIES]
    if not full:
        raise lt.CorpusError("%s has no run of a test family (%s) to compare" % (folder, ", ".join(lt.TEST_FAMILIES)))
    young = [by_id[r.id] for r in full]
    with open(os.path.join(lt.REPO_ROOT, "infer", "train", "report", "leadtime.json"), encoding="utf-8") as f:
        chosen = json.load(f)["chosen"]
    w, h = chosen["windows"], chosen["horizon_s"]
    probs = {"young": {}, "full": {}}
    for name in ("p1", "leadtime", "predict-linear"):
        probs["young"][name] = lt.embedded_probabilities(young, name, args.sidecar)
        probs["full"][name] = lt.embedded_probabilities(full, name, args.sidecar)
    # The held-out lead-time models, refitted (deterministic): the report's,
    # and, when there are train-family lead-in runs, one trained with them too.
    # Each run's features are replayed once.
    for r in lead_train:
        r.id = "lead-in/" + r.id  # beside the same run of the main corpus
    train = [r for r in main if r.family in lt.TRAIN_FAMILIES]
    test_main = [r for r in main if r.family in lt.TEST_FAMILIES]  # young is among them
    fm = {r.id: lt.replay_features(r, w, args.sidecar) for r in train + test_main}
    fl = {r.id: lt.replay_features(r, w, args.sidecar) for r in full + lead_train}
    models = ["p1", "leadtime", "predict-linear"]
    main_test = {}
    held_out = [("leadtime (train families)", train)]
    if lead_train:
        held_out.append(("leadtime (train families + their lead-ins)", train + lead_train))
    for name, runs in held_out:
        clf, _ = lt.fit(runs, {r.id: fl[r.id] if r in lead_train else fm[r.id] for r in runs}, h, args.seed)
        probs["young"][name] = {r.id: lt.predict(clf, fm[r.id]) for r in young}
        probs["full"][name] = {r.id: lt.predict(clf, fl[r.id]) for r in full}
        main_test[name] = lt.evaluate_runs(test_main, {r.id: lt.predict(clf, fm[r.id]) for r in test_main}, h)
        models.append(name)
    rep = {"schema_version": 1, "tool": "infer/train/amftrain.py window-age", "horizon_s": h,
           "windows": w, "seed": args.seed, "models": models, "run_ids": [r.id for r in full],
           "corpus": {"path": os.path.relpath(os.path.join(args.corpus or lt.CORPUS_DIR, lt.CORPUS_FILE), REPO_ROOT),
                      "sha256": lt.corpus_sha256(args.corpus)},
           "lead_in_corpus": {"path": os.path.relpath(os.path.join(folder, lt.CORPUS_FILE), REPO_ROOT),
                              "sha256": lt.corpus_sha256(folder), "runs": len(full),
                              "train_family_runs": len(lead_train),
                              "lead_in": sorted({"%gs" % v for v in li.values()})},
           "lead_in_train_runs": sorted(r.id for r in lead_train),
           "main_test": {m: {k: v for k, v in e.items() if k != "runs"} for m, e in main_test.items()},
           "runs": {}, "summary": {}, "warm_up": {}}
    for m in models:
        rep["runs"][m] = {"young": {}, "full": {}}
        rep["summary"][m] = {}
        for rec, rs, lin in (("young", young, lambda r: None), ("full", full, lambda r: li[r.id])):
            for r in rs:
                e = segments(r, probs[rec][m][r.id], lin(r), h)
                e["fails"] = bool(r.fails)
                rep["runs"][m][rec][r.id] = e
            rep["summary"][m][rec] = summarise(list(rep["runs"][m][rec].values()))
            for wu in WARM_UPS_S:
                per = rep["warm_up"].setdefault("%g" % wu, {}).setdefault(m, {})
                es = []
                for r in rs:
                    e = segments(r, warm(r, probs[rec][m][r.id], wu), lin(r), h)
                    e["fails"] = bool(r.fails)
                    es.append(e)
                per[rec] = summarise(es)
    os.makedirs(args.report, exist_ok=True)
    with open(os.path.join(args.report, "window-age.json"), "w", encoding="utf-8") as f:
        json.dump(rep, f, indent=1)
        f.write("\n")
    with open(os.path.join(args.report, "window-age.md"), "w", encoding="utf-8") as f:
        f.write(render(rep))
    for m in models:
        y, fu = rep["summary"][m]["young"], rep["summary"][m]["full"]
        print("window-age %s: young windows %d/%d in time, %d false alarms; full windows %d/%d in time, "
              "%d false alarms in the run, %d during the lead-in" % (
                  m, y["in_time"], y["failing_runs"], y["false_alarms_run"], fu["in_time"], fu["failing_runs"],
                  fu["false_alarms_run"], fu["false_alarms_lead_in"]))
    print("wrote %s/window-age.{md,json}" % os.path.relpath(args.report))
    return 0

