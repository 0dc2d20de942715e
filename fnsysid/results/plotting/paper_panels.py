"""The panels of the paper's figures (``scripts/make_figure.py``, ``scripts/figures.yaml``):
curves over rounds (:func:`fnsysid.results.plotting.sweep_plots.plot_sweep`), the final error
against a knob (:func:`plot_final`, with Theorem 1's bound), the per-parameter errors
(:func:`plot_params`), laid out and saved by :func:`figure`.

Like the sweep plots, the panels only read what runs wrote; the experiments are run by
``scripts/make_figure.py``.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.lines
import numpy as np
import pandas as pd

from fnsysid.results.plotting.style import (
    KNOBS,
    METRICS,
    STYLE,
    band,
    below_axes,
    curve_style,
    curve_text,
    legend_below,
    locked,
    new_figure,
    readable_log,
    round_axis,
    save,
    sort_value,
    style_axes,
    wrap,
)
from fnsysid.results.plotting.sweep_plots import (
    final_errors,
    legend_entries,
    mark_not_drawn,
    plot_sweep,
)
from fnsysid.results.sweep import (
    declared_keys,
    kept_errors,
    load_yaml,
    read_sweep,
    swept_keys,
    typed,
)


def not_drawn_rows(ax, jobs: list[dict], keys: list[str]) -> list[dict]:
    """:func:`~fnsysid.results.plotting.sweep_plots.mark_not_drawn` for every job that did
    not finish ``ok``, labelled by its values of ``keys``.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The axes whose legend names the jobs.
    jobs : list of dict
        The panel's jobs (:func:`fnsysid.results.sweep.read_sweep`: ``dir``, ``overrides``,
        ``summary``, ``errors`` each).
    keys : list of str
        The keys that label a job.

    Returns
    -------
    list of dict
        One table row per job not drawn (``series``, the keys, ``status``).
    """
    rows = []
    for j in jobs:
        if j["summary"]["status"] != "ok":
            values = {k: j["overrides"].get(k) for k in keys}
            label = mark_not_drawn(ax, j, ", ".join(f"{k}={v}" for k, v in values.items()),
                                   curve_text(list(values), list(values.values())))
            rows.append({"series": label, **{k: typed(v) for k, v in values.items()},
                         "status": j["summary"]["status"]})
    return rows


def slope(x, y) -> float:
    """Least-squares slope of log(y) against log(x).

    Parameters
    ----------
    x, y : array_like of float, shape (n,)
        Positive values, n >= 2.

    Returns
    -------
    float
    """
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def plot_final(jobs: list[dict], ax, x: str, metric: str = "e_max", sqrt: bool = False,
               loglog: bool = True, title: str | None = None, fit: bool = True,
               bound: bool = False, keys: list[str] | None = None,
               ref: bool = False) -> list[dict]:
    """Final error (mean over repeats, min..max band) against swept knob ``x``; one line per
    combination of the other swept knobs.

    Parameters
    ----------
    jobs : list of dict
        The panel's jobs (:func:`fnsysid.results.sweep.read_sweep`: ``dir``, ``overrides``,
        ``summary``, ``errors`` each).
    ax : matplotlib.axes.Axes
        The axes to draw on.
    x : str
        The swept knob on the x axis.
    metric : str, default="e_max"
        The column of ``errors.csv`` whose last round is taken.
    sqrt : bool, default=False
        Draw against ``sqrt(x)``.
    loglog : bool, default=True
        Logarithmic axes.
    title : str or None, default=None
        The axes' title.
    fit : bool, default=True
        The fitted log-log slope against ``x`` in the legend (with ``loglog``).
    bound : bool, default=False
        Also draw the right-hand side of Theorem 1 (relative form, dotted; ``bound_proof``
        dash-dotted when present).
    keys : list of str or None, default=None
        The swept keys; None: those whose values differ between ``jobs``.
    ref : bool, default=False
        A ``c / sqrt(x)`` reference line through the first point of the first curve.

    Returns
    -------
    list of dict
        The tidy table: one row per curve and value of ``x`` (and per job not drawn).
    """
    ax.set_prop_cycle(**STYLE)
    df = final_errors(jobs, metric)
    others = [k for k in (swept_keys(jobs) if keys is None else keys) if k != x]
    rows, b = not_drawn_rows(ax, jobs, [*others, x]), None      # not in df: listed only
    if df.empty:
        ax.set_title(title or "", fontsize=9)
        legend_below(ax, ncol=1)
        return rows
    df["_x"] = df[x].astype(float)
    groups = df.groupby(others, sort=False) if others else [((), df)]
    keyed = sorted(groups, key=lambda g: [sort_value(str(v)) for v in
                                          (g[0] if isinstance(g[0], tuple) else (g[0],))])
    markers = {}
    for key, g in keyed:
        g = g.sort_values("_x")
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{k}={v}" for k, v in zip(others, key, strict=True))
        label = label or "final error"
        shown = curve_text(others, key) or "final error"
        style = {"marker": "o", **curve_style(others, key, markers)}
        if bound:                       # the bounds' line styles tell them from the error
            style["linestyle"] = "-"
        xs = np.sqrt(g["_x"]) if sqrt else g["_x"]
        b = slope(g["_x"], g["final_mean"]) if len(g) > 1 and loglog and fit else None
        (line,) = ax.plot(xs, g["final_mean"], ms=4, **style,
                          label=shown + (f" (slope {b:+.2f})" if b is not None else ""))
        if ref and not any("final_mean" in r for r in rows):
            x0, y0 = float(g["_x"].iloc[0]), float(g["final_mean"].iloc[0])
            ax.plot(xs, y0 * np.sqrt(x0 / g["_x"]), color="0.4", ls=(0, (2, 2)), lw=1,
                    label=f"$c/\\sqrt{{{x}}}$ (slope $-1/2$)", zorder=1)
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
                if "bound_proof_rel" in g:
                    row["bound_proof_rel"] = r["bound_proof_rel"]
            rows.append(row)
        if bound:
            ax.plot(xs, g["bound_rel"], color=line.get_color(), **BOUNDS["bound_rel"][1])
            if "bound_proof_rel" in g and g["bound_proof_rel"].notna().all():
                ax.plot(xs, g["bound_proof_rel"], color=line.get_color(),
                        **BOUNDS["bound_proof_rel"][1])
    ax.set_xlabel(f"$\\sqrt{{{x}}}$" if sqrt else KNOBS.get(x, x))
    ax.set_ylabel(f"final {METRICS.get(metric, metric)}")
    if bound:
        ax.set_ylabel("final relative error and bound")
    if loglog:
        ax.set_xscale("log")
        ax.set_yscale("log")
        readable_log(ax)
    ax.grid(True, which="both", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=9)
    if bound:
        handles, labels = ax.get_legend_handles_labels()
        kinds = [matplotlib.lines.Line2D([], [], color="0.3", marker="o", ms=4,
                                         label=f"measured {METRICS.get(metric, metric)}")]
        kinds += [matplotlib.lines.Line2D([], [], color="0.3", label=text, **kw)
                  for text, kw in BOUNDS.values()]
        ax.legend(handles + kinds, labels + [k.get_label() for k in kinds], fontsize=7,
                  loc="upper center", bbox_to_anchor=(0.5, 0.0),
                  bbox_transform=below_axes(ax), ncol=1, frameon=False)
        ax.legend_rows_below = len(labels) + len(kinds)
    elif len(ax.get_legend_handles_labels()[1]) > 1 or b is not None:
        legend_below(ax, ncol=1)
    return rows


#: Theorem 1's bound in :func:`plot_final` (``bound=True``): the column, its legend text and
#: line style (the curve's colour); both relative, divided by min_i ||theta_i*||, as e_r is
BOUNDS = {"bound_rel": ("bound as stated (plug-in)", {"ls": ":", "lw": 1.5}),
          "bound_proof_rel": ("bound (corrected constants, plug-in)", {"ls": "-.", "lw": 1})}


def plot_params(jobs: list[dict], ax, x: str, title: str | None = None,
                column: str = "rel_error_max") -> list[dict]:
    """Relative error of each identified parameter (``estimates.csv``, mean over repeats with
    its min..max band) against swept knob ``x``, log-log; one line per parameter.

    Parameters
    ----------
    jobs : list of dict
        The panel's jobs (:func:`fnsysid.results.sweep.read_sweep`: ``dir``, ``overrides``,
        ``summary``, ``errors`` each).
    ax : matplotlib.axes.Axes
        The axes to draw on.
    x : str
        The swept knob on the x axis (numeric).
    title : str or None, default=None
        The axes' title.
    column : str, default="rel_error_max"
        The column of ``estimates.csv`` drawn.

    Returns
    -------
    list of dict
        The tidy table: one row per parameter and value of ``x`` (and per job not drawn).
    """
    ax.set_prop_cycle(**STYLE)
    rows = not_drawn_rows(ax, jobs, [x])              # no estimates.csv: listed only
    frames = [pd.read_csv(Path(j["dir"]) / "estimates.csv").assign(
        **{x: float(j["overrides"][x])}) for j in jobs if j["summary"]["status"] == "ok"]
    if not frames:
        ax.set_title(title or "", fontsize=9)
        legend_below(ax, ncol=1)
        return rows
    df = pd.concat(frames, ignore_index=True)
    g = df.groupby(["parameter", x], sort=False)[column]
    stats = pd.DataFrame({"mean": g.mean(), "lo": g.min(), "hi": g.max(),
                          "n_repeats": g.size()}).reset_index()
    for name in dict.fromkeys(df["parameter"]):
        s = stats[stats["parameter"] == name].sort_values(x)
        if not s["mean"].notna().any():
            continue                                   # truth 0: relative error undefined
        (line,) = ax.plot(s[x], s["mean"], "o-", ms=3.5, label=name)
        ax.fill_between(s[x], s["lo"], s["hi"], color=line.get_color(), alpha=0.1, lw=0)
        rows += [{"series": name, "parameter": name, x: typed(str(int(v) if v.is_integer()
                                                                  else v)),
                  column: m, f"{column}_min": lo, f"{column}_max": hi, "n_repeats": n}
                 for v, m, lo, hi, n in zip(s[x], s["mean"], s["lo"], s["hi"], s["n_repeats"],
                                            strict=True)]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(x)
    ax.set_ylabel(r"$\max_i |\hat\theta_p - \theta_{i,p}^*| / |\theta_{i,p}^*|$")
    ax.grid(True, which="both", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=9)
    legend_below(ax, ncol=2)
    return rows


def matches(overrides: dict, where: dict) -> bool:
    """Whether a job's overrides have the values of ``where``.

    Parameters
    ----------
    overrides : dict of str to str
        The job's overrides (``.hydra/overrides.yaml``).
    where : dict
        Each key's allowed value, or a list of allowed values (compared as strings).

    Returns
    -------
    bool
    """
    for k, v in where.items():
        allowed = [str(x) for x in v] if isinstance(v, (list, tuple)) else [str(v)]
        if overrides.get(k) not in allowed:
            return False
    return True


def panel_jobs(panel: dict) -> tuple[list[dict], list[str]]:
    """The jobs of a figure panel and the keys they differ in.

    Parameters
    ----------
    panel : dict
        ``dir`` (a multirun folder) and optionally ``where`` (:func:`matches`).

    Returns
    -------
    jobs : list of dict
        The finished jobs under ``dir`` that match ``where``.
    keys : list of str
        The sweep's declared keys that still take more than one value among them.

    Raises
    ------
    FileNotFoundError
        If no finished job matches.
    """
    jobs = [j for j in read_sweep(panel["dir"]) if matches(j["overrides"],
                                                            panel.get("where") or {})]
    if not jobs:
        raise FileNotFoundError(f"no finished jobs (errors.csv) under {panel['dir']}")
    declared = declared_keys(panel["dir"])
    keys = [k for k in swept_keys(jobs, declared)
            if len({j["overrides"].get(k) for j in jobs}) > 1]
    return jobs, keys


def samples_read(job_dir: Path) -> int:
    """Samples a client reads per round: K steps of ``batch_size`` (SGD) or ``N T`` (GD).

    Parameters
    ----------
    job_dir : path-like
        A job's folder (its ``config.yaml``; per-client ``N`` or ``K``: the largest).

    Returns
    -------
    int
    """
    cfg = load_yaml(Path(job_dir) / "config.yaml")
    n = cfg["N"] if isinstance(cfg["N"], int) else max(cfg["N"])
    per_step = cfg["optimizer"].get("batch_size") or n * cfg["T"]
    K = cfg["K"]
    K = max(K) if isinstance(K, list) else K       # per-client K_i: the largest
    return int(K) * int(per_step)


def solver_label(job_dir: Path, with_strategy: bool = True,
                 with_optimizer: bool = True) -> str:
    """The algorithm of a job in words: strategy, local solver, gradient reduction, scaling.

    Parameters
    ----------
    job_dir : path-like
        A job's folder (its ``config.yaml``).
    with_strategy : bool, default=True
        Name the strategy first (else the text starts ``local solver:``).
    with_optimizer : bool, default=True
        Name the local solver (``GD``, ``SGD batch 10``).

    Returns
    -------
    str
        E.g. ``FedAvg, GD, mean gradient, diagonal feature scaling``.
    """
    cfg = load_yaml(Path(job_dir) / "config.yaml")
    opt, strat = cfg.get("optimizer", {}), cfg.get("strategy", {})
    name = strat.get("_target_", "?").rsplit(".", 1)[-1]
    if with_strategy and name == "OneShot":
        return "OneShot: each client's least squares, averaged (no local solver)"
    if with_strategy and name == "Centralized" and strat.get("exact"):
        return "pooled least squares (no local solver)"
    parts = [name] if with_strategy else []
    kind = opt.get("_target_", "?").rsplit(".", 1)[-1]
    if with_optimizer:
        parts.append(f"SGD batch {opt['batch_size']}" if kind == "SGD" else kind)
    parts.append(f"{opt.get('reduction', 'sum')} gradient")
    scaling = opt.get("scale_features", "none")
    scaling = {True: "diagonal", False: "none"}.get(scaling, scaling)
    parts.append({"none": "unscaled features", "diagonal": "diagonal feature scaling",
                  "zscore": "z-scored features", "whiten": "whitened features"}
                 .get(scaling, f"{scaling} scaling"))
    if opt.get("schedule") == "inverse_k":
        parts.append("lr/k steps")
    return ", ".join(parts) if with_strategy else "local solver: " + ", ".join(parts)


def settle_round(jobs: list[dict], metric: str = "e_max", tol: float = 0.02) -> int:
    """Last round at which some curve (mean over repeats) is still more than ``tol``
    (relative) away from its final value: where the curves have settled.

    Parameters
    ----------
    jobs : list of dict
        The panel's jobs (:func:`fnsysid.results.sweep.read_sweep`: ``dir``, ``overrides``,
        ``summary``, ``errors`` each).
    metric : str, default="e_max"
        The column of ``errors.csv``.
    tol : float, default=0.02
        The relative distance from the final value that counts as settled.

    Returns
    -------
    int
    """
    last = 0
    for j in jobs:
        b = band(kept_errors(j), metric)["mean"]
        off = np.abs(b - b.iloc[-1]) > tol * abs(b.iloc[-1])
        if off.any():
            last = max(last, int(b.index[off.to_numpy()].max()))
    return last


@locked
def figure(panels: list[dict], out_base: Path, metric: str = "e_max",
           suptitle: str | None = None, ncols: int | None = None) -> pd.DataFrame:
    """Panels in a grid, saved as ``out_base``.png and .pdf.

    Titles are the panels' own, short; the settings, the solver and what lines and bands are
    belong in the caption. Panels of curves share one round axis, 0 to the largest R: linear,
    or, when a panel with ``xmax: auto`` settles within a tenth of its R
    (:func:`settle_round`), linear up to round 1 and logarithmic beyond
    (:func:`~fnsysid.results.plotting.style.round_axis`), which shows the first rounds and the
    last together. Curves of a method have its look
    (:data:`~fnsysid.results.plotting.style.METHODS`). When all panels draw the same curves
    (same labels), the figure has one legend.

    Parameters
    ----------
    panels : list of dict
        Each with ``dir`` (a multirun folder), ``title`` and optionally ``x`` (draw the final
        error against that knob instead of curves over rounds, :func:`plot_final`, with its
        ``sqrt``, ``loglog``, ``fit``, ``bound`` and ``ref``), ``params`` (with ``x``: the
        per-parameter errors, :func:`plot_params`), ``where`` (keep the jobs whose overrides
        have these values; a list allows several), ``xmax`` (``auto``: see above),
        ``against``, ``median`` and ``published``
        (:func:`~fnsysid.results.plotting.sweep_plots.plot_sweep`) and ``panel`` (its name in
        the table; default: its title).
    out_base : path-like
        The files' path without suffix (its folder is made).
    metric : str, default="e_max"
        The column of ``errors.csv`` drawn.
    suptitle : str or None, default=None
        A figure title.
    ncols : int or None, default=None
        Panels per row; None: all in one row.

    Returns
    -------
    pandas.DataFrame
        The tidy table of final errors, its first column ``panel``.
    """
    n = len(panels)
    ncols = ncols or n
    nrows = -(-n // ncols)
    fig = new_figure(figsize=(max(4.4 * ncols, 6.0), 3.3 * nrows + 0.9), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    loaded = [(panel, *panel_jobs(panel)) for panel in panels]
    curve_panels = [p for p, _, _ in loaded if not p.get("x")]
    shared = False
    if len(curve_panels) > 1:
        labels = [tuple(sorted({j["overrides"].get(k, "") for j in jobs for k in keys}))
                  for p, jobs, keys in loaded if not p.get("x")]
        key_sets = {tuple(keys) for p, jobs, keys in loaded if not p.get("x")}
        shared = len(set(labels)) == 1 and len(key_sets) == 1 and len(curve_panels) == n
    tables, rounds = [], []
    width = 48                                          # characters per panel title line
    for ax, (panel, jobs, keys) in zip(axes.flat, loaded, strict=False):
        title = wrap(panel.get("title", ""), width)
        if panel.get("x") == "samples_read":                # derived from each job's config
            for j in jobs:
                j["overrides"] = {**j["overrides"], "samples_read": str(samples_read(j["dir"]))}
            keys = [k for k in keys if k != "K"]
        if panel.get("params"):
            rows = plot_params(jobs, ax, panel["x"], title=title)
            readable_log(ax)
        elif panel.get("x"):
            rows = plot_final(jobs, ax, panel["x"], metric, sqrt=panel.get("sqrt", False),
                              loglog=panel.get("loglog", True), title=title,
                              fit=panel.get("fit", True), bound=panel.get("bound", False),
                              keys=keys, ref=panel.get("ref", False))
        else:
            against = panel.get("against", "round")
            rows = plot_sweep(jobs, ax, metric, keys=keys, title=title, legend=not shared,
                              median=panel.get("median", False),
                              published=panel.get("published"), against=against)
            if against != "round":          # an axis of its own, not the shared rounds
                tables.append(pd.DataFrame(rows).assign(
                    panel=panel.get("panel", panel.get("title", ""))))
                continue
            R = int(max(j["errors"]["round"].max() for j in jobs))
            early = panel.get("xmax") == "auto" and 10 * settle_round(jobs, metric) <= R
            rounds.append((ax, R, early))
        tables.append(pd.DataFrame(rows).assign(panel=panel.get("panel",
                                                                panel.get("title", ""))))
    R = max((r for _, r, _ in rounds), default=0)
    scale = "symlog" if any(early for _, _, early in rounds) else "linear"
    for ax, _, _ in rounds:                     # one round axis for every panel of curves
        round_axis(ax, R, scale)
        style_axes(ax, metric)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    below = [max(getattr(ax, "legend_rows_below", 0) for ax in row) for row in axes]
    fig.set_size_inches(fig.get_size_inches()[0],
                        fig.get_size_inches()[1] + 0.18 * sum(below) + 0.4 * (sum(below) > 0))
    if shared:
        handles, labels = legend_entries(axes.flat[:n])
        fig.legend(handles, labels, loc="outside lower center",
                   ncol=legend_columns(labels, fig.get_size_inches()[0]),
                   fontsize=8, frameon=False)
    if suptitle:
        fig.suptitle(wrap(suptitle, int(12.5 * fig.get_size_inches()[0])), fontsize=9.5)
    out_base = Path(out_base)
    out_base.parent.mkdir(parents=True, exist_ok=True)
    save(fig, [out_base.with_suffix(".png"), out_base.with_suffix(".pdf")], dpi=110)
    table = pd.concat(tables, ignore_index=True)
    cols = ["panel"] + [c for c in table.columns if c != "panel"]
    return table[cols]


def legend_columns(labels: list[str], width: float, most: int = 8) -> int:
    """Columns of a legend below a figure: as many as its longest label fits (about 16
    characters an inch at font size 8, plus the handle), so that long labels do not run off
    the figure.

    Parameters
    ----------
    labels : list of str
        The legend's labels.
    width : float
        The figure's width in inches.
    most : int, default=8
        The most columns.

    Returns
    -------
    int
        At least 1.
    """
    longest = max((len(str(label)) for label in labels), default=1) + 6
    return max(1, min(len(labels), most, int(16 * width // longest)))
