"""A finished run or sweep read back from its folder: for ``fnsysid show RUN_DIR`` and
:meth:`fnsysid.FederatedSysID.load`."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import yaml

from fnsysid.config.errors import ConfigError, some
from fnsysid.results.equations import short_form
from fnsysid.results.folder import MULTIRUN

#: the tables a loaded run reads (each when its file exists)
TABLES = ("errors", "estimates", "client_estimates", "parameters", "clients", "k_clients",
          "theory")
#: summary.json's scores shown by ``fnsysid show`` (each when not null)
SCORES = ("final_e_max_mean", "final_e_mean_mean", "final_nrmse_1step_mean",
          "final_nrmse_1step_max", "final_nrmse_sim_mean", "final_nrmse_sim_max",
          "final_e_pers_max_mean")


def _summary(folder: Path, name: str) -> dict:
    path = folder / "summary.json"
    if not folder.is_dir():
        raise ConfigError(f"{name}={folder} is not a folder; allowed: the folder of a finished "
                          "run or sweep")
    if not path.is_file():
        raise ConfigError(f"{name}={folder} holds no finished run (no summary.json); allowed: "
                          "the folder of a finished run or sweep")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{name}={folder}: summary.json cannot be read ({exc})") from None


def is_sweep(folder: Path) -> bool:
    """True if ``folder`` is a sweep's (Hydra's ``multirun.yaml`` at its top)."""
    return (Path(folder) / MULTIRUN).is_file()


def sweep_jobs(folder: Path) -> list[Path]:
    """The job folders of a sweep (those holding ``summary.json``), sorted by name."""
    return sorted(p for p in Path(folder).iterdir() if (p / "summary.json").is_file())


#: columns of labels, kept as text (client 01 is not client 1)
LABELS = ("client", "parameter", "status", "method")


def _read_csv(path: Path) -> pd.DataFrame:
    """A table as written, each number parsed by Python's ``float`` (the shortest repr that
    pandas writes reads back to the same double) and whole numbers as integers; label
    columns as text."""
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    for c in df.columns:
        if c in LABELS:
            continue
        text = df[c].replace("", "nan")
        try:
            values = text.astype(float)
        except ValueError:
            continue
        whole = values.notna().all() and text.str.fullmatch(r"-?\d+").all()
        df[c] = values.astype(int) if whole else values
    return df


def read_run(folder, name: str = "run_dir") -> dict:
    """A finished run's ``settings`` (checked, from ``config.yaml``), ``summary``, ``tables``
    (DataFrames, floats read back bit for bit) and ``clients`` (the labels of
    ``clients.csv``, else of ``k_clients.csv``, else none). A folder that is not a run, or a
    run without final estimates (diverged, refused), raises :class:`ConfigError`."""
    from fnsysid.config.schema import settings_from

    folder = Path(folder)
    if folder.is_dir() and is_sweep(folder):
        jobs = [p.name for p in sweep_jobs(folder)]
        raise ConfigError(f"{name}={folder} is a sweep; allowed: one of its job folders "
                          f"({', '.join(some(jobs, 5)) or 'none finished'})")
    summary = _summary(folder, name)
    if not (folder / "estimates.csv").is_file():
        raise ConfigError(f"{name}={folder}: the run ended with status "
                          f"'{summary.get('status')}' and has no estimates.csv: no model")
    try:
        plain = yaml.safe_load((folder / "config.yaml").read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{name}={folder}: config.yaml cannot be read ({exc})") from None
    settings = settings_from(plain)
    tables = {t: _read_csv(folder / f"{t}.csv") for t in TABLES
              if (folder / f"{t}.csv").is_file()}
    clients = []
    for t in ("clients", "k_clients"):
        if t in tables and "client" in tables[t]:
            clients = list(dict.fromkeys(tables[t]["client"].astype(str)))
            break
    return {"settings": settings, "summary": summary, "tables": tables, "clients": clients}


def _scores(summary: dict) -> str:
    shown = [f"{k.removeprefix('final_')} {summary[k]:.4g}" for k in SCORES
             if isinstance(summary.get(k), (int, float))]
    return ", ".join(shown) if shown else "no scores"


def _run_lines(folder: Path, summary: dict, full: bool) -> list[str]:
    head = (f"status {summary.get('status')}, {summary.get('rounds_completed')} rounds; "
            f"system={summary.get('system')}, feature_map={summary.get('feature_map')}, "
            f"strategy={summary.get('strategy')}, M={summary.get('M')}")
    lines = [head, f"scores: {_scores(summary)}"]
    if summary.get("error"):
        lines.append(f"error: {summary['error']}")
    eq = folder / "equations.txt"
    if eq.is_file():
        model = eq.read_text().splitlines()
        lines.append("equations:")
        lines += [f"  {ln}" for ln in (model if full else short_form(model, str(eq)))]
    else:
        lines.append("equations: none (no equations.txt: no model to show)")
    return lines


def show_text(folder, full: bool = True) -> list[str]:
    """What ``fnsysid show`` prints: a run's status, scores and equations; for a sweep, each
    job's (equations in their short form)."""
    folder = Path(folder)
    if folder.is_dir() and is_sweep(folder):
        jobs = sweep_jobs(folder)
        if not jobs:
            raise ConfigError(f"RUN_DIR={folder} is a sweep with no finished job (no "
                              "summary.json in its job folders)")
        lines = [f"sweep {folder}: {len(jobs)} job(s)"]
        for job in jobs:
            lines += ["", f"{job.name}:"]
            lines += [f"  {ln}" for ln in _run_lines(job, _summary(job, "RUN_DIR"), False)]
        return lines
    summary = _summary(folder, "RUN_DIR")
    return [f"run {folder}:", *_run_lines(folder, summary, full)]


def statuses(folder) -> list:
    """The status of the run in ``folder``, or of each finished job of a sweep."""
    folder = Path(folder)
    runs = sweep_jobs(folder) if is_sweep(folder) else [folder]
    return [_summary(r, "RUN_DIR").get("status") for r in runs]
