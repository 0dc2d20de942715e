"""Figures from result folders: one run's e_r against r, and one panel per multirun sweep.

Plotting only reads what runs wrote (``errors.csv``, ``.hydra/overrides.yaml``,
``summary.json``); it never runs an experiment.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from .sweep import read_sweep, swept_keys, typed  # noqa: E402, F401
from .tables import last_round  # noqa: E402

#: colour and line-style cycle: neighbouring curves differ in both
STYLE = (plt.cycler(color=plt.get_cmap("tab10").colors)
         + plt.cycler(linestyle=["-", "--", "-.", ":", (0, (5, 1))] * 2))

METRICS = {"e_max": r"$e_r = \max_i e_r^{(i)}$", "e_mean": r"mean$_i\, e_r^{(i)}$",
           "nrmse_1step_max": "one-step NRMSE (held-out), max over clients",
           "nrmse_sim_max": "free-run NRMSE (held-out), max over clients"}


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
    """e_r against r for one run: max over clients (solid) and mean over clients (dashed).

    Without ground truth (``e_max`` empty) the held-out one-step NRMSE is drawn instead.
    """
    fig, ax = plt.subplots(figsize=(5, 3.6), layout="constrained")
    metric = "e_max" if errors["e_max"].notna().any() else "nrmse_1step_max"
    mean = metric.replace("_max", "_mean")
    line = draw_curve(ax, errors, "max over clients", metric)
    draw_curve(ax, errors, "mean over clients", mean, ls="--", color=line.get_color())
    style_axes(ax, metric)
    n_rep = errors["repeat"].nunique()
    ax.set_title(f"{title}\nmean over {n_rep} repeats, band = min..max", fontsize=8)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _sort_value(v: str):
    try:
        return (0, float(v), "")
    except ValueError:
        return (1, 0.0, v)


def plot_sweep(jobs: list[dict], ax, metric: str = "e_max", keys: list[str] | None = None,
               title: str | None = None, legend: bool = True) -> list[dict]:
    """One curve per swept value (legend ``M=9``), on ``ax``. Returns a final-error table.

    ``keys`` name the curves (default: the keys whose values differ between ``jobs``).
    """
    ax.set_prop_cycle(STYLE)
    keys = swept_keys(jobs) if keys is None else keys
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
        last = last_round(j["errors"])
        rows.append({"curve": label, "status": status, "R": int(last["round"].iloc[0]),
                     f"final_{metric}_mean": float(last[metric].mean()),
                     f"final_{metric}_std": float(last[metric].std(ddof=0))})
    style_axes(ax, metric)
    if title:
        ax.set_title(title, fontsize=9)
    if not legend:
        return rows
    if len(jobs) > 6:
        ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3,
                  frameon=False)
    else:
        ax.legend(fontsize=7)
    return rows


def final_errors(jobs: list[dict], metric: str = "e_max") -> pd.DataFrame:
    """One row per finished job: its overrides and the final error (mean, std over repeats)."""
    rows = []
    for j in jobs:
        if j["summary"]["status"] != "ok":
            continue
        final = last_round(j["errors"])
        last = final[metric]
        rows.append({**j["overrides"], "final_mean": float(last.mean()),
                     "final_std": float(last.std(ddof=0)), "final_min": float(last.min()),
                     "final_max": float(last.max()), "R": int(final["round"].iloc[0]),
                     "n_repeats": int(last.size),
                     "bound_rel": j["summary"].get("theorem1", {}).get("bound_rel")})
    return pd.DataFrame(rows)


def slope(x, y) -> float:
    """Least-squares slope of log(y) against log(x)."""
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def plot_final(jobs: list[dict], ax, x: str, metric: str = "e_max", sqrt: bool = False,
               loglog: bool = True, title: str | None = None, fit: bool = True,
               bound: bool = False) -> list[dict]:
    """Final error against swept knob ``x``; one line per combination of the other swept
    knobs, with the fitted log-log slope in the legend (``fit``) and, with ``bound``, the
    right-hand side of Theorem 1 (relative form, dotted). Returns the table."""
    ax.set_prop_cycle(STYLE)
    df = final_errors(jobs, metric)
    others = [k for k in swept_keys(jobs) if k != x]
    df["_x"] = df[x].astype(float)
    rows = []
    groups = df.groupby(others, sort=False) if others else [((), df)]
    keyed = sorted(groups, key=lambda g: [_sort_value(str(v)) for v in
                                          (g[0] if isinstance(g[0], tuple) else (g[0],))])
    for key, g in keyed:
        g = g.sort_values("_x")
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{k}={v}" for k, v in zip(others, key, strict=True)) or metric
        xs = np.sqrt(g["_x"]) if sqrt else g["_x"]
        b = slope(g["_x"], g["final_mean"]) if len(g) > 1 and loglog and fit else None
        (line,) = ax.plot(xs, g["final_mean"], "o-", ms=4,
                          label=label + (f" (slope {b:+.2f})" if b is not None else ""))
        ax.fill_between(xs, g["final_min"], g["final_max"], color=line.get_color(), alpha=0.12,
                        lw=0)
        for _, r in g.iterrows():                       # tidy: one row per (curve, x)
            row = {"series": label, **{k: typed(v) for k, v in zip(others, key, strict=True)},
                   x: typed(r[x]), "final_mean": r["final_mean"],
                   "final_std": r["final_std"], "final_min": r["final_min"],
                   "final_max": r["final_max"], "n_repeats": r["n_repeats"],
                   "slope_vs_" + x: b}
            if bound:
                row["bound_rel"] = r["bound_rel"]
            rows.append(row)
        if bound:
            ax.plot(xs, g["bound_rel"], ":", color=line.get_color(), lw=1.5,
                    label=f"Theorem 1 bound, {label}")
    ax.set_xlabel(f"$\\sqrt{{{x}}}$" if sqrt else x)
    ax.set_ylabel(f"final {METRICS.get(metric, metric)}")
    if loglog:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2,
              frameon=False)
    return rows


def figure(panels: list[dict], out_base: Path, metric: str = "e_max",
           suptitle: str | None = None) -> pd.DataFrame:
    """Panels side by side, saved as ``out_base``.png and .pdf; returns the table of finals.

    Each panel is a dict with ``dir`` (a multirun folder), ``title`` and optionally ``x``
    (draw the final error against that knob instead of curves over rounds), ``sqrt``,
    ``loglog``, ``fit`` (print the log-log slope), ``bound`` (Theorem 1's right-hand side) and
    ``where`` (keep the jobs whose overrides have these values).
    """
    fig, axes = plt.subplots(1, len(panels), figsize=(4.3 * len(panels), 3.5),
                             layout="constrained", squeeze=False)
    tables = []
    for ax, panel in zip(axes[0], panels, strict=True):
        jobs = [j for j in read_sweep(panel["dir"])
                if all(j["overrides"].get(k) == v for k, v in panel.get("where", {}).items())]
        if not jobs:
            raise FileNotFoundError(f"no finished jobs (errors.csv) under {panel['dir']}")
        if panel.get("x"):
            rows = plot_final(jobs, ax, panel["x"], metric, sqrt=panel.get("sqrt", False),
                              loglog=panel.get("loglog", True), title=panel.get("title"),
                              fit=panel.get("fit", True), bound=panel.get("bound", False))
        else:
            rows = plot_sweep(jobs, ax, metric, title=panel.get("title"))
        tables.append(pd.DataFrame(rows).assign(panel=panel.get("title", "")))
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    out_base = Path(out_base)
    out_base.parent.mkdir(parents=True, exist_ok=True)
    for suffix in (".png", ".pdf"):   # no creation date: regenerated files differ only if data do
        meta = {"CreationDate": None} if suffix == ".pdf" else {}
        fig.savefig(out_base.with_suffix(suffix), dpi=110, metadata=meta)
    plt.close(fig)
    table = pd.concat(tables, ignore_index=True)
    cols = ["panel"] + [c for c in table.columns if c != "panel"]
    return table[cols]


def _label(keys, values) -> str:
    return ", ".join(f"{k}={v}" for k, v in zip(keys, values, strict=True))


def sweep_figure(jobs: list[dict], keys: list[str], outs, metric: str = "e_max",
                 title: str | None = None, panel_key: str | None = None) -> pd.DataFrame:
    """Curves of a sweep, saved to each path of ``outs`` (format by suffix).

    One swept key: one panel, one curve per value. Two or more: one panel per value of
    ``panel_key`` (default: the first swept key), one curve per combination of the others,
    with a single legend for the figure. Only swept keys (``keys``) appear in labels.
    Returns the final-error table (one row per curve, with the panel).
    """
    if panel_key is not None and panel_key not in keys:
        raise ValueError(f"panel key {panel_key} is not swept; swept: {', '.join(keys)}")
    if panel_key is None and len(keys) > 1:
        panel_key = keys[0]
    curve_keys = [k for k in keys if k != panel_key]
    groups = {"": jobs}
    if panel_key is not None:
        values = sorted({j["overrides"].get(panel_key) for j in jobs}, key=_sort_value)
        groups = {f"{panel_key}={v}": [j for j in jobs if j["overrides"].get(panel_key) == v]
                  for v in values}
    n = len(groups)
    ncol = min(n, 3)
    nrow = -(-n // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.2 * nrow + 0.6),
                             layout="constrained", squeeze=False, sharex=True, sharey=True)
    tables = []
    for ax, (name, group) in zip(axes.flat, groups.items(), strict=False):
        rows = plot_sweep(group, ax, metric, keys=curve_keys, title=name or title,
                          legend=False)
        tables.append(pd.DataFrame(rows).assign(panel=name))
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 6),
               fontsize=7, frameon=False)
    n_rep = jobs[0]["errors"]["repeat"].nunique()
    head = f"{title}\n" if title and panel_key else ""
    fig.suptitle(f"{head}mean over {n_rep} repeats, band = min..max", fontsize=9)
    for out in outs:
        fig.savefig(out, dpi=120)
    plt.close(fig)
    table = pd.concat(tables, ignore_index=True)
    return table[["panel"] + [c for c in table.columns if c != "panel"]]


def sweep_heatmap(jobs: list[dict], keys: list[str], outs, metric: str = "e_max",
                  title: str | None = None) -> pd.DataFrame:
    """Final error (mean over repeats) of a two-key sweep as a heat map: ``keys[0]`` across,
    ``keys[1]`` down, the value written in each cell. Returns the table of finals."""
    if len(keys) != 2:
        raise ValueError(f"a heat map needs exactly two swept keys; this sweep has "
                         f"{len(keys)}: {', '.join(keys) or 'none'}")
    x, y = keys
    df = final_errors(jobs, metric)[[x, y, "final_mean", "final_min", "final_max"]]
    xs = sorted(df[x].unique(), key=_sort_value)
    ys = sorted(df[y].unique(), key=_sort_value)
    grid = df.pivot(index=y, columns=x, values="final_mean").reindex(index=ys, columns=xs)
    fig, ax = plt.subplots(figsize=(1.0 * len(xs) + 2.4, 0.6 * len(ys) + 1.6),
                           layout="constrained")
    vals = grid.to_numpy(float)
    positive = vals[np.isfinite(vals) & (vals > 0)]
    norm = None
    if positive.size and positive.max() / positive.min() > 10:
        norm = matplotlib.colors.LogNorm(positive.min(), positive.max())
    im = ax.imshow(vals, cmap="viridis", norm=norm, aspect="auto")
    for (r, c), v in np.ndenumerate(vals):
        if np.isfinite(v):
            ax.text(c, r, f"{v:.3g}", ha="center", va="center", fontsize=7,
                    color="white" if im.norm(v) < 0.5 else "black")
    ax.set_xticks(range(len(xs)), xs)
    ax.set_yticks(range(len(ys)), ys)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    fig.colorbar(im, ax=ax, label=f"final {METRICS.get(metric, metric)}")
    n_rep = jobs[0]["errors"]["repeat"].nunique()
    ax.set_title((f"{title}\n" if title else "") + f"mean over {n_rep} repeats", fontsize=9)
    for out in outs:
        fig.savefig(out, dpi=120)
    plt.close(fig)
    return df.reset_index(drop=True)




def plot_fit(measured, one_step, free_run, names, path: Path, title: str = "") -> None:
    """Held-out fit of one trajectory: measured states, one-step-ahead predictions and the
    free-run simulation from the first state, one panel per state."""
    measured = np.asarray(measured)
    n_x = measured.shape[-1]
    cols = min(n_x, 4)
    rows = -(-n_x // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False,
                             layout="constrained")
    t = np.arange(len(measured))
    for k, ax in enumerate(axes.ravel()):
        if k >= n_x:
            ax.set_visible(False)
            continue
        ax.plot(t, measured[:, k], "k-", lw=1.2, label="measured")
        ax.plot(t[1:], one_step[:, k], "o", ms=2.5, label="one-step")
        with np.errstate(invalid="ignore"):
            ax.plot(t, np.where(np.isfinite(free_run[:, k]), free_run[:, k], np.nan), "--",
                    lw=1.2, label="free run")
        ax.set_title(names[k], fontsize=8)
        ax.set_xlabel("sample", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
    axes[0, 0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)
