"""The look shared by every figure of fnsysid: methods' colours and line styles, legends,
axes, curves over rounds with their bands, and saving.

Figures are drawn without pyplot (a :class:`~matplotlib.figure.Figure` on its own
:class:`~matplotlib.backends.backend_agg.FigureCanvasAgg`: no global figure registry, no
backend switch), and each public drawing function holds one module lock (:data:`LOCK`, by
:func:`locked`) while it draws, since matplotlib's text layout and math text parser are shared
by all figures of the process and are not safe to use from several threads at once: runs in
threads (``fnsysid.run`` with an ``output_dir`` each) draw their plots one after another.
"""

from __future__ import annotations

import functools
import textwrap
import threading
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

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
    """The look of a method in every figure.

    Parameters
    ----------
    strategy : str or None
        A ``strategy`` option (a key of :data:`METHODS`).

    Returns
    -------
    dict
        ``label``, ``color`` and ``linestyle``; empty for an unknown method (it keeps its own
        name and the axes' colour cycle).
    """
    if strategy not in METHODS:
        return {}
    label, color, ls = METHODS[strategy]
    return {"label": label, "color": color, "linestyle": ls}


def knob_text(key: str, value) -> str:
    """One knob's value as a legend shows it: ``FedAvg`` for a strategy, ``\u03b5 = 0.01``,
    ``M = 9``.

    Parameters
    ----------
    key : str
        The knob (a dotted setting).
    value : object
        Its value.

    Returns
    -------
    str
    """
    if key == "strategy":
        return method_style(value).get("label", str(value))
    if key == "optimizer":
        return {"gd": "GD", "sgd": "SGD"}.get(value, str(value))
    return f"{KNOBS.get(key, key)} = {value}"


def curve_text(keys, values) -> str:
    """The legend label of a curve: its knobs' values (:func:`knob_text`), strategy first.

    Parameters
    ----------
    keys : sequence of str
        The knobs that tell the curves apart.
    values : sequence
        The curve's value of each.

    Returns
    -------
    str
    """
    pairs = sorted(zip(keys, values, strict=True), key=lambda kv: kv[0] != "strategy")
    return ", ".join(knob_text(k, v) for k, v in pairs)


def method_order(handles, labels) -> tuple[list, list]:
    """Legend entries with the methods' in the order of :data:`METHODS` (an entry is a
    method's when its label starts with the method's name), the others after them in their
    own order.

    Parameters
    ----------
    handles : list of matplotlib.artist.Artist
    labels : list of str
        The entries, as :meth:`matplotlib.axes.Axes.get_legend_handles_labels` gives them.

    Returns
    -------
    handles : list of matplotlib.artist.Artist
    labels : list of str
    """
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
    others.

    Parameters
    ----------
    keys : sequence of str
        The knobs that tell the curves apart.
    values : sequence
        The curve's value of each.
    markers : dict or None, default=None
        Each combination of the other knobs' values to its marker, filled as curves come
        (shared by the curves of one axes); None: no markers.

    Returns
    -------
    dict
        ``color``, ``linestyle`` and perhaps ``marker``; empty without ``strategy`` (the
        axes' colour cycle).
    """
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
    """A decorator: ``draw`` run under :data:`LOCK`.

    Parameters
    ----------
    draw : callable
        A drawing function.

    Returns
    -------
    callable
    """
    @functools.wraps(draw)
    def run(*args, **kwargs):
        with LOCK:
            return draw(*args, **kwargs)
    return run


def new_figure(**kwargs) -> Figure:
    """A figure on an Agg canvas of its own, outside pyplot.

    Parameters
    ----------
    **kwargs
        Passed to :class:`matplotlib.figure.Figure` (``figsize``, ``layout``, ...).

    Returns
    -------
    matplotlib.figure.Figure
    """
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


METRICS = {"e_max": r"$e_r = \max_i e_r^{(i)}$", "e_mean": r"mean$_i\, e_r^{(i)}$",
           "nrmse_1step_max": "held-out one-step NRMSE\n(max over clients)",
           "nrmse_1step_mean": "held-out one-step NRMSE\n(mean over clients)",
           "nrmse_sim_max": "held-out free-run NRMSE\n(max over clients)",
           "nrmse_sim_mean": "held-out free-run NRMSE\n(mean over clients)"}


def band(errors: pd.DataFrame, metric: str = "e_max") -> pd.DataFrame:
    """Per round: mean, median, min and max over repeats of ``metric``.

    Parameters
    ----------
    errors : pandas.DataFrame
        A run's ``errors.csv`` (``round``, ``repeat`` and ``metric`` columns).
    metric : str, default="e_max"
        The column summarized.

    Returns
    -------
    pandas.DataFrame
        Indexed by round; columns ``mean``, ``median``, ``lo``, ``hi``.
    """
    g = errors.groupby("round")[metric]
    return pd.DataFrame({"mean": g.mean(), "median": g.median(), "lo": g.min(), "hi": g.max()})


def draw_curve(ax, errors: pd.DataFrame, label: str, metric: str = "e_max",
               median: bool = False, against: str = "round", **kw):
    """Mean over repeats with a min-max band (and the median, dotted, with ``median``).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        The axes to draw on.
    errors : pandas.DataFrame
        A run's ``errors.csv``.
    label : str
        The curve's legend label.
    metric : str, default="e_max"
        The column drawn.
    median : bool, default=False
        Also mark the median over repeats.
    against : str, default="round"
        The x: the round, or another column of ``errors.csv`` (its mean over repeats at each
        round, e.g. ``bytes_per_client``; the final value is marked).
    **kw
        Passed to :meth:`matplotlib.axes.Axes.plot` (colour, line style, ...).

    Returns
    -------
    matplotlib.lines.Line2D
        The mean's line.
    """
    b = band(errors, metric)
    b = b[b["mean"].notna()]           # rounds without the metric (free run: evaluated ones)
    x = b.index if against == "round" else \
        errors.groupby("round")[against].mean().reindex(b.index).to_numpy()
    if len(b) <= 20 and "marker" not in kw:          # a few points: each one visible
        kw = {**kw, "marker": "o", "ms": 3.5}
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
    """Axis labels and grid of a panel of curves over rounds.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    metric : str, default="e_max"
        The column drawn (its label, :data:`METRICS`).
    log : bool or "auto", default="auto"
        A log y-axis; ``"auto"``: only when the curves span more than a decade (over less, a
        log axis shows one or two tick labels).
    """
    ax.set_xlabel("communication round $r$")
    ax.set_ylabel(METRICS.get(metric, metric))
    if log == "auto":
        log = decades(ax) > 1
    if log:
        ax.set_yscale("log")
        readable_log(ax)
    ax.grid(True, which="both", alpha=0.3)


def decades(ax) -> float:
    """How many decades the positive y values of the lines on ``ax`` span.

    Parameters
    ----------
    ax : matplotlib.axes.Axes

    Returns
    -------
    float
        0 without positive finite values.
    """
    ys = [np.asarray(line.get_ydata(), float) for line in ax.get_lines()]
    y = np.concatenate(ys) if ys else np.array([])
    y = y[np.isfinite(y) & (y > 0)]
    return float(np.log10(y.max() / y.min())) if y.size else 0.0


def wrap(text: str | None, width: int) -> str | None:
    """``text`` broken into lines of at most ``width`` characters (existing breaks kept).

    Parameters
    ----------
    text : str or None
    width : int

    Returns
    -------
    str or None
        ``text`` itself when it is empty or None.
    """
    if not text:
        return text
    return "\n".join(textwrap.fill(part, width) for part in str(text).split("\n"))


def sort_value(v: str):
    """Sort key of a knob's value: numbers in their order, before the other strings.

    Parameters
    ----------
    v : str

    Returns
    -------
    tuple of (int, float, str)
    """
    try:
        return (0, float(v), "")
    except ValueError:
        return (1, 0.0, v)


def below_axes(ax):
    """A transform 30 points under ``ax``'s lower edge (under its x label).

    Parameters
    ----------
    ax : matplotlib.axes.Axes

    Returns
    -------
    matplotlib.transforms.Transform
    """
    from matplotlib.transforms import offset_copy

    return offset_copy(ax.transAxes, fig=ax.figure, y=-30, units="points")


def legend_below(ax, ncol: int = 1, fontsize: float = 7) -> None:
    """A legend under ``ax``; its number of rows is kept on the axes
    (``ax.legend_rows_below``) so that :func:`fnsysid.results.plotting.paper_panels.figure`
    can make room for it.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    ncol : int, default=1
        The legend's columns.
    fontsize : float, default=7
    """
    handles, labels = method_order(*ax.get_legend_handles_labels())
    n = len(labels)
    below = below_axes(ax)                                            # under the x label
    ax.legend(handles, labels, fontsize=fontsize, loc="upper center", bbox_to_anchor=(0.5, 0.0),
              bbox_transform=below, ncol=ncol, frameon=False, columnspacing=1.0)
    ax.legend_rows_below = -(-n // ncol)


def readable_log(ax) -> None:
    """Plain numbers (0.2, 0.5, 3, 16) instead of powers of ten on log axes spanning less than
    two decades, where only one or two powers of ten would be labelled.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
        Its x and y axes are each changed if they span less than two positive decades.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for axis, lim in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        lo, hi = sorted(lim)
        if lo > 0 and np.log10(hi / lo) < 2:
            axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(plain)
            axis.set_minor_formatter(NullFormatter())


def round_axis(ax, R: int, scale: str = "linear") -> None:
    """The round axis of a panel of curves: 0 to ``R``.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    R : int
        The last round.
    scale : {"linear", "symlog"}, default="linear"
        ``symlog``: linear up to round 1 and logarithmic beyond, which shows the first rounds
        and the last together.
    """
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
    carry no creation date, so a regenerated file differs only if its data do.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
    paths : sequence of path-like
        The files to write (format by suffix).
    dpi : float
        The resolution of raster files (and of the layout).
    """
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
