"""Figures of a multirun sweep (``fnsysid-plot``, :mod:`fnsysid.app.plot_cli`): one curve
per swept value (:func:`plot_sweep`), a grid of panels (:func:`sweep_figure`) and a heat map of
the final errors (:func:`sweep_heatmap`).

Plotting only reads what runs wrote (``errors.csv``, ``.hydra/overrides.yaml``,
``summary.json``); it never runs an experiment. Jobs that did not finish ``ok`` are named in
the legend with their status (:func:`mark_not_drawn`), not drawn.
"""

from __future__ import annotations

import matplotlib.colors
import numpy as np
import pandas as pd

from fnsysid.results.plotting.style import (
    METRICS,
    STYLE,
    curve_style,
    curve_text,
    draw_curve,
    knob_text,
    legend_below,
    locked,
    method_order,
    new_figure,
    save,
    sort_value,
    style_axes,
)
from fnsysid.results.sweep import (
    dist_to_pooled,
    diverged_repeats,
    kept_errors,
    swept_keys,
    typed,
)
from fnsysid.results.tables import last_round

#: x-axis labels of :func:`plot_sweep`'s ``against`` columns
AGAINST = {"bytes_per_client": "bytes sent and received per client (cumulative, log)"}


def plot_sweep(jobs: list[dict], ax, metric: str = "e_max", keys: list[str] | None = None,
               title: str | None = None, legend: bool = True, median: bool = False,
               published: dict | None = None, against: str = "round") -> list[dict]:
    """One curve per swept value (legend ``M = 9``), on ``ax``: the mean over repeats with
    its min..max band; a job that did not finish ``ok`` is named in the legend, not drawn.

    Parameters
    ----------
    jobs : list of dict
        The sweep's jobs (:func:`fnsysid.results.sweep.read_sweep`: ``dir``, ``overrides``,
        ``summary``, ``errors`` each).
    ax : matplotlib.axes.Axes
        The axes to draw on.
    metric : str, default="e_max"
        The column of ``errors.csv`` drawn.
    keys : list of str or None, default=None
        The keys that name the curves; None: those whose values differ between ``jobs``.
    title : str or None, default=None
        The axes' title.
    legend : bool, default=True
        Draw the axes' legend (False: the figure draws one for several axes).
    median : bool, default=False
        Also mark the median over repeats (dots).
    published : dict or None, default=None
        ``{"key": "M", "values": {1: 0.953, ...}, "tol": 0.1}``: marks the published final
        error of each curve (at the last round) and adds to the table the fraction of repeats
        whose final error lies within ``tol`` (relative) of it.
    against : str, default="round"
        The x of the curves: ``round``, or a column of ``errors.csv`` such as
        ``bytes_per_client`` (then a log axis and its final value in the table; a job without
        that column is not drawn).

    Returns
    -------
    list of dict
        The final-error table, one row per curve (its label, keys, status, and the final
        ``metric``'s mean, std, standard error, median, min and max over repeats).
    """
    ax.set_prop_cycle(**STYLE)
    keys = swept_keys(jobs) if keys is None else keys
    jobs = sorted(jobs, key=lambda j: [sort_value(j["overrides"].get(k, "")) for k in keys])
    distance = dist_to_pooled(jobs)
    pooled = next((last_round(j["errors"]).set_index("repeat")[metric] for j in jobs
                   if j["summary"].get("strategy") == "centralized_exact"
                   and j["summary"]["status"] == "ok"), None)
    rows, markers = [], {}
    for i, j in enumerate(jobs):
        values = [j["overrides"].get(k) for k in keys]
        label = ", ".join(f"{k}={v}" for k, v in zip(keys, values, strict=True)) or "run"
        shown = curve_text(keys, values) or "run"
        status = j["summary"]["status"]
        gone = diverged_repeats(j)
        errors = kept_errors(j)
        if status != "ok" and (not gone or errors.empty):
            rows.append({"curve": mark_not_drawn(ax, j, label, shown), "status": status})
            continue
        if against != "round" and (against not in errors or errors[against].isna().all()):
            rows.append({"curve": label, "status": f"no {against} in errors.csv"})
            continue
        if gone:                       # the mean over the repeats that did not diverge
            note = (f" ({len(gone)} of {len(gone) + errors['repeat'].nunique()} repeats "
                    f"{status_text(j['summary'])}; not in the mean)")
            label, shown = label + note, shown + note
        style = curve_style(keys, values, markers)
        if "marker" in style:
            style.update(ms=4, markevery=0.1)
        draw_curve(ax, errors, shown, metric, median=median, against=against, **style)
        last = last_round(errors)
        v = last[metric]
        rows.append({"curve": label, **{k: typed(j["overrides"].get(k)) for k in keys},
                     "status": status, "R": int(last["round"].iloc[0]),
                     f"final_{metric}_mean": float(v.mean()),
                     f"final_{metric}_std": float(v.std(ddof=0)),
                     f"final_{metric}_se": float(v.std(ddof=1) / np.sqrt(v.size))
                     if v.size > 1 else np.nan,
                     f"final_{metric}_median": float(v.median()),
                     f"final_{metric}_min": float(v.min()), f"final_{metric}_max": float(v.max()),
                     "n_repeats": int(v.size), "repeats_diverged": len(gone)})
        if against != "round":
            rows[-1][f"final_{against}"] = float(last[against].mean())
        if pooled is not None:            # the pooled least squares on the same repeats
            rows[-1][f"pooled_{metric}_mean"] = float(pooled.reindex(last["repeat"]).mean())
        if i in distance:                 # to the pooled least squares, over the repeats
            d = distance[i]
            rows[-1].update({"dist_to_pooled": float(d.mean()),
                             "dist_to_pooled_std": float(d.std(ddof=0)),
                             "dist_to_pooled_min": float(d.min()),
                             "dist_to_pooled_max": float(d.max())})
        if published:
            pub = {str(k): float(x) for k, x in published["values"].items()}
            value = pub.get(str(j["overrides"].get(published["key"])))
            if value is not None:
                tol = float(published.get("tol", 0.1))
                near = float((np.abs(v - value) <= tol * value).mean())
                ax.plot([last["round"].iloc[0]], [value], "X", ms=7, mec="black", mew=0.8,
                        color=ax.get_lines()[-2 if median else -1].get_color(), zorder=4,
                        clip_on=False)
                rows[-1].update({"published": value, "near_tol": tol,
                                 "fraction_near_published": near})
    if median:
        ax.plot([], [], ls="none", marker="o", ms=3.5, color="0.3", label="median over repeats")
    if any("published" in r for r in rows):
        ax.plot([], [], ls="none", marker="X", ms=7, mec="black", mew=0.8, color="0.6",
                label="published final error")
    style_axes(ax, metric)
    if against != "round":
        ax.set_xscale("log")
        ax.set_xlabel(AGAINST.get(against, against))
    if title:
        ax.set_title(title, fontsize=9)
    if not legend:
        return rows
    if len(jobs) > 6:
        legend_below(ax, ncol=3, fontsize=6.5)
    else:
        ax.legend(*method_order(*ax.get_legend_handles_labels()), fontsize=7)
    return rows


#: the ``gid`` of the legend entries of jobs not drawn (:func:`mark_not_drawn`)
NOT_DRAWN = "not drawn"


def status_text(summary: dict, sep: str = " at ") -> str:
    """A job's status with the round it diverged at: ``diverged at r=22``, ``interrupted``.

    Parameters
    ----------
    summary : dict
        The job's ``summary.json`` (``status``, ``diverged_round``).
    sep : str, default=" at "
        What joins the status and the round.

    Returns
    -------
    str
    """
    status = summary["status"]
    at = summary.get("diverged_round") if status == "diverged" else None
    return status + (f"{sep}r={at}" if at is not None else "")


def mark_not_drawn(ax, job: dict, label: str, shown: str | None = None) -> str:
    """A legend entry (a red x, no line) for a job that did not finish ``ok`` (diverged,
    growing, interrupted, ...), which is not drawn: its label with the status and the round
    (``diverged at r=22; not drawn``, ``growing; not drawn``).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The axes whose legend names the job.
    job : dict
        The job (:func:`fnsysid.results.sweep.read_sweep`).
    label : str
        The job's label in the table.
    shown : str or None, default=None
        Its label in the legend; None: ``label``.

    Returns
    -------
    str
        ``label`` with the status's ending (for the table).
    """
    end = f" ({status_text(job['summary'])}; not drawn)"
    ax.plot([], [], ls="none", marker="x", color="firebrick", label=(shown or label) + end,
            gid=NOT_DRAWN)
    return label + end


def legend_entries(axes) -> tuple[list, list]:
    """One legend for several axes that draw the same curves: each label once, and every
    job not drawn (:func:`mark_not_drawn`) with the first line of its panel's title.

    Parameters
    ----------
    axes : iterable of matplotlib.axes.Axes
        The panels.

    Returns
    -------
    handles : list of matplotlib.artist.Artist
    labels : list of str
        In the order of :func:`~fnsysid.results.plotting.style.method_order`.
    """
    entries: dict = {}
    for ax in axes:
        panel = ax.get_title().split("\n")[0]
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if handle.get_gid() == NOT_DRAWN and panel:
                label = f"{panel}: {label}"
            entries.setdefault(label, handle)
    return method_order(list(entries.values()), list(entries))


def final_errors(jobs: list[dict], metric: str = "e_max") -> pd.DataFrame:
    """One row per finished job: its overrides and the final error over repeats.

    Parameters
    ----------
    jobs : list of dict
        The sweep's jobs (:func:`fnsysid.results.sweep.read_sweep`: ``dir``, ``overrides``,
        ``summary``, ``errors`` each).
    metric : str, default="e_max"
        The column of ``errors.csv`` whose last round is taken.

    Returns
    -------
    pandas.DataFrame
        The overrides, ``final_mean``, ``final_std``, ``final_min``, ``final_max``, ``R``,
        ``n_repeats``, ``bound_rel`` and ``bound_proof_rel`` (Theorem 1, from the summary).
    """
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
                     "bound_rel": j["summary"].get("theorem1", {}).get("bound_rel"),
                     "bound_proof_rel": j["summary"].get("theorem1", {}).get("bound_proof_rel")})
    return pd.DataFrame(rows)


@locked
def sweep_figure(jobs: list[dict], keys: list[str], outs, metric: str = "e_max",
                 title: str | None = None, panel_key: str | None = None) -> pd.DataFrame:
    """Curves of a sweep, saved to each path of ``outs``.

    One swept key: one panel, one curve per value. Two or more: one panel per value of
    ``panel_key``, one curve per combination of the others, with a single legend for the
    figure. Only swept keys appear in labels.

    Parameters
    ----------
    jobs : list of dict
        The sweep's jobs (:func:`fnsysid.results.sweep.read_sweep`: ``dir``, ``overrides``,
        ``summary``, ``errors`` each).
    keys : list of str
        The swept keys.
    outs : sequence of path-like
        The files to write (format by suffix).
    metric : str, default="e_max"
        The column of ``errors.csv`` drawn.
    title : str or None, default=None
        The figure's title.
    panel_key : str or None, default=None
        The key with one panel per value; None: the first of ``keys`` when there are several.

    Returns
    -------
    pandas.DataFrame
        The final-error table (:func:`plot_sweep`'s rows, with the panel).

    Raises
    ------
    ValueError
        If ``panel_key`` is not one of ``keys``.
    """
    if panel_key is not None and panel_key not in keys:
        raise ValueError(f"--panels {panel_key}: not a swept key; allowed: "
                         f"{', '.join(keys) or 'none (this folder sweeps no key)'}")
    if panel_key is None and len(keys) > 1:
        panel_key = keys[0]
    curve_keys = [k for k in keys if k != panel_key]
    groups = {"": jobs}
    if panel_key is not None:
        values = sorted({j["overrides"].get(panel_key) for j in jobs}, key=sort_value)
        groups = {f"{panel_key}={v}": [j for j in jobs if j["overrides"].get(panel_key) == v]
                  for v in values}
    n = len(groups)
    ncol = min(n, 3)
    nrow = -(-n // ncol)
    fig = new_figure(figsize=(4.2 * ncol, 3.2 * nrow + 0.6), layout="constrained")
    axes = fig.subplots(nrow, ncol, squeeze=False, sharex=True, sharey=True)
    tables = []
    for ax, (name, group) in zip(axes.flat, groups.items(), strict=False):
        shown = knob_text(panel_key, group[0]["overrides"].get(panel_key)) if name else title
        rows = plot_sweep(group, ax, metric, keys=curve_keys, title=shown, legend=False)
        tables.append(pd.DataFrame(rows).assign(panel=name))
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    handles, labels = legend_entries(axes.flat[:n])
    longest = max((len(str(lb)) for lb in labels), default=1)
    fig.legend(handles, labels, loc="outside lower center",
               ncol=max(1, min(len(labels), 6, 80 // (longest + 6))), fontsize=7,
               frameon=False)                    # columns that fit the figure's width
    n_rep = jobs[0]["errors"]["repeat"].nunique()
    head = f"{title}\n" if title and panel_key else ""
    fig.suptitle(f"{head}mean over {n_rep} repeats, band = min..max", fontsize=9)
    save(fig, outs, dpi=120)
    table = pd.concat(tables, ignore_index=True)
    return table[["panel"] + [c for c in table.columns if c != "panel"]]


@locked
def sweep_heatmap(jobs: list[dict], keys: list[str], outs, metric: str = "e_max",
                  title: str | None = None) -> pd.DataFrame:
    """Final error (mean over repeats) of a two-key sweep as a heat map: ``keys[0]`` across,
    ``keys[1]`` down, the value written in each cell (a job not ``ok``: its status).

    Parameters
    ----------
    jobs : list of dict
        The sweep's jobs (:func:`fnsysid.results.sweep.read_sweep`: ``dir``, ``overrides``,
        ``summary``, ``errors`` each).
    keys : list of str
        The two swept keys.
    outs : sequence of path-like
        The files to write (format by suffix).
    metric : str, default="e_max"
        The column of ``errors.csv`` whose last round is taken.
    title : str or None, default=None
        The figure's title.

    Returns
    -------
    pandas.DataFrame
        The finals (:func:`final_errors`), and a row with its status for each job not ``ok``.

    Raises
    ------
    ValueError
        If ``keys`` are not two.
    """
    if len(keys) != 2:
        raise ValueError(f"--heatmap needs exactly two swept keys; this folder sweeps "
                         f"{len(keys)} ({', '.join(keys) or 'none'}); allowed: a sweep of two "
                         "keys (fnsysid -m M=5,20 eps=0,1)")
    x, y = keys
    df = final_errors(jobs, metric).reindex(columns=[x, y, "final_mean", "final_min",
                                                     "final_max"])
    bad = [j for j in jobs if j["summary"]["status"] != "ok"]       # a cell naming the status
    xs = sorted({*df[x], *(j["overrides"].get(x) for j in bad)}, key=sort_value)
    ys = sorted({*df[y], *(j["overrides"].get(y) for j in bad)}, key=sort_value)
    grid = df.pivot(index=y, columns=x, values="final_mean").reindex(index=ys, columns=xs)
    fig = new_figure(figsize=(1.0 * len(xs) + 2.4, 0.6 * len(ys) + 1.6), layout="constrained")
    ax = fig.subplots()
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
    for j in bad:
        ax.text(xs.index(j["overrides"].get(x)), ys.index(j["overrides"].get(y)),
                status_text(j["summary"], sep="\n"), ha="center", va="center", fontsize=6.5,
                color="firebrick")
    ax.set_xticks(range(len(xs)), xs)
    ax.set_yticks(range(len(ys)), ys)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    fig.colorbar(im, ax=ax, label=f"final {METRICS.get(metric, metric)}")
    n_rep = jobs[0]["errors"]["repeat"].nunique()
    ax.set_title((f"{title}\n" if title else "") + f"mean over {n_rep} repeats", fontsize=9)
    save(fig, outs, dpi=120)
    if bad:
        df = pd.concat([df.assign(status="ok"), pd.DataFrame(
            [{x: j["overrides"].get(x), y: j["overrides"].get(y),
              "status": j["summary"]["status"]} for j in bad])], ignore_index=True)
    return df.reset_index(drop=True)
