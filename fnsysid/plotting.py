"""Figures from result folders: one run's e_r against r, and one panel per multirun sweep.

Plotting only reads what runs wrote (``errors.csv``, ``.hydra/overrides.yaml``,
``summary.json``); it never runs an experiment.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402

METRICS = {"e_max": r"$e_r = \max_i e_r^{(i)}$", "e_mean": r"mean$_i\, e_r^{(i)}$"}


def band(errors: pd.DataFrame, metric: str = "e_max") -> pd.DataFrame:
    """Per round: mean, min and max over repeats of ``metric``."""
    g = errors.groupby("round")[metric]
    return pd.DataFrame({"mean": g.mean(), "lo": g.min(), "hi": g.max()})


def draw_curve(ax, errors: pd.DataFrame, label: str, metric: str = "e_max", **kw):
    """Mean over repeats with a min-max band."""
    b = band(errors, metric)
    (line,) = ax.plot(b.index, b["mean"], label=label, **kw)
    ax.fill_between(b.index, b["lo"], b["hi"], color=line.get_color(), alpha=0.2, lw=0)
    return line


def style_axes(ax, metric: str = "e_max", log: bool = True) -> None:
    ax.set_xlabel("communication round $r$")
    ax.set_ylabel(METRICS.get(metric, metric))
    if log:
        ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)


def plot_run(errors: pd.DataFrame, path: Path, title: str = "") -> None:
    """e_r against r for one run: max over clients (solid) and mean over clients (dashed)."""
    fig, ax = plt.subplots(figsize=(5, 3.6), layout="constrained")
    line = draw_curve(ax, errors, "max over clients", "e_max")
    draw_curve(ax, errors, "mean over clients", "e_mean", ls="--", color=line.get_color())
    style_axes(ax)
    n_rep = errors["repeat"].nunique()
    ax.set_title(f"{title}\nmean over {n_rep} repeats, band = min..max", fontsize=8)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def read_sweep(sweep_dir: Path) -> list[dict]:
    """Jobs of a multirun folder: overrides, summary and errors of each finished job."""
    jobs = []
    for ov in sorted(Path(sweep_dir).glob("**/.hydra/overrides.yaml")):
        job = ov.parent.parent
        if not (job / "errors.csv").exists():
            continue
        overrides = dict(o.split("=", 1) for o in yaml.safe_load(ov.read_text()) or [])
        summary = json.loads((job / "summary.json").read_text())
        jobs.append({"dir": job, "overrides": overrides, "summary": summary,
                     "errors": pd.read_csv(job / "errors.csv")})
    return jobs


def swept_keys(jobs: list[dict]) -> list[str]:
    """Override keys whose value differs between jobs."""
    keys = sorted({k for j in jobs for k in j["overrides"]})
    return [k for k in keys if len({j["overrides"].get(k) for j in jobs}) > 1]


def _sort_value(v: str):
    try:
        return (0, float(v), "")
    except ValueError:
        return (1, 0.0, v)


def plot_sweep(jobs: list[dict], ax, metric: str = "e_max", keys: list[str] | None = None,
               title: str | None = None) -> list[dict]:
    """One curve per swept value (legend ``M=9``), on ``ax``. Returns a final-error table."""
    keys = keys or swept_keys(jobs)
    jobs = sorted(jobs, key=lambda j: [_sort_value(j["overrides"].get(k, "")) for k in keys])
    rows = []
    for j in jobs:
        label = ", ".join(f"{k}={j['overrides'].get(k)}" for k in keys) or "run"
        status = j["summary"]["status"]
        if status != "ok":
            label += f" (diverged at r={j['summary']['diverged_round']})"
            rows.append({"curve": label, "status": status})
            continue
        draw_curve(ax, j["errors"], label, metric)
        last = j["errors"][j["errors"]["round"] == j["errors"]["round"].max()]
        rows.append({"curve": label, "status": status, "R": int(last["round"].iloc[0]),
                     f"final_{metric}_mean": float(last[metric].mean()),
                     f"final_{metric}_std": float(last[metric].std(ddof=0))})
    style_axes(ax, metric)
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return rows


def sweep_figure(sweep_dir: Path, outs, metric: str = "e_max", title: str | None = None):
    """Draw one panel for a multirun folder into each path of ``outs`` (format by suffix)."""
    jobs = read_sweep(sweep_dir)
    if not jobs:
        raise FileNotFoundError(f"no finished jobs (errors.csv) under {sweep_dir}")
    fig, ax = plt.subplots(figsize=(5, 3.6), layout="constrained")
    rows = plot_sweep(jobs, ax, metric, title=title)
    for out in outs:
        fig.savefig(out, dpi=120)
    plt.close(fig)
    return pd.DataFrame(rows)


