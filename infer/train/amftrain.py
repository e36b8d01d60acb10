#!/usr/bin/python3
"""AMF offline training, evaluation and export (issue 3).

Run with Debian's interpreter, which is the one that has scikit-learn:

    /usr/bin/python3 infer/train/amftrain.py evaluate      # report under infer/train/report/
    /usr/bin/python3 infer/train/amftrain.py model         # embedded default model + parity golden
    /usr/bin/python3 infer/train/amftrain.py split --train A.csv --test B.csv
    /usr/bin/python3 infer/train/amftrain.py --train A.csv --test B.csv   # same as split
    /usr/bin/python3 infer/train/amftrain.py export --protocol P1 --seed 42 --out m.txt
    /usr/bin/python3 infer/train/amftrain.py test-exporter --out DIR
    /usr/bin/python3 infer/train/amftrain.py label-rule
    /usr/bin/python3 infer/train/amftrain.py leadtime      # lead-time model + the default, from lab/corpus/real-node
    /usr/bin/python3 infer/train/amftrain.py check --corpus DIR  # the embedded detectors on another recorded corpus

Data: the ToD-K8s-OOD dataset by H. Siddiqui and F. Khendek (CC BY 4.0),
https://github.com/hassaanas/k8s-dataset-tod . It is not in this repository:
pass its data folder with --data DIR (default ../shared/data/tod-k8s-ood/data
relative to the repository root, when present).
"""

import argparse
import json
import math
import os
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

try:
    import sklearn  # noqa: E402
    from sklearn.ensemble import (HistGradientBoostingClassifier,  # noqa: E402
                                  RandomForestClassifier)
    from sklearn.linear_model import LogisticRegression  # noqa: E402
    from sklearn.metrics import precision_score, recall_score  # noqa: E402
    from sklearn.model_selection import train_test_split  # noqa: E402
    from sklearn.pipeline import make_pipeline  # noqa: E402
    from sklearn.preprocessing import StandardScaler  # noqa: E402
except ImportError as e:  # pragma: no cover
    sys.exit("amftrain: scikit-learn is not importable by %s (%s). Use Debian's "
             "/usr/bin/python3 with the python3-sklearn package "
             "(apt-get install -y python3-sklearn)." % (sys.executable, e))

import amfdata  # noqa: E402
import amfexplain  # noqa: E402
import amfexport  # noqa: E402
import amfleadtime  # noqa: E402
from amfdata import FEATURES, DataError  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT_DIR = os.path.join(HERE, "report")
MODEL_DIR = os.path.join(amfdata.REPO_ROOT, "infer", "model")
SEEDS = (42, 43, 44, 45, 46)
PROTOCOLS = ("P0", "P1", "P2")
MODELS = ("hgbc", "rf", "lr")
MODEL_TITLES = {
    "hgbc": "HistGradientBoostingClassifier",
    "rf": "RandomForestClassifier",
    "lr": "LogisticRegression",
}
MODEL_PARAMS = {
    "hgbc": "HistGradientBoostingClassifier(random_state=seed), all other parameters "
            "default (so early stopping is on: > 10,000 training rows)",
    "rf": "RandomForestClassifier(n_estimators=100, random_state=seed, n_jobs=2), "
          "other parameters default",
    "lr": "make_pipeline(StandardScaler(), LogisticRegression(C=1.0, solver='lbfgs', "
          "max_iter=1000)); lbfgs is deterministic, so the seed only changes the split",
}
# The paper's Table 7 (precision, recall); None where the paper gives no figure.
PAPER = {
    ("P0", "hgbc"): (0.995, 0.996),
    ("P1", "hgbc"): (0.991, 0.989),
    ("P2", "hgbc"): (1.000, 0.465),
    ("P2", "rf"): (1.000, 0.353),
    ("P2", "lr"): (0.403, 0.947),
}
PROTOCOL_TEXT = {
    "P0": "pooled D_nominal + D_stressed, train_test_split(test_size=0.3, "
          "stratify=y, shuffle=True, random_state=seed)",
    "P1": "train on D_nominal + train_test_split(D_stressed, train_size=0.3, "
          "stratify=y, random_state=seed)[0]; test on the other 70 % of D_stressed",
    "P2": "train on D_nominal, test on D_stressed",
}


def make_model(name, seed):
    if name == "hgbc":
        return HistGradientBoostingClassifier(random_state=seed)
    if name == "rf":
        return RandomForestClassifier(n_estimators=100, random_state=seed, n_jobs=2)
    if name == "lr":
        return make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=1000))
    raise ValueError("unknown model %r (want one of %s)" % (name, ", ".join(MODELS)))


def concat(a, b):
    f = amfdata.Frame.__new__(amfdata.Frame)
    f.path, f.header = None, a.header
    f.rows = a.rows + b.rows
    f.X = np.vstack([a.X, b.X])
    f.y = np.concatenate([a.y, b.y])
    f.node = np.concatenate([a.node, b.node])
    f.pod = np.concatenate([a.pod, b.pod])
    f.group = np.concatenate([a.group, b.group])
    return f


def complete_rows(frame):
    return frame.subset(frame.complete())


def protocol_split(protocol, nominal, stressed, seed):
    """Return (train, test) Frames of complete rows for a protocol and seed."""
    nominal, stressed = complete_rows(nominal), complete_rows(stressed)
    if protocol == "P0":
        pooled = concat(nominal, stressed)
        tr, te = train_test_split(np.arange(len(pooled)), test_size=0.3,
                                  stratify=pooled.y, shuffle=True, random_state=seed)
        return pooled.subset(tr), pooled.subset(te)
    if protocol == "P1":
        tr, te = train_test_split(np.arange(len(stressed)), train_size=0.3,
                                  stratify=stressed.y, random_state=seed)
        return concat(nominal, stressed.subset(tr)), stressed.subset(te)
    if protocol == "P2":
        return nominal, stressed
    raise ValueError("unknown protocol %r" % protocol)


def fit(name, seed, train):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make_model(name, seed).fit(train.X, train.y)


def prec_rec(y, p):
    return (float(precision_score(y, p, zero_division=0)),
            float(recall_score(y, p, zero_division=0)))


def mean_std(v):
    a = np.asarray(v, dtype=float)
    return {"mean": float(a.mean()), "std": float(a.std()), "per_seed": [float(x) for x in a]}


# ---------------------------------------------------------------------------
# label rule

def label_rule(nominal, stressed):
    out = {}
    for name, f in (("D_nominal.csv", nominal), ("D_stressed.csv", stressed)):
        cpu, mem = f.X[:, 0], f.X[:, 1]
        both = ~np.isnan(cpu) & ~np.isnan(mem)
        rule = ((cpu >= 80) | (mem >= 80)).astype(int)
        mism = both & (rule != f.y)
        lacking = ~both
        out[name] = {
            "rows": int(len(f)),
            "rows_with_cpu_and_memory": int(both.sum()),
            "mismatches": int(mism.sum()),
            "rows_lacking_cpu_or_memory": int(lacking.sum()),
            "labelled_1_among_lacking": int(f.y[lacking].sum()),
            "labelled_1": int(f.y.sum()),
            "rows_with_any_empty_feature": int((~f.complete()).sum()),
        }
    out["total_rows_checked"] = sum(v["rows_with_cpu_and_memory"] for v in out.values())
    out["total_mismatches"] = sum(v["mismatches"] for k, v in out.items()
                                  if isinstance(v, dict))
    return out


# ---------------------------------------------------------------------------
# evaluate

def evaluate(nominal, stressed, seeds=SEEDS, models=MODELS, protocols=PROTOCOLS, log=None):
    res = {p: {m: {"precision": [], "recall": []} for m in models} for p in protocols}
    pods = {p: {} for p in protocols}
    sizes = {}
    for p in protocols:
        for seed in seeds:
            train, test = protocol_split(p, nominal, stressed, seed)
            sizes[p] = {"train_rows": len(train), "test_rows": len(test),
                        "test_positives": int(test.y.sum())}
            for m in models:
                clf = fit(m, seed, train)
                pred = clf.predict(test.X)
                pr, rc = prec_rec(test.y, pred)
                res[p][m]["precision"].append(pr)
                res[p][m]["recall"].append(rc)
                if log:
                    log("%s %s seed %d: precision %.4f recall %.4f" % (p, m, seed, pr, rc))
                if m == "hgbc":
                    for g in sorted(set(test.group)):
                        sel = (test.group == g) & (test.y == 1)
                        d = pods[p].setdefault(g, {"recall": [], "positives": []})
                        d["positives"].append(int(sel.sum()))
                        d["recall"].append(float((pred[sel] == 1).mean()) if sel.any() else None)
    table = {}
    for p in protocols:
        table[p] = {}
        for m in models:
            table[p][m] = {
                "precision": mean_std(res[p][m]["precision"]),
                "recall": mean_std(res[p][m]["recall"]),
                "paper": (dict(zip(("precision", "recall"), PAPER[(p, m)]))
                          if (p, m) in PAPER else None),
            }
    per_pod = {}
    for p in protocols:
        per_pod[p] = {}
        for g, d in sorted(pods[p].items()):
            vals = [v for v in d["recall"] if v is not None]
            per_pod[p][g] = {
                "positives_mean": float(np.mean(d["positives"])),
                "recall": mean_std(vals) if vals else None,
            }
    return {"table": table, "per_pod_recall_hgbc": per_pod, "sizes": sizes}


def lr_sensitivity(nominal, stressed):
    """P2 for a few LogisticRegression variants (none reproduces .403/.947)."""
    from sklearn.preprocessing import MinMaxScaler
    train, test = protocol_split("P2", nominal, stressed, 42)
    variants = [
        ("LogisticRegression() on raw features (lbfgs, max_iter=100)",
         lambda: LogisticRegression()),
        ("StandardScaler + LR(C=1) [used in the table]",
         lambda: make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))),
        ("StandardScaler + LR(C=0.1)",
         lambda: make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=1000))),
        ("StandardScaler + LR(C=100)",
         lambda: make_pipeline(StandardScaler(), LogisticRegression(C=100, max_iter=1000))),
        ("StandardScaler + LR(class_weight='balanced')",
         lambda: make_pipeline(StandardScaler(),
                               LogisticRegression(class_weight="balanced", max_iter=1000))),
        ("MinMaxScaler + LR(C=1)",
         lambda: make_pipeline(MinMaxScaler(), LogisticRegression(max_iter=1000))),
    ]
    out = []
    for name, mk in variants:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pred = mk().fit(train.X, train.y).predict(test.X)
        pr, rc = prec_rec(test.y, pred)
        out.append({"variant": name, "precision": pr, "recall": rc})
    return out


def _f(x):
    return "%.3f" % x


def _ms(d):
    return "%.3f ± %.3f" % (d["mean"], d["std"])


def render_markdown(rep):
    L = []
    a = L.append
    a("# AMF detector: validation against the paper's Table 7")
    a("")
    a("Generated by `/usr/bin/python3 infer/train/amftrain.py evaluate` (`make evaluate`). "
      "Do not edit by hand.")
    a("")
    a("Data: **%s**, by %s, licensed %s (%s). Not part of this repository." % (
        amfdata.DATASET_NAME, " and ".join(amfdata.DATASET_AUTHORS),
        amfdata.DATASET_LICENCE, amfdata.DATASET_URL))
    a("")
    a("| file | sha256 |")
    a("|---|---|")
    for k, v in rep["dataset_sha256"].items():
        a("| `%s` | `%s` |" % (k, v))
    a("")
    a("scikit-learn %s, numpy %s. Rows with any empty feature are dropped (D_nominal: %d, "
      "D_stressed: %d dropped). Seeds %s; figures are mean ± standard deviation over the "
      "seeds (population std, ddof=0)." % (
          rep["sklearn_version"], rep["numpy_version"],
          rep["dropped_rows"]["D_nominal.csv"], rep["dropped_rows"]["D_stressed.csv"],
          ", ".join(str(s) for s in rep["seeds"])))
    a("")
    a("## Protocols")
    a("")
    for p in PROTOCOLS:
        s = rep["evaluation"]["sizes"][p]
        a("- **%s**: %s. Train %d rows, test %d rows (%d anomalous)." % (
            p, PROTOCOL_TEXT[p], s["train_rows"], s["test_rows"], s["test_positives"]))
    a("")
    a("## Models")
    a("")
    for m in MODELS:
        a("- **%s**: `%s`" % (m.upper(), MODEL_PARAMS[m]))
    a("")
    a("## Precision and recall (positive class = anomaly), ours vs the paper")
    a("")
    a("| protocol | model | precision (ours) | recall (ours) | precision (paper) | recall (paper) |")
    a("|---|---|---|---|---|---|")
    t = rep["evaluation"]["table"]
    for p in PROTOCOLS:
        for m in MODELS:
            r = t[p][m]
            pp = r["paper"]
            a("| %s | %s | %s | %s | %s | %s |" % (
                p, m.upper(), _ms(r["precision"]), _ms(r["recall"]),
                _f(pp["precision"]) if pp else "–", _f(pp["recall"]) if pp else "–"))
    a("")
    rf = t["P2"]["rf"]["recall"]["per_seed"]
    a("HGBC matches the paper to the third decimal on P1 and P2, and within .001 on P0 "
      "(precision .996 vs .995). "
      "RF P2 recall varies with the seed (%s for seeds %s); seed 42 alone gives the "
      "paper's .353, so the paper's RF figure looks like a single run with seed 42. "
      "LogisticRegression does not match: the paper does not state its "
      "preprocessing or parameters, and none of the variants below gives .403/.947; "
      "the scaled variants share the paper's qualitative finding (low precision, high recall under "
      "the shift)." % (", ".join("%.3f" % x for x in rf),
                          ", ".join(str(x) for x in rep["seeds"])))
    a("")
    a("### LogisticRegression variants, P2")
    a("")
    a("| variant | precision | recall |")
    a("|---|---|---|")
    for v in rep["lr_sensitivity_p2"]:
        a("| %s | %s | %s |" % (v["variant"], _f(v["precision"]), _f(v["recall"])))
    a("")
    a("## Per-pod recall, HGBC")
    a("")
    a("Recall on the anomalous test rows of each pod (`node/role`; ReplicaSet hashes "
      "stripped). `n+` = anomalous test rows (mean over seeds).")
    a("")
    groups = sorted({g for p in PROTOCOLS for g in rep["evaluation"]["per_pod_recall_hgbc"][p]})
    a("| pod | " + " | ".join("%s recall | %s n+" % (p, p) for p in PROTOCOLS) + " |")
    a("|---|" + "---|---|" * len(PROTOCOLS))
    for g in groups:
        cells = []
        for p in PROTOCOLS:
            d = rep["evaluation"]["per_pod_recall_hgbc"][p].get(g)
            if d is None or d["recall"] is None:
                cells += ["–", "0" if d else "–"]
            else:
                cells += [_ms(d["recall"]), "%.0f" % d["positives_mean"]]
        a("| %s | %s |" % (g, " | ".join(cells)))
    a("")
    lr = rep["label_rule"]
    a("## The label rule")
    a("")
    a("Hypothesis: `true_label == (cpu_percent >= 80) OR (memory_percent >= 80)`, checked "
      "on every row where both values are present.")
    a("")
    a("| file | rows | rows with cpu and memory | mismatches | rows lacking one | of those labelled 1 |")
    a("|---|---|---|---|---|---|")
    for k in amfdata.FILES:
        v = lr[k]
        a("| %s | %d | %d | %d | %d | %d |" % (
            k, v["rows"], v["rows_with_cpu_and_memory"], v["mismatches"],
            v["rows_lacking_cpu_or_memory"], v["labelled_1_among_lacking"]))
    a("")
    a("Total: %d mismatches on %d rows. The labels are a deterministic saturation threshold "
      "on two of the six features, not the fault-injection windows the datasheet describes. "
      "The figures above therefore measure how well each model recovers two cuts at 80 %% "
      "(which the trees can represent exactly and a linear model cannot), not how early a "
      "fault is detected before saturation." % (lr["total_mismatches"], lr["total_rows_checked"]))
    a("")
    return "\n".join(L)


def cmd_evaluate(args):
    nominal, stressed, d = amfdata.load_dataset(args.data)
    seeds = tuple(args.seeds)
    log = (lambda s: print(s, file=sys.stderr)) if args.verbose else None
    ev = evaluate(nominal, stressed, seeds=seeds, log=log)
    rep = {
        "schema_version": 1,
        "tool": "infer/train/amftrain.py evaluate",
        "sklearn_version": sklearn.__version__,
        "numpy_version": np.__version__,
        "dataset": dataset_info(d),
        "dataset_sha256": amfdata.dataset_checksums(d),
        "dropped_rows": {"D_nominal.csv": int((~nominal.complete()).sum()),
                         "D_stressed.csv": int((~stressed.complete()).sum())},
        "seeds": list(seeds),
        "std": "population (ddof=0)",
        "protocols": PROTOCOL_TEXT,
        "models": MODEL_PARAMS,
        "evaluation": ev,
        "lr_sensitivity_p2": lr_sensitivity(nominal, stressed),
        "label_rule": label_rule(nominal, stressed),
    }
    os.makedirs(args.out, exist_ok=True)
    jp = os.path.join(args.out, "evaluation.json")
    mp = os.path.join(args.out, "evaluation.md")
    with open(jp, "w", encoding="utf-8") as f:
        json.dump(rep, f, indent=2)
        f.write("\n")
    with open(mp, "w", encoding="utf-8") as f:
        f.write(render_markdown(rep))
    t = ev["table"]
    for p in PROTOCOLS:
        for m in MODELS:
            r = t[p][m]
            pp = PAPER.get((p, m))
            print("%s %-4s precision %s recall %s%s" % (
                p, m, _ms(r["precision"]), _ms(r["recall"]),
                "   (paper %.3f/%.3f)" % pp if pp else ""))
    print("label rule: %d mismatches on %d rows" % (
        rep["label_rule"]["total_mismatches"], rep["label_rule"]["total_rows_checked"]))
    print("wrote %s and %s" % (os.path.relpath(mp), os.path.relpath(jp)))
    # Acceptance from the issue: HGBC P1 precision and recall >= 0.98, P2 precision >= 0.99.
    ok = (t["P1"]["hgbc"]["precision"]["mean"] >= 0.98
          and t["P1"]["hgbc"]["recall"]["mean"] >= 0.98
          and t["P2"]["hgbc"]["precision"]["mean"] >= 0.99)
    if not ok:
        print("amftrain: HGBC is below the issue's acceptance figures", file=sys.stderr)
        return 1
    return 0


def dataset_info(d):
    return {
        "name": amfdata.DATASET_NAME,
        "authors": list(amfdata.DATASET_AUTHORS),
        "licence": amfdata.DATASET_LICENCE,
        "url": amfdata.DATASET_URL,
        "files_sha256": amfdata.dataset_checksums(d),
    }


# ---------------------------------------------------------------------------
# split (--train/--test)

def cmd_split(args):
    train = amfdata.load_csv(args.train)
    test = amfdata.load_csv(args.test)
    tr, te = complete_rows(train), complete_rows(test)
    if len(tr) == 0 or len(te) == 0:
        raise DataError("no complete rows left in %s" % (args.train if len(tr) == 0 else args.test))
    if len(set(tr.y.tolist())) < 2:
        raise DataError("%s: training rows hold a single class" % args.train)
    clf = fit(args.model, args.seed, tr)
    pr, rc = prec_rec(te.y, clf.predict(te.X))
    print(json.dumps({
        "model": args.model, "seed": args.seed,
        "train": args.train, "test": args.test,
        "train_rows": len(tr), "test_rows": len(te),
        "dropped_train_rows": len(train) - len(tr), "dropped_test_rows": len(test) - len(te),
        "precision": pr, "recall": rc,
    }))
    return 0


# ---------------------------------------------------------------------------
# export / model

def train_hgbc(nominal, stressed, protocol, seed):
    train, test = protocol_split(protocol, nominal, stressed, seed)
    clf = fit("hgbc", seed, train)
    return clf, train, test


def export_trained(clf, train, test, protocol, seed, data_dir, model_path, manifest_path):
    pr, rc = prec_rec(test.y, clf.predict(test.X))
    return amfexport.write_model(
        model_path, manifest_path, clf, FEATURES,
        protocol=protocol, seed=seed, training_rows=len(train),
        sklearn_version=sklearn.__version__, dataset=dataset_info(data_dir),
        extra={"validation": {"test_rows": len(test), "precision": pr, "recall": rc,
                              "threshold": 0.5},
               "trained_by": "infer/train/amftrain.py"})


def _r(x):
    x = float(x)
    return "" if math.isnan(x) else repr(x)


def write_golden(path, clf, X, sources):
    """CSV of feature rows with sklearn's raw score and predict_proba (repr)."""
    X = np.asarray(X, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = clf._raw_predict(X)[:, 0]
        proba = clf.predict_proba(X)[:, 1]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="ascii", newline="\n") as f:
        f.write("source," + ",".join(FEATURES) + ",raw,probability\n")
        for src, row, r, p in zip(sources, X, raw, proba):
            f.write(src + "," + ",".join(_r(v) for v in row) + ",%s,%s\n" % (repr(float(r)),
                                                                           repr(float(p))))
    return len(X)


def crafted_rows(clf, base, rng, n_threshold_rows=60):
    """NaN rows and rows sitting exactly on (and just above) split thresholds."""
    rows, src = [], []
    rows.append([np.nan] * len(FEATURES))
    src.append("crafted_all_nan")
    for i in range(min(4, len(base))):
        for f in range(len(FEATURES)):
            r = base[i].copy()
            r[f] = np.nan
            rows.append(r)
            src.append("crafted_nan_f%d" % f)
    nodes = [(pred.nodes, j) for preds in clf._predictors for pred in preds
             for j in range(len(pred.nodes)) if not pred.nodes[j]["is_leaf"]]
    pick = rng.choice(len(nodes), size=min(n_threshold_rows // 2, len(nodes)), replace=False)
    for k in sorted(pick):
        nd, j = nodes[k]
        thr = float(nd[j]["num_threshold"])
        if not math.isfinite(thr):
            continue
        f = int(nd[j]["feature_idx"])
        b = base[rng.integers(len(base))]
        for v, tag in ((thr, "eq"), (float(np.nextafter(thr, np.inf)), "up")):
            r = b.copy()
            r[f] = v
            rows.append(r)
            src.append("crafted_threshold_%s_f%d" % (tag, f))
    return rows, src


def cmd_model(args):
    nominal, stressed, d = amfdata.load_dataset(args.data)
    clf, train, test = train_hgbc(nominal, stressed, "P1", args.seed)
    os.makedirs(args.out_dir, exist_ok=True)
    mp = os.path.join(args.out_dir, "p1_model.txt")
    jp = os.path.join(args.out_dir, "p1_manifest.json")
    man = export_trained(clf, train, test, "P1", args.seed, d, mp, jp)
    # Parity golden: held-out P1 test rows, the D_stressed rows with empty fields,
    # and crafted NaN / threshold rows.
    rng = np.random.default_rng(args.seed)
    idx = np.sort(rng.choice(len(test), size=min(300, len(test)), replace=False))
    X = [test.X[i] for i in idx]
    src = ["p1_test_label%d" % test.y[i] for i in idx]
    inc = stressed.subset(~stressed.complete())
    X += list(inc.X)
    src += ["d_stressed_empty_field"] * len(inc)
    cr, cs = crafted_rows(clf, test.X[idx], rng)
    X += cr
    src += cs
    gp = os.path.join(args.out_dir, "testdata", "parity_p1.csv")
    n = write_golden(gp, clf, X, src)
    print("model: P1 HGBC seed %d, %d trees, trained on %d rows; test precision %.4f recall %.4f"
          % (args.seed, clf.n_iter_, len(train), man["validation"]["precision"],
             man["validation"]["recall"]))
    print("wrote %s (%d bytes, sha256 %s), %s, %s (%d rows)" % (
        os.path.relpath(mp), os.path.getsize(mp), man["model_sha256"], os.path.relpath(jp),
        os.path.relpath(gp), n))
    return 0


def cmd_export(args):
    nominal, stressed, d = amfdata.load_dataset(args.data)
    clf, train, test = train_hgbc(nominal, stressed, args.protocol, args.seed)
    mp = args.out
    jp = amfexport.manifest_path_for(mp)
    man = export_trained(clf, train, test, args.protocol, args.seed, d, mp, jp)
    if args.golden:
        write_golden(args.golden, clf, test.X[:500], ["test"] * min(500, len(test)))
    print("wrote %s and %s (sha256 %s)" % (mp, jp, man["model_sha256"]))
    return 0


def cmd_label_rule(args):
    nominal, stressed, _ = amfdata.load_dataset(args.data)
    r = label_rule(nominal, stressed)
    print(json.dumps(r, indent=2))
    return 0 if r["total_mismatches"] == 0 else 1


# ---------------------------------------------------------------------------
# exporter self-test data

def synthetic(seed, n=3000, nan_frac=0.08):
    """Six features: NaNs in every feature, feature 3 constant, mixed scales."""
    rng = np.random.default_rng(seed)
    X = np.empty((n, 6))
    X[:, 0] = rng.gamma(2.0, 20.0, n)            # cpu-like
    X[:, 1] = rng.uniform(0, 200, n)             # memory-like
    X[:, 2] = rng.lognormal(8, 2, n)             # bytes/s, wide range
    X[:, 3] = 42.0                               # constant feature
    X[:, 4] = rng.normal(0, 1e-6, n)             # tiny growth rate
    X[:, 5] = rng.normal(0, 1e4, n)              # large signed growth rate
    logit = ((X[:, 0] - 40) / 10 + (X[:, 1] > 120) * 2.0 + np.sin(X[:, 5] / 3e3)
             + 0.3 * np.log(X[:, 2]) - 2.4 + rng.normal(0, 0.7, n))
    y = (logit > 0).astype(int)
    for f in range(6):
        m = rng.random(n) < nan_frac
        X[m, f] = np.nan
    # make missingness informative on feature 4 ("split on NaN" paths)
    X[(y == 1) & (rng.random(n) < 0.3), 4] = np.nan
    return X, y


EXPORTER_CASES = [
    # name, HGBC kwargs
    ("small", dict(max_iter=10)),
    ("default", dict()),
    ("deep", dict(max_iter=300, max_leaf_nodes=64, min_samples_leaf=3,
                  learning_rate=0.2, early_stopping=False)),
    ("depth2", dict(max_iter=50, max_depth=2, early_stopping=False)),
    ("stumps", dict(max_iter=30, min_samples_leaf=100000, early_stopping=False)),
]


def exporter_case(out_dir, name, seed, kw):
    X, y = synthetic(seed)
    n_train = int(len(X) * 0.7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf = HistGradientBoostingClassifier(random_state=seed, **kw).fit(X[:n_train], y[:n_train])
    base = f"{name}_seed{seed}"
    mp = os.path.join(out_dir, base + ".txt")
    jp = os.path.join(out_dir, base + ".manifest.json")
    amfexport.write_model(mp, jp, clf, FEATURES, protocol="synthetic", seed=seed,
                          training_rows=n_train, sklearn_version=sklearn.__version__,
                          dataset={"name": "synthetic (amftrain.py synthetic())"},
                          normalisation={"cpu_reference_fraction": 1.0,
                                         "memory_reference_fraction": 1.0})
    rng = np.random.default_rng(seed + 1000)
    test = X[n_train:]
    rows = list(test) + [np.array(r) for r in crafted_rows(clf, test, rng, 80)[0]]
    extremes = [np.full(6, v) for v in (0.0, -0.0, 1e308, -1e308, np.inf, -np.inf)]
    rows += extremes
    srcs = ["test"] * len(test) + ["crafted"] * (len(rows) - len(test))
    write_golden(os.path.join(out_dir, base + ".csv"), clf, rows, srcs)
    amfexplain.write_golden(os.path.join(out_dir, base + ".explain.csv"), clf, rows, srcs)
    depth = max(int(p[0].nodes["depth"].max()) for p in clf._predictors)
    n_nan_left = sum(int(((p[0].nodes["is_leaf"] == 0) & (p[0].nodes["missing_go_to_left"] == 1)).sum())
                     for p in clf._predictors)
    n_inf = sum(int(np.isinf(p[0].nodes["num_threshold"][p[0].nodes["is_leaf"] == 0]).sum())
                for p in clf._predictors)
    single = sum(int(len(p[0].nodes) == 1) for p in clf._predictors)
    return {"case": base, "trees": int(clf.n_iter_), "max_depth": depth, "rows": len(rows),
            "nan_left_splits": n_nan_left, "split_on_nan": n_inf, "single_leaf_trees": single}


def cmd_test_exporter(args):
    out = args.out or tempfile.mkdtemp(prefix="amf-exporter-")
    os.makedirs(out, exist_ok=True)
    cases = []
    for name, kw in EXPORTER_CASES:
        for seed in args.seeds:
            c = exporter_case(out, name, seed, kw)
            cases.append(c)
            print("%-18s trees %3d depth %2d rows %4d nan-left splits %4d split-on-nan %3d "
                  "single-leaf trees %d" % (c["case"], c["trees"], c["max_depth"], c["rows"],
                                            c["nan_left_splits"], c["split_on_nan"],
                                            c["single_leaf_trees"]))
    with open(os.path.join(out, "cases.json"), "w") as f:
        json.dump(cases, f, indent=2)
    print(out)
    return 0


# ---------------------------------------------------------------------------

def seeds_arg(s):
    if "-" in s:
        a, b = s.split("-", 1)
        return list(range(int(a), int(b) + 1))
    return [int(x) for x in s.split(",")]


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].startswith("--") and ("--train" in argv or "--test" in argv):
        argv = ["split"] + argv
    ap = argparse.ArgumentParser(prog="amftrain.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    def data_opt(p):
        p.add_argument("--data", default=None, metavar="DIR",
                       help="dataset folder holding D_nominal.csv and D_stressed.csv "
                            "(default %s)" % amfdata.DEFAULT_DATA_DIR)

    p = sub.add_parser("evaluate", help="protocols P0-P2 x models x seeds -> report")
    data_opt(p)
    p.add_argument("--out", default=REPORT_DIR)
    p.add_argument("--seeds", type=seeds_arg, default=list(SEEDS))
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("model", help="train P1 HGBC and write the embedded default model")
    data_opt(p)
    p.add_argument("--out-dir", default=MODEL_DIR)
    p.add_argument("--seed", type=int, default=42)
    p.set_defaults(func=cmd_model)

    p = sub.add_parser("export", help="train HGBC under a protocol and export it")
    data_opt(p)
    p.add_argument("--protocol", choices=PROTOCOLS, default="P1")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", required=True, help="model path; manifest goes to NAME.manifest.json")
    p.add_argument("--golden", default=None, help="also write a parity CSV here")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("split", help="train on --train, test on --test, print JSON")
    p.add_argument("--train", required=True)
    p.add_argument("--test", required=True)
    p.add_argument("--model", choices=MODELS, default="hgbc")
    p.add_argument("--seed", type=int, default=42)
    p.set_defaults(func=cmd_split)

    p = sub.add_parser("test-exporter", help="generate exporter parity cases for the Go test")
    p.add_argument("--out", default=None, help="directory (default: a new temp dir)")
    p.add_argument("--seeds", type=seeds_arg, default=[1, 2, 3])
    p.set_defaults(func=cmd_test_exporter)

    p = sub.add_parser("leadtime", help="train and evaluate the lead-time model on the lab corpus")
    p.add_argument("--corpus", default=None, metavar="DIR",
                   help="corpus folder holding corpus.csv.gz (default %s)" % amfleadtime.CORPUS_DIR)
    p.add_argument("--sidecar", default=amfleadtime.SIDECAR,
                   help="amf-sidecar binary that recomputes the features (make build)")
    p.add_argument("--out-dir", default=MODEL_DIR)
    p.add_argument("--report", default=REPORT_DIR)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=lambda a: amfleadtime.run(a, sklearn.__version__, write_golden, crafted_rows))

    p = sub.add_parser("check", help="the embedded detectors, as the sidecar runs them, on a recorded corpus")
    p.add_argument("--corpus", required=True, metavar="DIR", help="corpus folder holding corpus.csv.gz (amf-lab corpus --out)")
    p.add_argument("--sidecar", default=amfleadtime.SIDECAR,
                   help="amf-sidecar binary that recomputes the features and scores (make build)")
    p.add_argument("--horizon", type=float, default=120.0, help="seconds before a kill in which a decision counts (default 120)")
    p.set_defaults(func=amfleadtime.check)

    p = sub.add_parser("label-rule", help="check true_label == cpu>=80 or mem>=80")
    data_opt(p)
    p.set_defaults(func=cmd_label_rule)

    args = ap.parse_args(argv)
    try:
        return args.func(args)
    except (DataError, amfexport.ExportError, amfleadtime.CorpusError) as e:
        print("amftrain: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
