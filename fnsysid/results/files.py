"""Writing a run's folder: the resolved config, the CSV tables, the plots, (on request) the
simulated trajectories in the import format, and ``summary.json`` last.

Every file is written atomically (:mod:`fnsysid.results.atomic`): a folder without ``summary.json``
is known to be incomplete, and no file is ever left truncated."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from fnsysid.config.checks import ConfigError
from fnsysid.results.atomic import together, write_atomic, write_csv, write_json, write_text
from fnsysid.results.tables import Frames

if TYPE_CHECKING:
    import pandas as pd

    from fnsysid.results.tables import Table


def check_output(cfg) -> None:
    """Refuse output settings that cannot be honoured (before anything runs); their types
    and ranges are checked by :mod:`fnsysid.config.schema`."""
    if cfg.output.trajectories and cfg.files:
        raise ConfigError("output.trajectories=true exports simulated data; with data=files "
                          "the trajectories are the files themselves")


def write_outputs(out, cfg, result) -> None:
    """Write every file of a run (``result`` from :func:`fnsysid.app.experiment.execute`), all
    on disk before any is renamed into place, ``summary.json`` last (:func:`together`)."""
    from fnsysid.results.tables import run_title

    # drawn when finished: ok, or growing (the curve shows the growth; the title says so);
    # not after a divergence or an interruption
    status = result.summary["status"]
    plot = status in ("ok", "growing") and cfg.output.plot
    title = run_title(cfg, result.model, result.dataset.settings) if plot else None
    if plot and status == "growing":
        g = result.summary["growth"]
        title += (f"\nstatus: growing (final {g['metric']} = {g['ratio']:.3g} x max(1, start)"
                  + (f", rising {g['rate']:.3g} x a round)" if g.get("rule") == "rising"
                     else ")"))
    with together():
        write_run(out, cfg.resolved, result.tables, None, title)
        if cfg.output.trajectories:
            from fnsysid.data.source import export_trajectories

            write_trajectories(out, *export_trajectories(result.model, cfg, result.dataset))
        if plot and result.dataset.heldout is not None:
            write_fit_plot(out, result.model, result.estimate, result.dataset,
                           settings=cfg)
        lines = model_lines(result)
        if lines is not None:
            write_text(Path(out) / "equations.txt", "\n".join(lines) + "\n")
        write_json(Path(out) / "summary.json", result.summary)


def model_lines(result) -> list[str] | None:
    """The lines of ``equations.txt``: the final model of each repeat (or of each client,
    :func:`~fnsysid.results.equations.model_text`); None after a divergence (no model to
    trust; ``estimates.csv`` is not written either). An interrupted run's model is that of
    its last round, said in a first comment line; coefficients the data do not determine
    (``conditioning.undetermined``) are named in another."""
    from fnsysid.results.equations import model_text, not_final

    if "estimates" not in list(result.tables) or result.diverged is not None:   # no pandas
        return None
    ds = result.dataset
    lines = model_text(result.model, result.estimate, ds.clients, ds.repeats or None)
    status = result.summary.get("status")
    zero = (result.summary.get("conditioning") or {}).get("undetermined")
    if zero:
        lines.insert(0, f"# not determined by the data (their regressor is 0 in every client's "
                        f"training data; repeat(s) {', '.join(map(str, zero['repeats']))}), "
                        f"their printed values are no estimate: {', '.join(zero['terms'])}")
    if status != "ok":
        lines.insert(0, f"# status {status}: {not_final(result.summary)}")
    return lines


def write_run(out: Path, resolved: dict, tables: Mapping[str, Table | pd.DataFrame],
              summary: dict | None, plot_title: str | None = None) -> None:
    """Write ``config.yaml`` (the run's resolved settings ``resolved``), ``<name>.csv`` for
    each table (a :class:`Table` is written as it is, without pandas), with a ``plot_title``
    also ``error.png`` (drawn from the ``errors`` table), and ``summary.json`` last (if
    given)."""
    out = Path(out)
    tables = tables if isinstance(tables, Frames) else Frames(tables)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "config.yaml", config_yaml(resolved))
    for name in tables:
        write_csv(out / f"{name}.csv", tables.table(name))
    if plot_title is not None:
        from fnsysid.results.plotting.run_plots import method_of, plot_run

        method = method_of(resolved.get("strategy"))
        write_atomic(out / "error.png",
                     lambda tmp: plot_run(tables["errors"], tmp, title=plot_title,
                                          method=method))
    if summary is not None:
        write_json(out / "summary.json", summary)


def config_yaml(resolved: dict) -> str:
    """The YAML text of a run's resolved settings (what ``config.yaml`` holds)."""
    return OmegaConf.to_yaml(OmegaConf.create(resolved))


def write_trajectories(out: Path, trajectories: pd.DataFrame, truth: pd.DataFrame) -> None:
    """``trajectories.parquet`` and ``truth.csv`` in the import format of ``data=files``."""
    out = Path(out)
    write_atomic(out / "trajectories.parquet",
                 lambda tmp: trajectories.to_parquet(tmp, index=False))
    write_atomic(out / "truth.csv",
                 lambda tmp: truth.to_csv(tmp, index=False, float_format="%.17g"))


#: samples of the trajectory fit.png draws: a simulated run whose held-out trajectories are
#: shorter gets one of this length, simulated for the plot only
FIT_SAMPLES = 100


def write_fit_plot(out: Path, model, estimate, dataset, repeat: int = 0,
                   settings=None) -> None:
    """``fit.png`` in folder ``out`` (or the file ``out`` if it ends in an image suffix): the
    figure of :func:`fit_figure` (nothing without a held-out client)."""
    from fnsysid.results.plotting.style import save

    out = Path(out)
    path = out if out.suffix in (".png", ".pdf", ".svg") else out / "fit.png"
    fig = fit_figure(model, estimate, dataset, repeat, settings)
    if fig is not None:
        write_atomic(path, lambda tmp: save(fig, [tmp], dpi=110))


def time_label(settings) -> str:
    """The x axis of a fit plot of held-out trajectories (which keep no times): ``time step``,
    or with ``data.time`` naming the data's time column, that name (sample index)."""
    name = getattr(getattr(settings, "data", None), "time", None) if settings else None
    return f"{name} (sample index)" if name and name != "t" else "time step"


def fit_figure(model, estimate, dataset, repeat: int = 0, settings=None, ax=None):
    """The held-out fit (a matplotlib Figure; None without held-out data):
    measured, one-step and free-run states of the first scored client (held-out data in which
    a predicted state varies, :func:`~fnsysid.results.metrics.scored`; else the first with
    held-out data: a client of all-zero logs would show flat lines), repeat 0.

    Drawn is the client's first held-out trajectory, or, for simulated data (``settings``
    given) whose held-out trajectories are shorter than :data:`FIT_SAMPLES`, a trajectory of
    that length simulated for the plot from the same client and the held-out random stream
    (T = 5 gives 6 samples, too few to judge a fit by eye); the scores in ``errors.csv`` are
    those of the held-out data either way."""
    import numpy as np

    from fnsysid.results.metrics import free_run, one_step, scored
    from fnsysid.results.plotting.run_plots import plot_fit

    ho = dataset.heldout
    valid = np.flatnonzero(ho.valid[repeat])
    if not len(valid):
        return None
    good = np.flatnonzero(ho.valid[repeat] & scored(model, ho)[repeat])
    m = int(good[0] if len(good) else valid[0])
    block, at = ho.client(m)
    sl = (slice(repeat, repeat + 1), slice(at, at + 1))
    est = np.asarray(estimate)[repeat:repeat + 1]
    est = est[:, m:m + 1] if est.shape[1] > 1 else est
    x, u, mask = block.x[sl][:, :, :1], block.u[sl][:, :, :1], block.mask[sl][0, 0, 0]
    L = int(mask.sum())
    what = "held-out trajectory 1"
    if (settings is not None and not settings.files and model.system.simulates
            and L < FIT_SAMPLES):
        x, u = _plot_trajectory(model, settings, len(dataset.clients), m, repeat)
        L = FIT_SAMPLES
        what = f"held-out trajectory of {L} samples simulated for this plot"
    sim = free_run(model, est, x, u)[0, 0, 0, :L]
    step = one_step(model, est, x, u)[0, 0, 0, :L - 1]
    title = (f"client {dataset.clients[m]}, {what}"
             + (f", repeat {repeat}" if ho.n.shape[0] > 1 else ""))
    return plot_fit(x[0, 0, 0, :L], step, sim, model.system.state_names, title=title, ax=ax,
                    time_label=time_label(settings))


def _plot_trajectory(model, settings, M: int, m: int, repeat: int):
    """States (1, 1, 1, FIT_SAMPLES, n_x) and inputs of one trajectory of client ``m`` (its
    own system in repeat ``repeat``), drawn from the held-out stream of its block."""
    from fnsysid.dynamics import random as rnd
    from fnsysid.dynamics.model import simulate_blocks

    blk, lo, hi = next(b for b in rnd.blocks(M) if b[1] <= m < b[2])
    _, x, u = simulate_blocks(model, repeat, [(blk, lo, hi)], 1, FIT_SAMPLES - 1,
                              settings.eps, settings.seed, settings.data.shared_noise,
                              rnd.HOLDOUT)
    return x[m - lo][None, None], u[m - lo][None, None]
