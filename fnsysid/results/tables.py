"""Result tables of a run as tidy tables (one row per observation) and its summary.

A run builds its tables as :class:`Table` (named numpy columns) and writes them with the
standard library's :mod:`csv` module, not pandas, whose import alone costs about 0.3 s of every
run; a table of :data:`Table.ARROW_ROWS` rows or more (``client_estimates.csv`` of a large
fleet) with pyarrow's CSV writer, several times faster per value, whose import pays off there.
Read back (pandas), both give the same values. :meth:`Table.to_frame` gives the DataFrame (the
Python API's :attr:`fnsysid.app.experiment.Result.tables`)."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from fnsysid.dynamics.model import map_on_threads
from fnsysid.learning.local_work import label as k_label
from fnsysid.results.history import growth

if TYPE_CHECKING:
    import pandas as pd


class Table:
    """A tidy table: named 1-D numpy columns of one length (scalars are repeated).

    ``table[name]`` is a column, ``table[mask]`` the rows where ``mask`` holds.
    """

    #: rows converted to Python values at a time by :meth:`to_csv` (bounds its memory)
    CHUNK = 100_000
    #: rows from which :meth:`to_csv` writes with pyarrow (its import costs about 0.1 s; it
    #: writes a value in about a sixth of the time of the csv module)
    ARROW_ROWS = 200_000
    #: rows of one slice that pyarrow formats at a time (one thread each)
    ARROW_CHUNK = 250_000

    def __init__(self, columns: dict):
        arrays = {k: np.asarray(v) for k, v in columns.items()}
        n = next((len(a) for a in arrays.values() if a.ndim), 1)
        self.columns = {k: np.full(n, a) if a.ndim == 0 else a for k, a in arrays.items()}
        if any(a.shape != (n,) for a in self.columns.values()):
            raise ValueError(f"columns of unequal length: "
                             f"{ {k: a.shape for k, a in self.columns.items()} }")

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()), ()))

    def __repr__(self) -> str:
        return f"Table({len(self)} rows: {', '.join(self.columns)})"

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.columns[key]
        return Table({k: a[key] for k, a in self.columns.items()})

    def to_frame(self) -> pd.DataFrame:
        """The table as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.columns)

    def to_csv(self, path, index: bool = False) -> None:
        """Write the table as CSV with :func:`csv.writer` (``index=False`` as for a DataFrame,
        which :func:`fnsysid.results.atomic.write_csv` also takes): floats in their shortest
        round-trip form (``repr``), NaN and None as empty fields, minimal quoting."""
        if index:
            raise ValueError("a Table has no index to write")
        if len(self) >= self.ARROW_ROWS and _arrow_csv(self.columns, path):
            return
        with open(path, "w", encoding="utf-8", newline="") as f:
            out = csv.writer(f, lineterminator="\n")
            out.writerow(self.columns)
            for start in range(0, len(self), self.CHUNK):
                out.writerows(zip(*(_cells(a[start:start + self.CHUNK])
                                     for a in self.columns.values()), strict=True))


def _arrow_csv(columns: dict, path) -> bool:
    """Write ``columns`` as CSV with :func:`pyarrow.csv.write_csv`; False (nothing written)
    where pyarrow cannot take a column as one type (an object column mixing types). The
    values read back as those of :meth:`Table.to_csv`'s csv module: floats (float32 as the
    float64 the csv module writes) in a shortest round-trip form, NaN and None as empty
    fields, booleans as ``True``/``False``; strings are quoted."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    arrays = {}
    try:
        for k, a in columns.items():
            if a.dtype.kind == "b":
                a = np.where(a, "True", "False")
            elif a.dtype.kind == "f":
                a = a.astype(float, copy=False)
            arrays[k] = pa.array(a, from_pandas=True)       # NaN and None: null (empty)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return False
    table = pa.table(arrays)

    def text(start: int, header: bool):
        sink = pa.BufferOutputStream()
        pacsv.write_csv(table.slice(start, Table.ARROW_CHUNK), sink,
                        pacsv.WriteOptions(quoting_style="needed", include_header=header))
        return sink.getvalue()

    # pyarrow formats without the GIL: consecutive slices formatted on threads, a few at a
    # time (memory: a few slices' text), written in order
    starts = list(range(0, len(table), Table.ARROW_CHUNK)) or [0]
    with open(path, "wb") as f:
        for lo in range(0, len(starts), ARROW_BATCH):
            for buf in map_on_threads(text, [(s, s == 0) for s in starts[lo:lo + ARROW_BATCH]]):
                f.write(buf)
    return True


#: slices of :data:`Table.ARROW_CHUNK` rows formatted at a time by :func:`_arrow_csv`
ARROW_BATCH = 4


def _cells(a: np.ndarray) -> list:
    """A column as Python values for :func:`csv.writer`, which writes ``str`` of each (``repr``
    for a float) and None as an empty field: NaN becomes None."""
    values = a.tolist()
    if a.dtype.kind == "f":
        for i in np.flatnonzero(np.isnan(a)).tolist():
            values[i] = None
    elif a.dtype.kind == "O":
        values = [None if isinstance(v, float) and v != v else v for v in values]
    return values


class Frames(Mapping):
    """name -> DataFrame of a run's tables, each built from its :class:`Table` when first read
    (a DataFrame given instead of a Table is kept as it is)."""

    def __init__(self, tables: Mapping):
        self._tables = dict(tables)
        self._frames: dict = {}

    def __getitem__(self, name: str) -> pd.DataFrame:
        if name not in self._frames:
            table = self._tables[name]
            self._frames[name] = table.to_frame() if isinstance(table, Table) else table
        return self._frames[name]

    def __iter__(self):
        return iter(self._tables)

    def __len__(self) -> int:
        return len(self._tables)

    def __repr__(self) -> str:
        return f"Frames({', '.join(self._tables)})"

    def table(self, name: str):
        """The table ``name`` as it was given (a :class:`Table` is not converted)."""
        return self._tables[name]


def errors_table(hist) -> Table:
    """Tidy table: one row per (repeat, round) with the max and mean over clients of the
    parameter error and of the held-out NRMSE (empty where not computed)."""
    cols = {name: np.array(v).T for name, v in hist.rows.items()}   # (S, rounds) each
    S, R1 = cols["e_max"].shape
    return Table({
        "repeat": np.repeat(np.arange(S), R1),
        "round": np.tile(np.arange(R1), S),
        **{name: v.ravel() for name, v in cols.items()},
    })


def clients_table(hist, labels: list[str] | None = None) -> Table:
    """Tidy table: one row per (repeat, round, client); ``client`` the client's label
    (``labels``: file data's client ids, as text) or its position 0..M-1."""
    e = np.array(hist.per_client).transpose(1, 0, 2)              # (S, rounds, M)
    S, R1, M = e.shape
    ss, rr, mm = np.meshgrid(np.arange(S), np.arange(R1), np.arange(M), indexing="ij")
    client = mm.ravel() if labels is None else np.asarray(labels, dtype=object)[mm.ravel()]
    return Table({"repeat": ss.ravel(), "round": rr.ravel(), "client": client,
                  "error": e.ravel()})


def estimates_table(model, estimate, data, theta0, per_client: bool,
                    labels: list[str] | None = None, se=None, z=1.96) -> Table:
    """Final estimates with the clients' mean truth, the nominal model and the start.

    One row per (repeat, parameter) with ``client = "server"``; a strategy that evaluates each
    client with its own model (``local``) gets one row per client when per-client output is on,
    else its mean over clients (``client = "mean"``); per-client rows name the client by its
    label (``labels``: file data's client ids) or its position 0..M-1.

    Per parameter: ``rel_error = |estimate - true_mean| / |true_mean|`` (NaN where the truth is
    0) and ``rel_error_max``, the largest ``|estimate - theta_i| / |theta_i|`` over the clients
    the estimate serves (its own client for per-client rows). ``e_r`` (a norm over all
    parameters) can be small while a weakly excited parameter is far off; these columns show it.
    Without ``data`` (a federated server sees none) the truth columns are empty.

    ``se`` (S, 1, p): standard errors of a server estimate with a closed form
    (:func:`fnsysid.results.personal.server_intervals`), giving ``se`` and the interval
    ``ci_lo``, ``ci_hi`` = estimate -/+ ``z`` se; empty without. ``z``: the quantile, a number
    or an array like ``se`` (Student's t on each parameter's degrees of freedom).
    """
    estimate = np.asarray(estimate)
    S, p = estimate.shape[0], estimate.shape[-1]
    truth = np.full((S, 1, p), np.nan) if data is None else data.theta_true   # (S, M, p)
    M = truth.shape[1]
    if estimate.shape[1] == 1:
        labels, est = ["server"], estimate
    elif per_client:
        labels, est = [str(m) for m in (range(M) if labels is None else labels)], estimate
    else:
        labels, est = ["mean"], estimate.mean(axis=1, keepdims=True)
    C = len(labels)
    nominal = model.system.nominal @ model.embed
    mean = truth.mean(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(mean != 0, np.abs(est - mean) / np.abs(mean), np.nan)
        if C == M and estimate.shape[1] == M:                     # each client its own model
            per = np.abs(est - truth) / np.abs(truth)
        else:                                                     # one model for all clients
            per = (np.abs(est[:, :, None] - truth[:, None]) / np.abs(truth[:, None])).max(axis=2)
        per = np.where(np.isfinite(per), per, np.nan)
    return Table({
        "repeat": np.repeat(np.arange(S), C * p),
        "client": np.tile(np.repeat(labels, p), S),
        "parameter": np.tile(model.param_names, S * C),
        "estimate": est.ravel(),
        "true_mean": np.repeat(mean[:, 0], C, axis=0).ravel(),
        "nominal": np.tile(nominal, S * C),
        "initial": np.repeat(theta0, C, axis=0).ravel(),
        "rel_error": rel.ravel(),
        "rel_error_max": per.ravel(),
        **_intervals(est, se, z),
    })


def _intervals(est: np.ndarray, se, z) -> dict:
    """The ``se``, ``ci_lo`` and ``ci_hi`` columns of estimates (NaN where ``se`` is None or
    does not match the rows)."""
    if se is None or np.shape(se) != est.shape:
        se = np.full(est.shape, np.nan)
    return {"se": se.ravel(), "ci_lo": (est - z * se).ravel(), "ci_hi": (est + z * se).ravel()}


def last_round(errors):
    """Rows of ``errors.csv`` (a DataFrame or a :class:`Table`) at the last recorded round (one
    per repeat)."""
    return errors[errors["round"] == errors["round"].max()]


def run_title(cfg, model, settings: dict | None = None) -> str:
    """One-line description of a run's settings (plot titles)."""
    st = {"M": cfg.M, "N": cfg.N, "eps": cfg.eps, **(settings or {})}
    if st.get("T", 0) is None:               # data from files
        return (f"{model.system.name}, M={st['M']} clients from files, K={k_label(cfg.K)}, "
                f"lr={cfg.lr:g}")
    return (f"{model.system.name}, M={st['M']}, N={st['N']}, eps={st['eps']:g}, "
            f"K={k_label(cfg.K)}, "
            f"lr={cfg.lr:g}")


def _final(last: Table, col: str) -> float | None:
    """Mean over repeats of a last-round column; None where it is empty."""
    v = np.asarray(last[col], dtype=float)
    return None if np.isnan(v).any() else float(v.mean())


def _final_std(last: Table, col: str) -> float | None:
    v = np.asarray(last[col], dtype=float)
    return None if not np.isfinite(v).all() else float(v.std())


def make_summary(cfg, model, diverged, errors, theory, runtime,
                 settings: dict | None = None, choices: dict | None = None,
                 fleet: dict | None = None) -> dict:
    """``summary.json``: status, final errors (mean and std over repeats), settings, runtime.

    Status ``diverged`` when ``diverged`` (the round) is given, ``growing`` (with ``growth``,
    see :func:`fnsysid.results.history.growth`) when some repeat's last error is far above the
    start, else ``ok``.

    ``cfg``: the run's checked settings (:class:`~fnsysid.config.schema.Settings`); their
    values are recorded as given. Values that a run does not have (parameter errors without
    ground truth, NRMSE without held-out data) are null. ``settings`` (the data's M, N, T,
    eps) replaces the config's knobs when the data come from files. ``choices``: group ->
    option chosen. ``fleet``: the parameter errors :func:`~fnsysid.results.history.growth`
    reads (a history's ``fleet``), or None.
    """
    last = last_round(errors)
    choices = choices or {}
    given = cfg.resolved
    st = {k: given[k] for k in ("M", "N", "T", "eps", "repeats")} | (settings or {})
    finals = {}
    for col in ("e_max", "e_mean"):
        finals[f"final_{col}_mean"] = _final(last, col)
        finals[f"final_{col}_std"] = _final_std(last, col)
    for col in ("nrmse_1step_max", "nrmse_1step_mean", "nrmse_sim_max", "nrmse_sim_mean"):
        finals[f"final_{col}"] = _final(last, col)
    grew = None if diverged is not None else growth(errors, fleet)
    return {
        "status": "diverged" if diverged is not None else "growing" if grew else "ok",
        "diverged_round": diverged,
        **({"growth": grew} if grew else {}),
        "rounds_completed": int(errors["round"].max()),
        **finals,
        "system": choices.get("system", model.system.name),
        "feature_map": choices.get("feature_map"),
        "optimizer": choices.get("optimizer"),
        "strategy": choices.get("strategy"),
        "data": choices.get("data", cfg.data.source),
        **st,
        "K": given["K"], "lr": given["lr"], "R": given["R"], "seed": given["seed"],
        "parameters": list(model.param_names),
        "runtime": cfg.runtime.name,
        "runtime_s": {k: round(v, 4) for k, v in runtime.items()},
        "theorem1": None if theory is None else {
            "delta": cfg.theory.delta,
            **{k: _number(theory[k].mean()) for k in
               ("bound_rel", "bound", "bound_proof_rel", "bound_proof", "noise_term",
                "sigma_w", "s_phi2", "b_phi", "eps", "N_tot")}},
    }


def _number(v) -> float:
    """A float; NaN/inf (e.g. Theorem 1 terms that need the truth) are written as null with
    the reason in ``null_values`` by :func:`fnsysid.results.atomic.write_json`."""
    return float(v)


def k_clients_table(K, labels: list[str]) -> Table:
    """The local steps each client took per round (``k_clients.csv``): one row per (repeat,
    client) with ``K``, from the realised per-client counts ``K`` (S, M)."""
    K = np.asarray(K, dtype=int)
    S, M = K.shape
    return Table({"repeat": np.repeat(np.arange(S), M),
                  "client": np.tile(np.asarray(labels, dtype=object), S),
                  "K": K.ravel()})


def parameters_table(model, theta_true=None) -> Table:
    """The parameters a run fits, in order (``parameters.csv``): ``index`` (0..p-1),
    ``parameter`` (the name used by ``estimates.csv`` and truth files), for a dense model
    ``target`` and ``feature`` (the two halves of its ``target:feature`` names), ``nominal``,
    and with the clients' true parameters ``theta_true`` (S, M, p) ``scored``: whether ``e_r``
    is taken over the parameter (its truth known for every client; a Flower server sees no
    truth and writes no such column)."""
    names = list(model.param_names)
    columns = {"index": np.arange(len(names)), "parameter": np.array(names, dtype=object)}
    if names and all(":" in n for n in names):
        halves = [n.split(":", 1) for n in names]
        columns["target"] = np.array([h[0] for h in halves], dtype=object)
        columns["feature"] = np.array([h[1] for h in halves], dtype=object)
    columns["nominal"] = np.asarray(model.system.nominal @ model.embed, float)
    if theta_true is not None:
        columns["scored"] = np.isfinite(theta_true).reshape(-1, len(names)).all(axis=0)
    return Table(columns)
