"""Figures from result folders: one run's e_r against r, and one panel per multirun sweep.

Plotting only reads what runs wrote (``errors.csv``, ``.hydra/overrides.yaml``,
``summary.json``); it never runs an experiment.

Figures are drawn without pyplot (a :class:`~matplotlib.figure.Figure` on its own
:class:`~matplotlib.backends.backend_agg.FigureCanvasAgg`: no global figure registry, no
backend switch), and each public drawing function holds one module lock while it draws, since
matplotlib's text layout and math text parser are shared by all figures of the process and are
not safe to use from several threads at once: runs in threads (``fnsysid.run`` with an
``output_dir`` each) draw their plots one after another.
"""

from __future__ import annotations

import functools
import textwrap
import threading
from pathlib import Path

import matplotlib
import matplotlib.colors
import matplotlib.lines
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from fnsysid.results.sweep import (  # noqa: F401
    declared_keys,
    dist_to_pooled,
    diverged_repeats,
    kept_errors,
    load_yaml,
    read_sweep,
    swept_keys,
    typed,
)
from fnsysid.results.tables import last_round

#: colour and line-style cycle (``ax.set_prop_cycle(**STYLE)``): neighbouring curves differ in
#: both
STYLE = {"color": list(matplotlib.colormaps["tab10"].colors),
         "linestyle": ["-", "--", "-.", ":", (0, (5, 1))] * 2}

#: one look per method in every figure (legend label, colour, line style); the colours mostly
#: of the Okabe-Ito palette (apart for colour-blind readers), the line styles apart in greyscale
METHODS = {
    "fedavg": ("FedAvg", "#0072B2", "-"),
    "fedprox": ("FedProx", "#E69F00", (0, (5, 2))),
    "fedlin": ("FedLin", "#009E73", "-."),
    "scaffold": ("SCAFFOLD", "#CC79A7", (0, (1, 1.5))),
    "fednova": ("FedNova", "#D55E00", (0, (6, 1.5, 1, 1.5, 1, 1.5))),
    "oneshot": ("one-shot", "#6A3D9A", (0, (3, 1.5))),
    "local": ("local", "#999999", (0, (1, 1))),
    "centralized_exact": ("pooled LS", "#000000", "-"),
    "centralized": ("centralized GD", "#555555", (0, (4, 1, 1, 1))),
    "cyclic": ("cyclic", "#8C510A", (0, (8, 2))),
    "personalized": ("personalized (auto)", "#44AA99", "-"),
}

#: names of knobs in legends and axis labels (other knobs keep their own name)
KNOBS = {"eps": "\u03b5", "strategy.fraction": "share of clients per round",
         "samples_read": "samples read per client and round"}

#: markers telling apart curves of one method that differ in another knob
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def method_style(strategy: str | None) -> dict:
    """``label``, ``color`` and ``linestyle`` of a method (a ``strategy`` option); an
    unknown method gets its own name and no fixed style (empty dict)."""
    if strategy not in METHODS:
        return {}
    label, color, ls = METHODS[strategy]
    return {"label": label, "color": color, "linestyle": ls}


def knob_text(key: str, value) -> str:
    """One knob's value as a legend shows it: ``FedAvg`` for a strategy, ``\u03b5 = 0.01``,
    ``M = 9``."""
    if key == "strategy":
        return method_style(value).get("label", str(value))
    if key == "optimizer":
        return {"gd": "GD", "sgd": "SGD"}.get(value, str(value))
    return f"{KNOBS.get(key, key)} = {value}"


def curve_text(keys, values) -> str:
    """The legend label of a curve: its knobs' values (:func:`knob_text`), strategy first."""
    pairs = sorted(zip(keys, values, strict=True), key=lambda kv: kv[0] != "strategy")
    return ", ".join(knob_text(k, v) for k, v in pairs)


def method_order(handles, labels) -> tuple[list, list]:
    """Legend entries with the methods' in the order of :data:`METHODS` (an entry is a
    method's when its label starts with the method's name), the others after them in their
    own order."""
    names = [label for label, _, _ in METHODS.values()]

    def rank(label: str) -> int:
        for i, name in enumerate(names):
            if label == name or label.startswith((name + ",", name + " (", name + ":")):
                return i
        return len(names)

    pairs = sorted(zip(handles, labels, strict=True), key=lambda hl: rank(hl[1]))
    return [h for h, _ in pairs], [lb for _, lb in pairs]


def curve_style(keys, values, markers: dict | None = None) -> dict:
    """Colour and line style of a curve: its method's (:data:`METHODS`) when ``strategy`` is
    one of ``keys``, and a marker per combination of the other knobs' values when there are
    others (``markers`` maps each combination to its marker, filled as curves come); without
    ``strategy``, nothing (the axes' colour cycle)."""
    values = dict(zip(keys, values, strict=True))
    style = method_style(values.pop("strategy", None))
    style.pop("label", None)
    if style and values and markers is not None:
        combo = tuple(values.values())
        style["marker"] = markers.setdefault(combo, MARKERS[len(markers) % len(MARKERS)])
    return style


#: held while a figure is drawn (see the module's docstring)
LOCK = threading.RLock()


def locked(draw):
    """``draw`` run under :data:`LOCK`."""
    @functools.wraps(draw)
    def run(*args, **kwargs):
        with LOCK:
            return draw(*args, **kwargs)
    return run


def new_figure(**kwargs) -> Figure:
    """A figure (``Figure(**kwargs)``) on an Agg canvas of its own, outside pyplot."""
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig

METRICS = {"e_max": r"$e_r = \max_i e_r^{(i)}$", "e_mean": r"mean$_i\, e_r^{(i)}$",
           "nrmse_1step_max": "one-step NRMSE (held-out), max over clients",
           "nrmse_sim_max": "free-run NRMSE (held-out), max over clients"}


#: x-axis labels of :func:`plot_sweep`'s ``against`` columns
AGAINST = {"bytes_per_client": "bytes sent and received per client (cumulative, log)"}


def band(errors: pd.DataFrame, metric: str = "e_max") -> pd.DataFrame:
    """Per round: mean, median, min and max over repeats of ``metric``."""
    g = errors.groupby("round")[metric]
    return pd.DataFrame({"mean": g.mean(), "median": g.median(), "lo": g.min(), "hi": g.max()})


def draw_curve(ax, errors: pd.DataFrame, label: str, metric: str = "e_max",
               median: bool = False, against: str = "round", **kw):
    """Mean over repeats with a min-max band (and the median, dotted, with ``median``),
    against the round or, with ``against``, another column of errors.csv (its mean over
    repeats at each round, e.g. ``bytes_per_client``)."""
    b = band(errors, metric)
    x = b.index if against == "round" else \
        errors.groupby("round")[against].mean().reindex(b.index).to_numpy()
    (line,) = ax.plot(x, b["mean"], label=label, **kw)
    ax.fill_between(x, b["lo"], b["hi"], color=line.get_color(), alpha=0.2, lw=0)
    if median:
        ax.plot(x, b["median"], ls="none", marker="o", ms=3.5, markevery=5,
                color=line.get_color())
    if against != "round":             # the final error at the bytes spent
        ax.plot(x[-1:], b["mean"].iloc[-1:], ls="none", marker="o", ms=5,
                color=line.get_color(), zorder=4)
    return line


def style_axes(ax, metric: str = "e_max", log: bool | str = "auto") -> None:
    """Axis labels and grid; ``log="auto"``: a log y-axis only when the curves span more
    than a decade (over less, a log axis shows one or two tick labels)."""
    ax.set_xlabel("communication round $r$")
    ax.set_ylabel(METRICS.get(metric, metric))
    if log == "auto":
        log = decades(ax) > 1
    if log:
        ax.set_yscale("log")
        readable_log(ax)
    ax.grid(True, which="both", alpha=0.3)


def decades(ax) -> float:
    """How many decades the positive y values of the lines on ``ax`` span."""
    ys = [np.asarray(line.get_ydata(), float) for line in ax.get_lines()]
    y = np.concatenate(ys) if ys else np.array([])
    y = y[np.isfinite(y) & (y > 0)]
    return float(np.log10(y.max() / y.min())) if y.size else 0.0


def wrap(text: str | None, width: int) -> str | None:
    """``text`` broken into lines of at most ``width`` characters (existing breaks kept)."""
    if not text:
        return text
    return "\n".join(textwrap.fill(part, width) for part in str(text).split("\n"))


def method_of(strategy: dict | None) -> str | None:
    """The method (a key of :data:`METHODS`) of a run's resolved ``strategy`` settings, from
    its class (``_target_``) and, for ``Centralized``, its ``exact`` flag; None if unknown."""
    target = str((strategy or {}).get("_target_", "")).rsplit(".", 1)[-1].lower()
    if target == "centralized" and (strategy or {}).get("exact"):
        target = "centralized_exact"
    return target if target in METHODS else None


@locked
def plot_run(errors: pd.DataFrame, path: Path | None = None, title: str = "",
             method: str | None = None, ax=None) -> Figure:
    """e_r against r for one run: max over clients (solid) and mean over clients (dashed),
    each the mean over repeats with its min..max band, in the colour of the run's ``method``
    (a key of :data:`METHODS`; the legend names it).

    Without ground truth (``e_max`` empty) the held-out one-step NRMSE is drawn instead.
    Drawn into ``ax`` if given (else a new figure), saved to ``path`` if given; returns the
    figure.
    """
    if ax is None:
        fig = new_figure(figsize=(5, 3.6), layout="constrained")
        ax = fig.subplots()
    fig = ax.figure
    style = method_style(method)
    name = style.pop("label", None)
    style.pop("linestyle", None)
    color = style.get("color", "C0")
    metric = "e_max" if errors["e_max"].notna().any() else "nrmse_1step_max"
    mean = metric.replace("_max", "_mean")
    same = bool(errors[metric].notna().any()) and np.allclose(
        errors[metric], errors[mean], rtol=1e-12, atol=0, equal_nan=True)
    head = f"{name}: " if name else ""
    draw_curve(ax, errors, head + "max over clients" + (" = mean (one client)" if same else ""),
               metric, color=color, lw=2.2)
    if not same:
        draw_curve(ax, errors, head + "mean over clients", mean, color=color, ls="--",
                   lw=1.4, zorder=3, alpha=0.75)
    round_axis(ax, int(errors["round"].max()))
    style_axes(ax, metric)
    if metric == "e_max":
        ax.set_ylabel(r"$e_r^{(i)}$: max and mean over clients")
    n_rep = errors["repeat"].nunique()
    ax.set_title(wrap(title, 70), fontsize=8)
    ax.legend(fontsize=8, title_fontsize=7,
              title=(f"mean over {n_rep} repeats, band min..max" if n_rep > 1 else None))
    if path is not None:
        save(fig, [path], dpi=120)
    return fig


def _sort_value(v: str):
    try:
        return (0, float(v), "")
    except ValueError:
        return (1, 0.0, v)


def plot_sweep(jobs: list[dict], ax, metric: str = "e_max", keys: list[str] | None = None,
               title: str | None = None, legend: bool = True, median: bool = False,
               published: dict | None = None, against: str = "round") -> list[dict]:
    """One curve per swept value (legend ``M=9``), on ``ax``. Returns a final-error table.

    ``keys`` name the curves (default: the keys whose values differ between ``jobs``).
    ``published`` (``{"key": "M", "values": {1: 0.953, ...}, "tol": 0.1}``) marks the published
    final error of each curve (x at the last round) and adds to the table the fraction of
    repeats whose final error lies within ``tol`` (relative) of it. ``against``: the x of the
    curves, ``round`` or a column of errors.csv such as ``bytes_per_client`` (then a log
    axis, its final value in the table; a job without that column is not drawn).
    """
    ax.set_prop_cycle(**STYLE)
    keys = swept_keys(jobs) if keys is None else keys
    jobs = sorted(jobs, key=lambda j: [_sort_value(j["overrides"].get(k, "")) for k in keys])
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
    """A job's status with the round it diverged at: ``diverged at r=22``, ``interrupted``."""
    status = summary["status"]
    at = summary.get("diverged_round") if status == "diverged" else None
    return status + (f"{sep}r={at}" if at is not None else "")


def mark_not_drawn(ax, job: dict, label: str, shown: str | None = None) -> str:
    """A legend entry (a red x, no line) for a job that did not finish ``ok`` (diverged,
    growing, interrupted, ...), which is not drawn: its label with the status and the round
    (``diverged at r=22; not drawn``, ``growing; not drawn``). The legend shows ``shown``
    (default ``label``) with the same ending; ``label``'s is returned (for the table)."""
    end = f" ({status_text(job['summary'])}; not drawn)"
    ax.plot([], [], ls="none", marker="x", color="firebrick", label=(shown or label) + end,
            gid=NOT_DRAWN)
    return label + end


def not_drawn_rows(ax, jobs: list[dict], keys: list[str]) -> list[dict]:
    """:func:`mark_not_drawn` for every job of ``jobs`` that did not finish ``ok``, labelled by
    its values of ``keys``; one table row each (series, the keys, status)."""
    rows = []
    for j in jobs:
        if j["summary"]["status"] != "ok":
            values = {k: j["overrides"].get(k) for k in keys}
            label = mark_not_drawn(ax, j, ", ".join(f"{k}={v}" for k, v in values.items()),
                                   curve_text(list(values), list(values.values())))
            rows.append({"series": label, **{k: typed(v) for k, v in values.items()},
                         "status": j["summary"]["status"]})
    return rows


def legend_entries(axes) -> tuple[list, list]:
    """(handles, labels) of one legend for ``axes`` that draw the same curves: each label
    once, and every job not drawn (:func:`mark_not_drawn`) with the first line of its
    panel's title."""
    entries: dict = {}
    for ax in axes:
        panel = ax.get_title().split("\n")[0]
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if handle.get_gid() == NOT_DRAWN and panel:
                label = f"{panel}: {label}"
            entries.setdefault(label, handle)
    return method_order(list(entries.values()), list(entries))


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
                     "bound_rel": j["summary"].get("theorem1", {}).get("bound_rel"),
                     "bound_proof_rel": j["summary"].get("theorem1", {}).get("bound_proof_rel")})
    return pd.DataFrame(rows)


def slope(x, y) -> float:
    """Least-squares slope of log(y) against log(x)."""
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def plot_final(jobs: list[dict], ax, x: str, metric: str = "e_max", sqrt: bool = False,
               loglog: bool = True, title: str | None = None, fit: bool = True,
               bound: bool = False, keys: list[str] | None = None,
               ref: bool = False) -> list[dict]:
    """Final error against swept knob ``x``; one line per combination of the other swept
    knobs (``keys``, default: those that differ), with the fitted log-log slope against ``x``
    in the legend (``fit``), with ``bound`` the right-hand side of Theorem 1 (relative form,
    dotted; ``bound_proof`` dash-dotted when present) and with ``ref`` a ``c / sqrt(x)``
    reference line through the first point of the first curve. ``sqrt`` draws against
    ``sqrt(x)``. Returns the tidy table (one row per curve and value of ``x``)."""
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
    keyed = sorted(groups, key=lambda g: [_sort_value(str(v)) for v in
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
                  bbox_transform=_below(ax), ncol=1, frameon=False)
        ax.legend_rows_below = len(labels) + len(kinds)
    elif len(ax.get_legend_handles_labels()[1]) > 1 or b is not None:
        legend_below(ax, ncol=1)
    return rows


#: Theorem 1's bound in :func:`plot_final` (``bound=True``): the column, its legend text and
#: line style (the curve's colour); both relative, divided by min_i ||theta_i*||, as e_r is
BOUNDS = {"bound_rel": ("bound as stated (plug-in)", {"ls": ":", "lw": 1.5}),
          "bound_proof_rel": ("bound (corrected constants, plug-in)", {"ls": "-.", "lw": 1})}


def _below(ax):
    """A transform 30 points under ``ax``'s lower edge (under its x label)."""
    from matplotlib.transforms import offset_copy

    return offset_copy(ax.transAxes, fig=ax.figure, y=-30, units="points")


def legend_below(ax, ncol: int = 1, fontsize: float = 7) -> None:
    """A legend under ``ax``; its number of rows is kept on the axes so that :func:`figure` can
    make room for it."""
    handles, labels = method_order(*ax.get_legend_handles_labels())
    n = len(labels)
    below = _below(ax)                                                     # under the x label
    ax.legend(handles, labels, fontsize=fontsize, loc="upper center", bbox_to_anchor=(0.5, 0.0),
              bbox_transform=below, ncol=ncol, frameon=False, columnspacing=1.0)
    ax.legend_rows_below = -(-n // ncol)


def readable_log(ax) -> None:
    """Plain numbers (0.2, 0.5, 3, 16) instead of powers of ten on log axes spanning less than
    two decades, where only one or two powers of ten would be labelled."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for axis, lim in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        lo, hi = sorted(lim)
        if lo > 0 and np.log10(hi / lo) < 2:
            axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(plain)
            axis.set_minor_formatter(NullFormatter())


def plot_params(jobs: list[dict], ax, x: str, title: str | None = None,
                column: str = "rel_error_max") -> list[dict]:
    """Relative error of each identified parameter (``estimates.csv``, mean over repeats)
    against swept knob ``x``, log-log; one line per parameter. Returns the tidy table."""
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
    """Whether a job's overrides have the values of ``where`` (a value or a list of values)."""
    for k, v in where.items():
        allowed = [str(x) for x in v] if isinstance(v, (list, tuple)) else [str(v)]
        if overrides.get(k) not in allowed:
            return False
    return True


def panel_jobs(panel: dict) -> tuple[list[dict], list[str]]:
    """The jobs of a figure panel (``dir`` filtered by ``where``) and the keys they differ in
    (the sweep's declared keys that still take more than one value)."""
    jobs = [j for j in read_sweep(panel["dir"]) if matches(j["overrides"],
                                                            panel.get("where") or {})]
    if not jobs:
        raise FileNotFoundError(f"no finished jobs (errors.csv) under {panel['dir']}")
    declared = declared_keys(panel["dir"])
    keys = [k for k in swept_keys(jobs, declared)
            if len({j["overrides"].get(k) for j in jobs}) > 1]
    return jobs, keys


def samples_read(job_dir: Path) -> int:
    """Samples a client reads per round: K steps of ``batch_size`` (SGD) or ``N T`` (GD)."""
    cfg = load_yaml(Path(job_dir) / "config.yaml")
    n = cfg["N"] if isinstance(cfg["N"], int) else max(cfg["N"])
    per_step = cfg["optimizer"].get("batch_size") or n * cfg["T"]
    K = cfg["K"]
    K = max(K) if isinstance(K, list) else K       # per-client K_i: the largest
    return int(K) * int(per_step)


def solver_label(job_dir: Path, with_strategy: bool = True,
                 with_optimizer: bool = True) -> str:
    """The algorithm of a job in words: strategy, local solver, gradient reduction, scaling.

    E.g. ``FedAvg, GD, mean gradient, diagonal feature scaling``, read from its config.yaml.
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
    (relative) away from its final value: where the curves have settled."""
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
    """Panels in a grid (``ncols`` per row, default all in one row), saved as ``out_base``.png
    and .pdf; returns the tidy table of final errors.

    Each panel is a dict with ``dir`` (a multirun folder), ``title`` and optionally ``x`` (draw
    the final error against that knob instead of curves over rounds), ``sqrt``, ``loglog``,
    ``fit`` (print the log-log slope), ``bound`` (Theorem 1's right-hand side), ``where`` (keep
    the jobs whose overrides have these values; a list allows several), ``xmax`` (``auto``:
    curves that settle early, see below), ``against`` (curves against a column of errors.csv
    instead of the round, e.g. ``bytes_per_client``, on a log axis) and ``panel`` (its name in
    the table; default: its title). Titles are the panels' own, short; the settings, the solver
    and what lines and bands are belong in the caption (``suptitle`` draws a figure title if
    given). Panels of curves share one round axis, 0 to the largest R: linear, or, when a panel
    with ``xmax: auto`` settles within a tenth of its R, linear up to round 1 and logarithmic
    beyond (:func:`round_axis`), which shows the first rounds and the last together. Curves of a
    method have its look (:data:`METHODS`). When all panels draw the same curves (same labels),
    the figure has one legend.
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
    """Columns of a legend below a figure ``width`` inches wide: up to ``most``, as many as
    its longest label fits (about 16 characters an inch at font size 8, plus the handle), so
    that long labels do not run off the figure."""
    longest = max((len(str(label)) for label in labels), default=1) + 6
    return max(1, min(len(labels), most, int(16 * width // longest)))


def round_axis(ax, R: int, scale: str = "linear") -> None:
    """The round axis of a panel of curves: 0 to ``R``, linear or (``scale="symlog"``) linear
    up to round 1 and logarithmic beyond, which shows the first rounds and the last together."""
    if scale == "symlog":
        from matplotlib.ticker import FuncFormatter

        ax.set_xscale("symlog", linthresh=1, linscale=0.5)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlim(0, R)


@locked
def save(fig, paths, dpi: float) -> None:
    """Save ``fig`` to each of ``paths`` (format by suffix), laying it out once.

    For every file, ``savefig`` of a figure with a layout engine lays it out and draws it
    twice (once without rendering, to measure it); here the layout runs once, at ``dpi`` as
    ``savefig`` would run it, and each file is drawn once (the PNG is the same bytes). PDFs
    carry no creation date, so a regenerated file differs only if its data do."""
    engine = fig.get_layout_engine()
    if engine is not None:
        dpi_before = fig.dpi
        fig.dpi = dpi                   # text extents as the first file will measure them
        try:
            engine.execute(fig)
        finally:
            fig.dpi = dpi_before
        # no engine at all: with matplotlib's placeholder engine ("none") savefig would still
        # draw the figure once without rendering before drawing it into the file
        fig.set_layout_engine(None)
    for path in paths:
        meta = {"CreationDate": None} if Path(path).suffix == ".pdf" else {}
        fig.savefig(path, dpi=dpi, metadata=meta)


def _label(keys, values) -> str:
    return ", ".join(f"{k}={v}" for k, v in zip(keys, values, strict=True))


@locked
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
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 6),
               fontsize=7, frameon=False)
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
    ``keys[1]`` down, the value written in each cell. Returns the table of finals."""
    if len(keys) != 2:
        raise ValueError(f"a heat map needs exactly two swept keys; this sweep has "
                         f"{len(keys)}: {', '.join(keys) or 'none'}")
    x, y = keys
    df = final_errors(jobs, metric).reindex(columns=[x, y, "final_mean", "final_min",
                                                     "final_max"])
    bad = [j for j in jobs if j["summary"]["status"] != "ok"]       # a cell naming the status
    xs = sorted({*df[x], *(j["overrides"].get(x) for j in bad)}, key=_sort_value)
    ys = sorted({*df[y], *(j["overrides"].get(y) for j in bad)}, key=_sort_value)
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




@locked
def plot_fit(measured, one_step, free_run, names, path: Path | None = None, title: str = "",
             ax=None, time=None, time_label: str = "time step") -> Figure:
    """Held-out fit of one trajectory: measured states, one-step-ahead predictions and the
    free-run simulation from the first state, one panel per state.

    ``time``: the samples' times (default 0, 1, ...), ``time_label`` the x axis's name (the
    data's ``data.time`` column). ``ax``: one Axes per state (a sequence), or one Axes for
    all states (each state's curves labelled with its name); None: a new figure. Saved to
    ``path`` if given; returns the figure."""
    measured = np.asarray(measured)
    n_x = measured.shape[-1]
    if ax is None:
        cols = min(n_x, 4)
        rows = -(-n_x // cols)
        fig = new_figure(figsize=(3.2 * cols, 2.4 * rows), layout="constrained")
        axes = list(fig.subplots(rows, cols, squeeze=False).ravel())
    else:
        axes = list(np.ravel(np.asarray(ax, dtype=object)))
        if len(axes) not in (1, n_x):
            raise ValueError(f"ax: {len(axes)} axes for {n_x} states; allowed: one Axes, or "
                             f"{n_x} (one per state: {', '.join(names)})")
        fig = axes[0].figure
    one = len(axes) == 1 and n_x > 1
    t = np.arange(len(measured)) if time is None else np.asarray(time, float)
    for k in range(max(len(axes), n_x)):
        a = axes[0] if one else axes[k]
        if k >= n_x:
            a.set_visible(False)
            continue
        pre = f"{names[k]} " if one else ""
        a.plot(t, measured[:, k], "-", color="k" if not one else f"C{k}", lw=1.2,
               label=f"{pre}measured")
        a.plot(t[1:], one_step[:, k], "o", ms=2.5, color=None if not one else f"C{k}",
               label=f"{pre}one-step")
        with np.errstate(invalid="ignore"):
            a.plot(t, np.where(np.isfinite(free_run[:, k]), free_run[:, k], np.nan), "--",
                   lw=1.2, color=None if not one else f"C{k}", label=f"{pre}free run")
        if not one:
            a.set_title(names[k], fontsize=8)
        a.set_xlabel(time_label, fontsize=7)
        a.tick_params(labelsize=7)
        a.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    if path is not None:
        save(fig, [path], dpi=110)
    return fig
