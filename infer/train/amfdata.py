"""Loading the ToD-K8s-OOD dataset (Siddiqui & Khendek, CC BY 4.0).

The dataset is *not* part of this repository. Get it from its public
repository (https://github.com/hassaanas/k8s-dataset-tod) and pass its
``data`` folder with ``--data DIR``. In this project's workplace it lives at
``../shared/data/tod-k8s-ood/data`` relative to the repository root, which is
the default when present.

Only the standard library and numpy are used here: the CSVs have CRLF line
ends and some empty feature fields (read as NaN).
"""

import csv
import hashlib
import os

import numpy as np

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _feature_names():
    # The six model inputs, in the order the Go side computes them: the
    # schema defined once in package contract (contract.FeatureNames), which
    # its tests keep equal to this file.
    path = os.path.join(REPO_ROOT, "contract", "feature_names.txt")
    with open(path, encoding="utf-8") as f:
        return tuple(line.strip() for line in f if line.strip())


FEATURES = _feature_names()
LABEL = "true_label"
FILES = ("D_nominal.csv", "D_stressed.csv")

DATASET_NAME = "ToD-K8s-OOD: A Robustness Benchmark for C-V2X Anomaly Detection"
DATASET_AUTHORS = ["Hassaan Siddiqui", "Ferhat Khendek"]
DATASET_LICENCE = "CC BY 4.0"
DATASET_URL = "https://github.com/hassaanas/k8s-dataset-tod"
DEFAULT_DATA_DIR = os.path.normpath(
    os.path.join(REPO_ROOT, "..", "shared", "data", "tod-k8s-ood", "data"))


class DataError(Exception):
    """A dataset file is missing or malformed."""


def where_to_get_it():
    return ("The ToD-K8s-OOD dataset (Siddiqui & Khendek, CC BY 4.0) is not part of "
            "this repository. Download it from %s and pass its data folder (the one "
            "holding D_nominal.csv and D_stressed.csv) with --data DIR."
            % DATASET_URL)


def resolve_data_dir(arg=None):
    """Return the dataset folder: ``arg`` when given, else the default."""
    d = arg if arg else DEFAULT_DATA_DIR
    missing = [f for f in FILES if not os.path.isfile(os.path.join(d, f))]
    if missing:
        raise DataError("dataset folder %r lacks %s. %s"
                        % (d, ", ".join(missing), where_to_get_it()))
    return d


def data_available(arg=None):
    try:
        resolve_data_dir(arg)
        return True
    except DataError:
        return False


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pod_role(pod):
    """'broker-7f57c8d79b-f2m5m' -> 'broker' (strip the ReplicaSet and pod hashes)."""
    parts = pod.split("-")
    if len(parts) >= 3:
        return "-".join(parts[:-2])
    return pod


class Frame:
    """Columns of one CSV: X (n x 6 float64, NaN for empty), y (int or None),
    node, pod (full names), group ("node/role"), and the raw rows."""

    def __init__(self, path, header, rows, X, y):
        self.path = path
        self.header = header
        self.rows = rows
        self.X = X
        self.y = y
        ni = header.index("node") if "node" in header else None
        pi = header.index("pod") if "pod" in header else None
        self.node = np.array([r[ni] if ni is not None else "" for r in rows], dtype=object)
        self.pod = np.array([r[pi] if pi is not None else "" for r in rows], dtype=object)
        self.group = np.array(["%s/%s" % (n, pod_role(p)) if p else ""
                               for n, p in zip(self.node, self.pod)], dtype=object)

    def __len__(self):
        return len(self.rows)

    def complete(self):
        """Boolean mask of rows with all six features present."""
        return ~np.isnan(self.X).any(axis=1)

    def subset(self, mask):
        f = Frame.__new__(Frame)
        f.path, f.header = self.path, self.header
        idx = np.flatnonzero(mask) if mask.dtype == bool else mask
        f.rows = [self.rows[i] for i in idx]
        f.X = self.X[idx]
        f.y = None if self.y is None else self.y[idx]
        f.node, f.pod, f.group = self.node[idx], self.pod[idx], self.group[idx]
        return f


def _parse_float(s, path, lineno, col):
    s = s.strip()
    if s == "":
        return np.nan
    try:
        return float(s)
    except ValueError:
        raise DataError("%s:%d: column %s: %r is not a number" % (path, lineno, col, s))


def load_csv(path, need_label=True):
    """Read a CSV in the dataset's schema (any extra columns are kept)."""
    if not os.path.isfile(path):
        raise DataError("%s: no such file. %s" % (path, where_to_get_it()))
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise DataError("%s: empty file" % path)
        missing = [c for c in FEATURES if c not in header]
        if need_label and LABEL not in header:
            missing.append(LABEL)
        if missing:
            raise DataError("%s: missing column(s) %s (header: %s)"
                            % (path, ", ".join(missing), ",".join(header)))
        fidx = [header.index(c) for c in FEATURES]
        lidx = header.index(LABEL) if LABEL in header else None
        rows, X, y = [], [], []
        for lineno, r in enumerate(reader, start=2):
            if not r or (len(r) == 1 and r[0].strip() == ""):
                continue
            if len(r) != len(header):
                raise DataError("%s:%d: %d fields, header has %d"
                                % (path, lineno, len(r), len(header)))
            rows.append(r)
            X.append([_parse_float(r[i], path, lineno, header[i]) for i in fidx])
            if lidx is not None:
                v = r[lidx].strip()
                if v not in ("0", "1"):
                    raise DataError("%s:%d: true_label %r is not 0 or 1" % (path, lineno, v))
                y.append(int(v))
    X = np.array(X, dtype=np.float64).reshape(-1, len(FEATURES))
    yy = np.array(y, dtype=np.int64) if lidx is not None else None
    return Frame(path, header, rows, X, yy)


def load_dataset(data_dir=None):
    d = resolve_data_dir(data_dir)
    return (load_csv(os.path.join(d, FILES[0])), load_csv(os.path.join(d, FILES[1])), d)


def dataset_checksums(data_dir):
    return {f: sha256_file(os.path.join(data_dir, f)) for f in FILES}
