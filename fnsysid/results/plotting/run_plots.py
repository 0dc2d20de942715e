"""The plots of one run (``output.plot=true``): e_r against r (``errors.png``) and the
held-out fit of a trajectory (``fit.png``).

Imported only by a run that draws them (:mod:`fnsysid.results.files`,
:mod:`fnsysid.app.experiment`), so a run with ``output.plot=false`` does not load matplotlib.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from fnsysid.results.plotting.style import (
    METHODS,
    draw_curve,
    locked,
    method_style,
    new_figure,
    round_axis,
    save,
    style_axes,
    wrap,
)


def method_of(strategy: dict | None) -> str | None:
    """The method of a run, from its class (``_target_``) and, for ``Centralized``, its
    ``exact`` flag.

    Parameters
    ----------
    strategy : dict or None
        The run's resolved ``strategy`` settings.

    Returns
    -------
    str or None
        A key of :data:`~fnsysid.results.plotting.style.METHODS`; None if unknown.
    """
    target = str((strategy or {}).get("_target_", "")).rsplit(".", 1)[-1].lower()
    if target == "centralized" and (strategy or {}).get("exact"):
        target = "centralized_exact"
    return target if target in METHODS else None


@locked
def plot_run(errors: pd.DataFrame, path: Path | None = None, title: str = "",
             method: str | None = None, ax=None) -> Figure:
    """e_r against r for one run: max over clients (solid) and mean over clients (dashed),
    each the mean over repeats with its min..max band, in the colour of the run's method.

    Without ground truth (``e_max`` empty) the held-out one-step NRMSE is drawn instead.

    Parameters
    ----------
    errors : pandas.DataFrame
        The run's ``errors.csv`` (columns ``repeat``, ``round``, ``e_max``, ``e_mean``,
        ``nrmse_1step_max``, ``nrmse_1step_mean``).
    path : path-like or None, default=None
        Where to save the figure (format by suffix); None: not saved.
    title : str, default=""
        The axes' title (wrapped at 70 characters).
    method : str or None, default=None
        A key of :data:`~fnsysid.results.plotting.style.METHODS` (:func:`method_of`): its
        colour, and its name in the legend; None: the first colour of the cycle, no name.
    ax : matplotlib.axes.Axes or None, default=None
        The axes to draw into; None: a new figure.

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into.
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


@locked
def plot_fit(measured, one_step, free_run, names, path: Path | None = None, title: str = "",
             ax=None, time=None, time_label: str = "time step") -> Figure:
    """Held-out fit of one trajectory: measured states, one-step-ahead predictions and the
    free-run simulation from the first state, one panel per state.

    Parameters
    ----------
    measured : array_like, shape (T, n_x)
        The measured states.
    one_step : numpy.ndarray, shape (T - 1, n_x)
        The one-step-ahead predictions of samples 1..T-1.
    free_run : numpy.ndarray, shape (T, n_x)
        The free run from the first state (non-finite values are not drawn).
    names : sequence of str
        The states' names (the panels' titles).
    path : path-like or None, default=None
        Where to save the figure (format by suffix); None: not saved.
    title : str, default=""
        The figure's title.
    ax : matplotlib.axes.Axes, sequence of Axes, or None, default=None
        One Axes per state, or one Axes for all states (each state's curves labelled with its
        name); None: a new figure.
    time : array_like, shape (T,), or None, default=None
        The samples' times; None: 0, 1, ...
    time_label : str, default="time step"
        The x axis's name (the data's ``data.time`` column).

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into.

    Raises
    ------
    ValueError
        If ``ax`` holds neither one Axes nor one per state.
    """
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
