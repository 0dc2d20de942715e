"""A multirun folder as data: its jobs, the keys it sweeps and one tidy ``results.csv``.

Hydra writes one sub-folder per job (``.hydra/overrides.yaml``, ``errors.csv``,
``summary.json``) and the sweep's own config at the root (``multirun.yaml``). The keys a sweep
varies are the ones its overrides declare as sweeps (``M=1,4`` on the command line or
``hydra.sweeper.params`` in an experiment file); every other override is a constant of the sweep
and never appears as a column or a label. :func:`write_results` writes ``results.csv``; the Hydra
callback :class:`fnsysid.app.callbacks.SweepTable` calls it when a multirun ends.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import yaml

from fnsysid.config.checks import DataError
from fnsysid.results.folder import errors_problem

if TYPE_CHECKING:       # pandas is imported where a sweep is read, not by every run
    import pandas as pd

RESULTS = "results.csv"
#: the sweep's config, written by Hydra at the root of every multirun folder
MULTIRUN = "multirun.yaml"
#: columns of errors.csv that index the rows rather than measure an error
INDEX_COLUMNS = ("repeat", "round")

log = logging.getLogger("fnsysid")
#: PyYAML's safe loader, the one built on libyaml when installed (same objects, ~10x faster)
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: Path):
    """The YAML file ``path`` as Python objects (``yaml.safe_load``)."""
    return yaml.load(Path(path).read_text(), Loader=SAFE_LOADER)


def find_sweep(folder: Path) -> Path:
    """The multirun folder to read for ``folder``.

    ``folder`` itself when it is a sweep (holds ``multirun.yaml`` or job folders); otherwise the
    newest sweep directly inside it (a stored experiment keeps one timestamped sweep per run).
    """
    folder = Path(folder)
    if (folder / MULTIRUN).exists() or any(folder.glob("*/.hydra/overrides.yaml")):
        return folder
    inner = sorted(p.parent for p in folder.glob(f"*/{MULTIRUN}"))
    return inner[-1] if inner else folder


def read_sweep(sweep_dir: Path) -> list[dict]:
    """Jobs of a multirun folder: overrides, summary and errors of each finished job (one with
    ``errors.csv`` and ``summary.json``). Raises :class:`~fnsysid.config.checks.DataError` naming
    the job whose ``errors.csv`` does not hold the rows its summary counts."""
    import pandas as pd

    jobs = []
    for ov in sorted(Path(sweep_dir).glob("**/.hydra/overrides.yaml")):
        job = ov.parent.parent
        if not (job / "errors.csv").exists() or not (job / "summary.json").exists():
            continue
        overrides = dict(_split(o) for o in load_yaml(ov) or [])
        summary = json.loads((job / "summary.json").read_text())
        problem = errors_problem(job, summary)
        if problem is not None:
            raise DataError(f"{job}: {problem}")
        jobs.append({"dir": job, "overrides": overrides, "summary": summary,
                     "errors": pd.read_csv(job / "errors.csv")})
    return jobs


def diverged_repeats(job: dict) -> list[int]:
    """The repeats of a job that diverged (``summary.json: repeat_status``; empty for a run
    that stopped at its first divergence, which records no status per repeat)."""
    return [s for s, st in enumerate((job.get("summary") or {}).get("repeat_status") or [])
            if st == "diverged"]


def kept_errors(job: dict):
    """A job's ``errors.csv`` without the rows of the repeats that diverged (empty where every
    repeat diverged: the figures draw no curve of it)."""
    gone = diverged_repeats(job)
    err = job["errors"]
    return err[~err["repeat"].isin(gone)] if gone else err


def table_errors(job: dict):
    """The rows of a job in ``results.csv``: :func:`kept_errors`, or where every repeat
    diverged all its rows up to each repeat's divergence (its blank rows after left out), so
    that the job keeps its place in the table with its ``status`` (it vanished)."""
    kept = kept_errors(job)
    if len(kept):
        return kept
    err = job["errors"]
    values = [c for c in err.columns if c not in ("repeat", "round")]
    return err.dropna(subset=values, how="all")


def server_estimates(job: dict) -> np.ndarray | None:
    """A finished job's final server model per repeat (S, p) from its ``estimates.csv``, or
    None where it has none (diverged, or one model per client)."""
    import pandas as pd

    path = Path(job["dir"]) / "estimates.csv"
    if not path.exists():
        return None
    est = pd.read_csv(path)
    est = est[est["client"].astype(str) == "server"]
    if est.empty:
        return None
    return est.pivot(index="repeat", columns="parameter", values="estimate").to_numpy()


def dist_to_pooled(jobs: list[dict]) -> dict[int, np.ndarray]:
    """``||theta_R - theta_pooled|| / ||theta_pooled||`` per repeat for each job of ``jobs``
    (key: its position) that has a final server model, ``theta_pooled`` the final model of a
    job of the same sweep with ``strategy=centralized_exact`` (the pooled least squares of the
    same data: the jobs of a sweep share the seed). Empty without such a job."""
    pooled = next((server_estimates(j) for j in jobs
                   if j["summary"].get("strategy") == "centralized_exact"
                   and j["summary"].get("status") == "ok"), None)
    if pooled is None:
        return {}
    out = {}
    for i, j in enumerate(jobs):
        est = server_estimates(j)
        if est is not None and est.shape == pooled.shape:
            out[i] = (np.linalg.norm(est - pooled, axis=1)
                      / np.linalg.norm(pooled, axis=1))
    return out


def _split(override: str) -> tuple[str, str]:
    key, value = override.split("=", 1)
    return key.lstrip("+~"), value


def declared_keys(sweep_dir: Path) -> list[str] | None:
    """Keys the sweep declares as swept, in the order given; None without ``multirun.yaml``."""
    path = Path(sweep_dir) / MULTIRUN
    if not path.exists():
        return None
    return sweep_keys((load_yaml(path) or {}).get("hydra", {}))


def sweep_keys(hydra_cfg: dict) -> list[str]:
    """Keys a multirun's Hydra node (a plain dict, as in ``multirun.yaml``) declares as swept:
    sweeps among its command line's overrides, then ``hydra.sweeper.params``."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    lines = list((hydra_cfg.get("overrides") or {}).get("task") or [])
    params = (hydra_cfg.get("sweeper") or {}).get("params") or {}
    given = {_split(line)[0] for line in lines}
    lines += [f"{k}={v}" for k, v in params.items() if k not in given]  # command line wins
    keys = []
    for o in OverridesParser.create().parse_overrides(lines):
        if o.is_sweep_override() and not o.key_or_group.startswith("hydra."):
            keys.append(o.key_or_group.lstrip("+~"))
    return list(dict.fromkeys(keys))


def swept_keys(jobs: list[dict], declared: list[str] | None = None) -> list[str]:
    """Keys the jobs differ in: ``declared`` when known, else override keys whose value varies."""
    if declared is not None:
        return list(declared)
    keys = sorted({k for j in jobs for k in j["overrides"]})
    return [k for k in keys if len({j["overrides"].get(k) for j in jobs}) > 1]


def typed(value: str):
    """An override's value as int or float when it reads as one, else the string."""
    for cast in (int, float):
        try:
            return cast(value)
        except (TypeError, ValueError):
            pass
    return value


def results_table(sweep_dir: Path) -> pd.DataFrame:
    """One row per (job, round): the swept keys' values and each error over the repeats.

    For every error column ``e`` of the jobs' ``errors.csv`` (``e_max``, ``e_mean``, ...):
    ``e`` (its mean over the repeats), ``e_se`` (standard error of that mean,
    ``std(ddof=1) / sqrt(repeats)``), ``e_lo`` and ``e_hi`` (min and max over the repeats).
    ``n_repeats`` counts the repeats; ``final`` marks each job's last round; ``status`` is the
    job's (``ok``, ``growing`` with every row, or ``diverged``); ``repeats_diverged`` counts
    the repeats that diverged, which are left out of the numbers (in process the other repeats
    run to the end; a run where every repeat diverged has rows up to the round before the last
    divergence).
    """
    import pandas as pd

    sweep_dir = Path(sweep_dir)
    jobs = read_sweep(sweep_dir)
    keys = swept_keys(jobs, declared_keys(sweep_dir))
    heads = [{"job": str(j["dir"].relative_to(sweep_dir)),
              **{k: typed(j["overrides"].get(k)) for k in keys},
              "status": j["summary"]["status"],
              "repeats_diverged": len(diverged_repeats(j))} for j in jobs]
    jobs = [{**j, "errors": table_errors(j)} for j in jobs]
    table = _rows_at_once(jobs, heads)
    if table is None:
        frames = [pd.DataFrame({**head, **_job_rows(j["errors"]).to_dict("list")})
                  for j, head in zip(jobs, heads, strict=True)]
        if not frames:
            return pd.DataFrame(columns=["job", *keys, "status", "round"])
        table = pd.concat(frames, ignore_index=True)
    order = [*keys, "round"] if keys else ["job", "round"]
    return table.sort_values(order, kind="stable", key=_sort_key).reset_index(drop=True)


def _job_rows(err: pd.DataFrame, by: list[str] | None = None) -> pd.DataFrame:
    """The rows of one job's ``errors.csv`` ``err`` in :func:`results_table` (round, n_repeats,
    each error's mean, se, lo and hi, final); of several jobs at once when ``by`` names a
    column telling them apart (each group's numbers are the same: pandas reduces each group
    alone, in its rows' order)."""
    import pandas as pd

    by = by or []
    metrics = [c for c in err.columns if c not in (*INDEX_COLUMNS, *by)]
    g = err.groupby([*by, "round"] if by else "round")
    n = g.size()
    # the standard error needs two repeats in every round of the job
    several = (n.groupby(level=by).transform("min") if by else n.min() + 0 * n) > 1
    cols = {"n_repeats": n}
    for m in metrics:
        sd = g[m].std(ddof=1).where(several) if several.any() else g[m].std(ddof=0) * np.nan
        cols.update({m: g[m].mean(), f"{m}_se": sd / np.sqrt(n),
                     f"{m}_lo": g[m].min(), f"{m}_hi": g[m].max()})
    df = pd.DataFrame(cols).reset_index()
    last = df.groupby(by)["round"].transform("max") if by else df["round"].max()
    df["final"] = df["round"] == last
    return df


def _rows_at_once(jobs: list[dict], heads: list[dict]) -> pd.DataFrame | None:
    """:func:`results_table`'s rows before sorting, all jobs in one group-by (a job at a time
    costs more than its numbers); None when the jobs' ``errors.csv`` differ in columns or
    types, or a key's values in type (then a job at a time gives the table's columns and
    types)."""
    import pandas as pd

    if not jobs:
        return None
    dtypes = list(jobs[0]["errors"].dtypes.items())
    if any(list(j["errors"].dtypes.items()) != dtypes for j in jobs) or any(
            len({type(h[k]) for h in heads}) > 1 or type(heads[0][k]) not in (int, float, str)
            for k in heads[0]):
        return None
    err = pd.concat([j["errors"] for j in jobs], ignore_index=True)
    err["_job"] = np.repeat(np.arange(len(jobs)), [len(j["errors"]) for j in jobs])
    df = _job_rows(err, by=["_job"])
    rows = np.bincount(df["_job"].to_numpy(), minlength=len(jobs))
    cols = {k: np.repeat(np.array([h[k] for h in heads], dtype=object), rows).tolist()
            for k in heads[0]}
    cols.update({c: df[c].to_numpy() for c in df.columns if c != "_job"})
    return pd.DataFrame(cols)


def _sort_key(col: pd.Series) -> pd.Series:
    """Numbers before strings, numbers by value (a column may mix both)."""
    if col.dtype != object:
        return col
    return col.map(lambda v: (0, float(v), "") if isinstance(v, (int, float)) else (1, 0.0, v))


def write_results(sweep_dir: Path) -> Path:
    """Write ``results.csv`` at the root of ``sweep_dir``; return its path."""
    path = Path(sweep_dir) / RESULTS
    results_table(sweep_dir).to_csv(path, index=False, float_format="%.6g")
    return path
