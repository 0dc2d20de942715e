"""Writing a run's folder: the resolved config, the CSV tables, ``summary.json``, the plots and
(on request) the simulated trajectories in the import format."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from .validate import ConfigError


def check_output(cfg) -> None:
    """Refuse output settings that cannot be honoured (before anything runs)."""
    out = cfg.output
    ev = out.get("eval_every", 1)
    if not (isinstance(ev, int) and not isinstance(ev, bool) and ev >= 1):
        raise ConfigError(f"output.eval_every={ev} is not allowed: an integer >= 1")
    if out.get("trajectories") and cfg.data.get("source", "simulated") != "simulated":
        raise ConfigError("output.trajectories=true exports simulated data; with data=files "
                          "the trajectories are the files themselves")


def write_outputs(out, cfg, result) -> None:
    """Write every file of a run (``result`` from :func:`fnsysid.experiment.execute`)."""
    from .tables import run_title

    ok = result.diverged is None
    plot = ok and bool(cfg.output.plot)
    write_run(out, cfg, result.tables, result.summary,
              run_title(cfg, result.model, result.dataset.settings) if plot else None)
    if cfg.output.get("trajectories"):
        from .data_source import export_trajectories

        write_trajectories(out, *export_trajectories(result.model, cfg, result.dataset))
    if plot and result.dataset.heldout is not None:
        write_fit_plot(out, result.model, result.estimate, result.dataset)


def write_run(out: Path, cfg, tables: dict[str, pd.DataFrame], summary: dict,
              plot_title: str | None = None) -> None:
    """Write ``config.yaml``, ``<name>.csv`` for each table, ``summary.json`` and, with a
    ``plot_title``, ``error.png`` (drawn from the ``errors`` table)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    for name, table in tables.items():
        table.to_csv(out / f"{name}.csv", index=False)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if plot_title is not None:
        from .plotting import plot_run

        plot_run(tables["errors"], out / "error.png", title=plot_title)


def write_trajectories(out: Path, trajectories: pd.DataFrame, truth: pd.DataFrame) -> None:
    """``trajectories.parquet`` and ``truth.csv`` in the import format of ``data=files``."""
    out = Path(out)
    trajectories.to_parquet(out / "trajectories.parquet", index=False)
    truth.to_csv(out / "truth.csv", index=False, float_format="%.17g")


def write_fit_plot(out: Path, model, estimate, dataset, repeat: int = 0) -> None:
    """``fit.png`` in folder ``out`` (or the file ``out`` if it ends in an image suffix):
    measured, one-step and free-run states of the first client with held-out data (first
    held-out trajectory, repeat 0)."""
    import numpy as np

    from .metrics import free_run, one_step
    from .plotting import plot_fit

    ho = dataset.heldout
    valid = np.flatnonzero(ho.valid[repeat])
    if not len(valid):
        return
    m = int(valid[0])
    sl = (slice(repeat, repeat + 1), slice(m, m + 1))
    est = np.asarray(estimate)[repeat:repeat + 1]
    est = est[:, m:m + 1] if est.shape[1] > 1 else est
    x, u, mask = ho.x[sl][:, :, :1], ho.u[sl][:, :, :1], ho.mask[sl][0, 0, 0]
    L = int(mask.sum())
    sim = free_run(model, est, x, u)[0, 0, 0, :L]
    step = one_step(model, est, x, u)[0, 0, 0, :L - 1]
    out = Path(out)
    path = out if out.suffix in (".png", ".pdf", ".svg") else out / "fit.png"
    plot_fit(x[0, 0, 0, :L], step, sim, model.system.state_names, path,
             title=f"client {dataset.clients[m]}, held-out trajectory 1"
                   + (f", repeat {repeat}" if ho.n.shape[0] > 1 else ""))
