"""One experiment end to end: config -> data -> model and strategy -> metrics -> tables -> files.

``run_experiment(cfg, output_dir)`` is what ``run.py`` calls; tests call it directly. Each step
lives in its own module: :mod:`fnsysid.build` (objects from the config),
:mod:`fnsysid.data_source` (the clients' data), :mod:`fnsysid.training` (the rounds),
:mod:`fnsysid.metrics`, :mod:`fnsysid.tables` and :mod:`fnsysid.output_files`.
"""

from __future__ import annotations

import time
from pathlib import Path

from omegaconf import DictConfig

from .build import build, initial_model
from .data_source import load_data
from .output_files import write_run
from .tables import clients_frame, errors_frame, estimates_frame, make_summary, run_title
from .theory import theorem1
from .training import keep_per_client, train
from .validate import check_run


def run_experiment(cfg: DictConfig, output_dir: str | Path) -> dict:
    """Run the experiment described by ``cfg`` and write its results into ``output_dir``.

    Files: ``config.yaml`` (resolved), ``errors.csv`` (repeat, round, e_max, e_mean),
    ``clients.csv`` (repeat, round, client, error; small M or ``output.per_client=true``),
    ``estimates.csv`` (final server estimate per repeat and parameter), ``theory.csv`` (the
    right-hand side of Theorem 1 per repeat, see :mod:`fnsysid.theory`), ``summary.json`` and
    ``error.png``. Returns the summary. Raises :class:`ConfigError` before writing anything if
    a setting is not allowed.
    """
    t_start = time.perf_counter()
    check_run(cfg)
    model, optimizer, strategy = build(cfg)

    t0 = time.perf_counter()
    data = load_data(cfg, model, optimizer)
    theta0 = initial_model(model, data, cfg.system.init)
    t_data = time.perf_counter() - t0

    t0 = time.perf_counter()
    keep_clients = keep_per_client(cfg)
    hist, diverged = train(strategy, data, theta0, optimizer, model, cfg,
                           progress=cfg.progress, keep_clients=keep_clients)
    t_train = time.perf_counter() - t0
    theory = theorem1(data, model, float(cfg.theory.delta))

    tables = {"errors": errors_frame(hist)}
    if keep_clients:
        tables["clients"] = clients_frame(hist)
    if diverged is None:
        tables["estimates"] = estimates_frame(model, strategy.estimate(), data, theta0,
                                              keep_clients)
    tables["theory"] = theory
    summary = make_summary(cfg, model, diverged, tables["errors"], theory,
                           runtime=dict(data_s=t_data, train_s=t_train,
                                        total_s=time.perf_counter() - t_start))
    plot = diverged is None and cfg.output.plot
    write_run(output_dir, cfg, tables, summary, run_title(cfg, model) if plot else None)
    return summary
