"""One experiment end to end: config -> data -> model and strategy -> metrics -> tables -> files.

``run_experiment(cfg, output_dir)`` is what ``run.py`` calls; tests call it directly. Each step
lives in its own module: :mod:`fnsysid.app.build` (objects from the config),
:mod:`fnsysid.data.source` (the clients' data), :mod:`fnsysid.runtimes.inprocess` (the rounds),
:mod:`fnsysid.results.metrics`, :mod:`fnsysid.results.tables` and :mod:`fnsysid.results.files`.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fnsysid.app.build import build
from fnsysid.app.resources import check_memory, file_budget
from fnsysid.config.checks import check_run, override_key, unused_line, unused_settings
from fnsysid.config.errors import some
from fnsysid.config.schema import Settings
from fnsysid.data.heldout import heldout_fingerprint
from fnsysid.data.source import Dataset, load_data
from fnsysid.dynamics.model import Model
from fnsysid.learning.personalize import z_value
from fnsysid.learning.sparsity import (
    auto_line,
    disagreement_warning,
    empty_warning,
    faded_summary,
    faded_warning,
)
from fnsysid.learning.start import initial_model
from fnsysid.learning.strategies import OneShot
from fnsysid.results.files import check_output, write_outputs
from fnsysid.results.history import keep_per_client
from fnsysid.results.metrics import scored
from fnsysid.results.modelcheck import (
    extrapolation_note,
    free_run_warning,
    model_check,
    noise_note,
    pooling_note,
    verdict,
)
from fnsysid.results.personal import (
    add_personal_errors,
    client_estimates_table,
    clients_differ,
    differ_line,
    judge_models,
    judgment_line,
    personal_summary,
    personalized,
    server_intervals,
    t_value,
)
from fnsysid.results.tables import (
    Frames,
    clients_table,
    errors_table,
    estimates_table,
    make_summary,
)
from fnsysid.results.theory import theorem1_table
from fnsysid.runtimes import interrupt
from fnsysid.runtimes.check import check_runtime
from fnsysid.runtimes.inprocess import train

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger("fnsysid")


@dataclass
class Result:
    """Everything a run produces, in memory.

    ``tables``: name -> DataFrame (``errors``, ``theory``, and ``clients``/``estimates`` when
    written; a :class:`~fnsysid.results.tables.Frames` that builds each DataFrame when first read
    from the run's :class:`~fnsysid.results.tables.Table`, which is what is written); ``summary``:
    what ``summary.json`` holds; ``model``, ``estimate`` (final estimates, (S, 1 or M, p)) and
    ``dataset`` for plots and exports.
    """

    tables: Mapping[str, pd.DataFrame]
    summary: dict
    model: Model
    estimate: np.ndarray
    dataset: Dataset
    diverged: int | None = None
    #: the run's checked settings
    settings: Settings | None = None
    #: the clients' personalized models (S, M, p) (repeat, client, parameter in the order of
    #: ``model.param_names``) with ``personalize=finetune`` or ``auto``; None without
    client_models: np.ndarray | None = None
    #: their standard errors (S, M, p) (NaN where they have none, e.g. ``finetune``)
    client_se: np.ndarray | None = None

    def __post_init__(self):
        if not isinstance(self.tables, Frames):
            self.tables = Frames(self.tables)

    def __repr__(self) -> str:
        """A few words (the arrays are in the attributes): the run's status and settings."""
        s = self.summary
        final = ", ".join(f"{k.removeprefix('final_')}={s[k]:.4g}" for k in
                          ("final_e_max_mean", "final_nrmse_1step_mean", "final_nrmse_sim_mean")
                          if isinstance(s.get(k), float))
        return (f"Result(status={s.get('status')}, system={s.get('system')}, strategy="
                f"{s.get('strategy')}, M={s.get('M')}, rounds={s.get('rounds_completed')}"
                + (f", {final}" if final else "") + f"; tables: {', '.join(self.tables)})")

    @property
    def errors(self) -> pd.DataFrame:
        """One row per (repeat, round): parameter errors and held-out NRMSE (errors.csv)."""
        return self.tables["errors"]

    @property
    def clients(self) -> pd.DataFrame | None:
        """One row per (repeat, round, client) (clients.csv), or None when not kept."""
        return self.tables.get("clients")

    @property
    def estimates(self) -> pd.DataFrame | None:
        """Final estimates per repeat and parameter (estimates.csv); None after divergence."""
        return self.tables.get("estimates")

    @property
    def client_estimates(self) -> pd.DataFrame | None:
        """One row per (repeat, client, parameter): personalized model, ``se``, ``ci_lo``,
        ``ci_hi``, the client's own least squares and the truth (client_estimates.csv); None
        with ``personalize=none``."""
        return self.tables.get("client_estimates")

    @property
    def theory(self) -> pd.DataFrame | None:
        """Theorem 1's right-hand side per repeat (theory.csv); None with runtime=flower."""
        return self.tables.get("theory")

    @property
    def parameters(self) -> pd.DataFrame | None:
        """The parameters fitted, in order, and which ones ``e_r`` scores (parameters.csv)."""
        return self.tables.get("parameters")

    def plot_fit(self, df=None, ax=None, repeat: int = 0, path=None):
        """The fit of one trajectory as a matplotlib Figure (shown inline in a notebook):
        measured states, one-step predictions and the free run from the first state.

        Parameters
        ----------
        df : DataFrame, str, path or None, default=None
            None: the first scored client's held-out trajectory (what ``fit.png`` shows);
            a DataFrame in the layout of trajectory files (a ``client`` column, the
            trajectory and time columns under their own or the run's ``data.trajectory`` /
            ``data.time`` names, the states and inputs): its first client's first
            trajectory, drawn against its times; a path: as None, saved there.
        ax : matplotlib Axes, sequence of Axes or None, default=None
            One Axes per state, or one Axes for all; None: a new figure.
        repeat : int, default=0
            The repeat whose model and data are drawn.
        path : str, path or None, default=None
            Also save the figure there (``.png``, ``.pdf``, ``.svg``).

        Returns
        -------
        matplotlib.figure.Figure

        Raises
        ------
        ValueError
            ``df`` None and the run has no held-out trajectory to draw."""
        from fnsysid.results.files import fit_figure
        from fnsysid.results.plotting.style import save

        if isinstance(df, (str, os.PathLike)):        # plot_fit(path): the file only
            df, path = None, df
        if df is None:
            if self.dataset is None or self.dataset.heldout is None:
                raise ValueError("this run has no held-out trajectories (data.val_N=0 or "
                                 "data.holdout=0, or a run loaded from its folder): give "
                                 "plot_fit a DataFrame")
            fig = fit_figure(self.model, self.estimate, self.dataset, repeat, self.settings, ax)
            if fig is None:
                raise ValueError("no client has held-out data to draw")
        else:
            fig = self._plot_frame(df, ax, repeat)
        if path is not None:
            save(fig, [path], dpi=110)
        return fig

    def _plot_frame(self, df, ax, repeat: int):
        """:meth:`plot_fit` of a DataFrame's first client's first trajectory."""
        from fnsysid.data.files import ColumnMap
        from fnsysid.data.source import column_names
        from fnsysid.results.metrics import free_run, one_step
        from fnsysid.results.plotting.run_plots import plot_fit

        states, inputs = column_names(self.settings, self.model)
        cm = ColumnMap.of(self.settings.data).for_columns(df.columns)
        miss = [c for c in states + inputs if c not in df.columns]
        if miss:
            raise ValueError(f"df: column '{miss[0]}' is missing; the model's states and "
                             f"inputs: {', '.join(states + inputs)}")
        rows = df
        client = None
        if "client" in df.columns:
            client = str(df["client"].iloc[0])
            rows = rows[rows["client"].astype(str) == client]
        traj = cm.trajectory if cm.trajectory in rows.columns else None
        if traj is not None:
            rows = rows[rows[traj] == rows[traj].iloc[0]]
        time = cm.time if cm.time in rows.columns else None
        est = np.asarray(self.estimate)[repeat:repeat + 1]
        if est.shape[1] > 1:
            if client not in self.dataset.clients:
                raise ValueError(f"df: client {client} has no model of its own in this run; "
                                 f"allowed: {', '.join(some(self.dataset.clients, 8))}")
            m = self.dataset.clients.index(client)
            est = est[:, m:m + 1]
        x = rows[states].to_numpy(float)[None, None, None]
        u = rows[inputs].to_numpy(float)[:-1][None, None, None] if inputs else \
            np.zeros((1, 1, 1, len(rows) - 1, 0))
        L = len(rows)
        sim = free_run(self.model, est, x, u)[0, 0, 0, :L]
        step = one_step(self.model, est, x, u)[0, 0, 0, :L - 1]
        title = (f"client {client}, " if client is not None else "") + \
            (f"trajectory {rows[traj].iloc[0]}" if traj is not None else "trajectory")
        return plot_fit(x[0, 0, 0], step, sim, states, title=title, ax=ax,
                        time=rows[time].to_numpy(float) if time else None,
                        time_label=time or "time step")

    def plot_errors(self, ax=None, path=None):
        """The error curve of ``error.png`` (e_r against r, or the held-out NRMSE without a
        truth) as a matplotlib Figure.

        Parameters
        ----------
        ax : matplotlib Axes or None, default=None
            Draw into it; None: a new figure.
        path : str, path or None, default=None
            Also save the figure there.

        Returns
        -------
        matplotlib.figure.Figure"""
        from fnsysid.results.plotting.run_plots import method_of, plot_run
        from fnsysid.results.plotting.style import save

        fig = plot_run(self.errors, title="", ax=ax,
                       method=method_of(self.settings.resolved.get("strategy")
                                        if self.settings is not None else None))
        if path is not None:
            save(fig, [path], dpi=120)
        return fig


def given_keys(overrides) -> frozenset[str]:
    """The settings that ``key=value`` overrides give (``+``/``++``/``~`` prefixes dropped)."""
    return frozenset(override_key(o) for o in overrides if "=" in str(o))


def _job_given() -> frozenset[str]:
    """The settings given on the command line of the running Hydra job (none outside one)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return frozenset()
    return given_keys(HydraConfig.get().overrides.task)


def _job_choices() -> dict:
    """Group options chosen on the command line of the running Hydra job (none outside one)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return {}
    return dict(HydraConfig.get().runtime.choices)


def execute(cfg, choices: dict | None = None, given: frozenset[str] | None = None,
            tables=None) -> Result:
    """Check the settings of ``cfg`` (a composed config), load the data, run the rounds and
    build the result tables.

    ``choices`` (group -> option) names the options in the summary (default: Hydra's record
    of the running job). Writes nothing. Raises :class:`~fnsysid.config.checks.ConfigError` (or
    its subclass :class:`~fnsysid.data.files.DataError`) with a one-line message for bad
    input. ``given``: the settings given explicitly (default: the running Hydra job's
    overrides); with ``data=files`` a given ``M`` or ``repeats`` must match the files.

    With ``runtime=flower`` the rounds run on Flower (:func:`fnsysid.runtimes.flower.run`): the
    clients load and keep their own data, so there is no ``theory`` table (the pooled data it
    needs exist nowhere), ``true_mean`` of the estimates is empty and the held-out NRMSE
    is what each client computed on its own held-out data (federated evaluation). With
    ``data=files`` the clients' files are read and checked here first, as in process (and
    not kept): bad data stops the run before Flower starts. ``tables``: the
    trajectories of ``data=files`` held in memory (see :func:`fnsysid.data.source.from_files`).
    """
    t_start = time.perf_counter()
    settings = check_run(cfg)          # typed, read-only: what the steps below read
    model, optimizer, strategy = build(settings)
    check_output(settings)
    check_memory(settings, model, optimizer, strategy)
    check_runtime(settings, optimizer, strategy)
    choices = _job_choices() if choices is None else choices
    unused = unused_settings(settings, _job_given() if given is None else given)
    if unused:
        log.warning(unused_line(unused, choices.get("strategy")))

    t0 = time.perf_counter()
    if settings.runtime.name == "flower":
        import json

        from fnsysid.app.build import build_client_app
        from fnsysid.data.source import from_files
        from fnsysid.runtimes import flower

        sources = None
        if settings.files:      # bad data: one line before Flower starts, as in process
            from fnsysid.data.files import data_files

            checked = from_files(flower.node_settings(settings), model, optimizer,
                                 _job_given() if given is None else given)
            # each node gets its file and its truth rows: none lists the folder or reads
            # the truth file
            sources = flower.NodeSources(
                [str(f) for f in data_files(settings.data.path)], checked.clients,
                checked.train.theta_true if settings.data.truth else None)
            del checked
        dataset = flower.server_dataset(settings)
        keep_clients = keep_per_client(settings, len(dataset.clients))
        hist, diverged, theta0, failure = flower.run(
            settings, model, strategy, dataset, keep_clients,
            build_client_app(json.dumps(settings.resolved), sources))
        data, t_data, theory, twin = None, 0.0, None, None
    else:
        failure = None
        dataset = load_data(settings, model, optimizer,
                            _job_given() if given is None else given, file_budget(), tables,
                            strategy)
        data = dataset.train
        theta0 = initial_model(model, data, settings.system.init)
        t_data = time.perf_counter() - t0
        t0 = time.perf_counter()
        keep_clients = keep_per_client(settings, data.shape[1])
        twin = privacy_twin(strategy)
        hist, diverged = train(strategy, data, theta0, optimizer, model, settings,
                               progress=settings.progress, keep_clients=keep_clients,
                               heldout=dataset.heldout, eval_every=settings.output.eval_every)
        with np.errstate(divide="ignore", invalid="ignore"):   # undefined bounds become null
            theory = theorem1_table(data, model, settings.theory.delta)
    t_train = time.perf_counter() - t0
    if data is not None and twin is not None and diverged is None \
            and interrupt.requested() is None:                       # not timed as training
        plain_rounds(strategy, twin, data, theta0, optimizer, model, settings)
    result = make_result(settings, model, strategy, dataset, hist, diverged, theta0, data,
                         theory, keep_clients, dict(data_s=t_data, train_s=t_train,
                                                    total_s=time.perf_counter() - t_start),
                         choices, failure)
    if unused:
        result.summary["unused_settings"] = unused
    return result


def privacy_twin(strategy):
    """A copy of a DP-FedAvg ``strategy`` (privacy on a round-based strategy) whose rounds
    clip nothing and add no noise, made before its rounds (it holds its settings alone
    then), for :func:`plain_rounds`; None otherwise."""
    import copy

    from fnsysid.learning.privacy import Privacy

    pv = getattr(strategy, "privacy", None)
    if pv is None or not hasattr(strategy, "model_change"):
        return None
    twin = copy.deepcopy(strategy)
    # DP-FedAvg's own rounds (its participation, its division by the expected number of
    # clients) with nothing clipped and no noise
    twin.privacy = Privacy(pv.mode, clip=np.inf, delta=pv.delta, noise_multiplier=0.0)
    return twin


def plain_rounds(strategy, twin, data, theta0, optimizer, model, settings) -> None:
    """Run the rounds of ``twin`` (:func:`privacy_twin`) on the same data, start and local
    steps, without clipping or noise, and record how far privacy moved the final model from
    theirs (:meth:`fnsysid.learning.privacy.Privacy.compare`, ``by="rounds"``): a
    simulation's diagnostic, in process, at the cost of the rounds again without their
    records; the same clients take part in each round. Nothing is measured where the run
    is interrupted, and where the plain rounds diverge (``privacy.plain_diverged``:
    clipping kept the private ones bounded)."""
    from fnsysid.learning.local_work import local_steps
    from fnsysid.results.history import DIVERGENCE_FACTOR

    K = local_steps(settings.K, data.shape[1], data.shape[0], settings.seed)
    twin.setup(theta0, data, model, optimizer, K, settings.lr, settings.seed)
    with np.errstate(over="ignore", invalid="ignore"):
        for r in range(1, int(settings.R) + 1):
            if interrupt.requested() is not None:          # Ctrl-C: no measure
                return
            twin.round(r)
    private, plain = np.asarray(strategy.estimate()), np.asarray(twin.estimate())
    S = len(private)
    size = np.linalg.norm(private.reshape(S, -1), axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        far = ~(np.linalg.norm(plain.reshape(S, -1), axis=1)
                <= DIVERGENCE_FACTOR * np.maximum(1.0, size))
    if far.any():              # the plain rounds diverged: clipping kept these bounded
        strategy.privacy.plain_diverged = True
        return
    strategy.privacy.compare(private, plain, by="rounds")


def make_result(settings: Settings, model, strategy, dataset, hist, diverged, theta0, data,
                theory, keep_clients: bool, runtime: dict, choices: dict | None = None,
                failure: str | None = None) -> Result:
    """The tables and the summary of a finished run (``data``: the clients' training data, or
    None where the run cannot see them; ``theory``: Theorem 1's table, or None).

    ``failure``: why a Flower run stopped early (a SuperNode that died, a reply timeout):
    the summary says
    ``status: interrupted``, ``interrupted_by: node failure`` and the line in ``error``;
    the rounds recorded are kept and no ``estimates`` table is made (the server's model may
    be ahead of the last round every client evaluated)."""
    tables = {"errors": errors_table(hist)}
    labels = dataset.clients if settings.files else None     # file data: the clients' ids
    if keep_clients:
        tables["clients"] = clients_table(hist, labels)
    per, ci_note, se, interval_kind = None, None, None, None
    if diverged is None and failure is None:
        se, ci_note, dof = server_intervals(strategy, data, model)
        interval_kind = (None if se is None else
                         "oneshot" if isinstance(strategy, OneShot) else "pooled")
        level = settings.output.ci_level
        tables["estimates"] = estimates_table(model, strategy.estimate(), data, theta0,
                                              keep_clients, labels, se,
                                              z_value(level) if dof is None
                                              else t_value(level, dof))
        # in process from the clients' data; under Flower what the clients sent
        per = (personalized(settings, model, strategy, data) if data is not None
               else getattr(hist, "personal", None))
        if per is not None:
            tables["errors"] = add_personal_errors(tables["errors"], per)
            tables["client_estimates"] = client_estimates_table(
                per, model.param_names, settings.output.ci_level, labels)
    if theory is not None:
        tables["theory"] = theory
    from fnsysid.results.tables import k_clients_table, parameters_table

    tables["parameters"] = parameters_table(model, None if data is None else data.theta_true)
    K = np.asarray(getattr(strategy, "K", None))
    if K.ndim == 2:                       # per-client K_i (a list or a draw): as they ran
        tables["k_clients"] = k_clients_table(K, [str(c) for c in dataset.clients])
    summary = make_summary(settings, model, diverged, tables["errors"], theory, runtime=runtime,
                           settings=dataset.settings, choices=choices,
                           fleet=getattr(hist, "fleet", None))
    summary.update(personal_summary(settings, tables["errors"], ci_note, per, interval_kind))
    differ_said = None
    if se is not None:                             # the intervals treat them as one system
        differ = clients_differ(model, data,
                                getattr(getattr(strategy, "sparsity", None), "support", None))
        summary["ci"]["clients_differ"] = differ
        differ_said = differ_line(differ, ci_note)     # logged once conditioning is known
    if per is not None and getattr(per, "warning", None):
        log.warning(per.warning)
    if per is not None:            # judged like the server's model, each with its line
        summary["client_models"] = judge_models(per, tables["errors"])
        for kind, j in summary["client_models"].items():
            line = judgment_line(kind, settings.personalize.name, j)
            if line:
                (log.warning if kind == "local" else log.error)(line)
    at = getattr(hist, "diverged_at", None)
    if at is not None:          # in process: the repeats run on after one diverged
        grew = (summary.get("growth") or {}).get("repeats", [])
        if diverged is not None and any(d is None for d in at):
            # a diverged run is not judged for growth; its repeats that ran on are
            from fnsysid.results.history import growth

            grew = (growth(tables["errors"], getattr(hist, "fleet", None)) or {}).get(
                "repeats", [])
        summary["repeat_status"] = ["diverged" if d is not None else
                                    "growing" if s in grew else "ok" for s, d in enumerate(at)]
        summary["repeat_diverged_round"] = list(at)
    tables["errors"] = communication(summary, settings, model, strategy, tables["errors"],
                                     len(dataset.clients), getattr(hist, "traffic", None),
                                     getattr(hist, "diverged_at", None))
    privacy = getattr(strategy, "privacy", None)
    if privacy is not None:
        if diverged is None and failure is None:
            privacy.model_share(np.asarray(strategy.estimate()))
        summary["privacy"] = privacy.summary()
        privacy.warn()
        spent = privacy.epsilon_column(tables["errors"]["round"])
        if spent is not None:                  # round-based: epsilon spent up to each round
            from fnsysid.results.tables import Table

            tables["errors"] = Table({**tables["errors"].columns, "epsilon_rdp": spent})
    left_out = left_out_clients(strategy, dataset.clients)
    if left_out:
        summary["left_out_clients"] = left_out
    unscored = unscored_clients(model, dataset)
    if unscored:
        summary["unscored_clients"] = unscored
    ho = getattr(dataset, "heldout", None)      # which data the held-out scores are on
    marks = ho.marks() if ho is not None else getattr(hist, "heldout_marks", None)
    digest = None if marks is None else heldout_fingerprint(marks)
    if digest is not None:
        summary["heldout"] = {"fingerprint": digest}
    sparsity = getattr(strategy, "sparsity", None)
    if sparsity is not None and sparsity.support is not None:
        summary["sparsity"] = sparsity.summary(model)
        final = np.asarray(strategy.estimate()) if "estimates" in tables else None
        if final is not None and final.shape[1] == 1:     # a finished run's one model
            final = final[:, 0, :]
            faded = faded_summary(sparsity.faded(final), final, model,
                                  sparsity.scaled(final))
            if faded:
                summary["sparsity"]["below_threshold"] = faded
        path = sparsity.path_table()
        if path is not None:
            from fnsysid.results.tables import Table

            tables["sparsity_path"] = Table(path)
            line, warn = auto_line(summary["sparsity"])
            (log.warning if warn else log.info)(line)
        for line in (empty_warning(summary["sparsity"], sparsity.support.shape[0]),
                     disagreement_warning(summary["sparsity"]),
                     faded_warning(summary["sparsity"], summary.get("strategy"))):
            if line:
                log.warning(line)
    if data is not None and diverged is None and failure is None \
            and type(strategy).__name__ != "Local":
        conditioning(summary, data, None if sparsity is None else sparsity.support,
                     dataset.clients, np.abs(model.structure).sum(axis=1) > 0, model,
                     own_fits_used(settings, strategy))
        how = estimate_from_own_fits(settings, strategy)
        # under privacy the estimate is a noisy clipped mean, which privacy.moved judges
        if how and summary["status"] == "ok" and privacy is None:
            own_precision(summary, data, None if sparsity is None else sparsity.support,
                          dataset.clients, model, how, getattr(strategy, "weights", None))
    elif data is None and getattr(hist, "roundoff", None) is not None:
        # under Flower: the round-off of each client's own least squares, which it sent
        used = own_fits_used(settings, strategy)
        if roundoff_lost(summary, hist.roundoff, dataset.clients, own=True, affects=used) \
                and used and summary["status"] == "ok":
            summary["status"] = "ill_conditioned"
    lost = (summary.get("conditioning") or {}).get("roundoff", {})
    # the own fits the model check and Cochran's Q read carry the round-off found (measured
    # on them, or in the pooled sums of data far from 0, which every client's share)
    offset = lost.get("cause") == "offset" or lost.get("of") == "own fits"
    if diverged is None and failure is None and settings.output.model_check:
        # in process from the clients' data; under Flower combined from what they sent
        check = (model_check(model, data, dataset.heldout,
                             None if sparsity is None else sparsity.support,
                             keys=dataset.clients) if data is not None
                 else getattr(hist, "model_check", None))
        if check is not None:
            if check.get("worst") is not None:
                check["worst"]["client"] = str(dataset.clients[check["worst"]["client"]])
            if check.get("overfit"):
                check["overfit"] = [[s, str(dataset.clients[m])] for s, m in check["overfit"]]
            if check.get("extrapolating"):
                check["extrapolating"] = [[s, str(dataset.clients[m])]
                                          for s, m in check["extrapolating"]]
            for d in (check.get("overfit_detail") or []) + (
                    [check["extrapolating_worst"]] if check.get("extrapolating_worst") else []):
                d["client"] = str(dataset.clients[d["client"]])
            if check.get("excess_rejected"):
                check["excess_rejected"] = [[s, str(dataset.clients[m]), j]
                                            for s, m, j in check["excess_rejected"]]
            if offset and check.get("verdict") is not None:
                check.update(verdict=None, ok=None, reason=(
                    ("the data sit far from 0 beside their spread" if lost.get("cause") ==
                     "offset" else "some clients' own data keep no two digits of a fit") +
                    " and the clients' own fits carry the round-off found "
                    "(conditioning.roundoff): their residuals are not read"))
            summary["model_check"] = check
            for line in (noise_note(check), extrapolation_note(check), pooling_note(check),
                         verdict(check, settings.personalize.name == "finetune",
                                 (summary.get("conditioning") or {}).get("repeated"))):
                if line:
                    log.warning(line)
    # the model check finds some own fits at their solve's rounding and not small beside
    # their targets' spread: their differences are rounding too (nearly noise-free data far
    # from 0 made 10 identical clients "differ", p = 0)
    unresolved = bool((summary.get("model_check") or {}).get("unresolved"))
    if differ_said and (offset or unresolved):
        # their differences are not evidence of heterogeneity
        summary["ci"]["clients_differ"]["read"] = False
        summary["ci"]["clients_differ"]["why"] = (
            "the clients' own fits lose their digits to round-off (conditioning.roundoff)"
            if offset else "some clients' own fits are at their solve's rounding "
            "(model_check.unresolved): their differences are rounding")
    elif differ_said:
        log.warning(differ_said)
    signum = interrupt.requested()
    if failure is not None and diverged is None:
        summary.pop("growth", None)          # judged on the rows of a run that did not end
        summary.update(status="interrupted", interrupted_by="node failure", error=failure)
    elif signum is not None and diverged is None:
        summary.pop("growth", None)          # judged on the rows of a run that did not end
        summary["status"] = "interrupted"
        summary["interrupted_by"] = signal.Signals(signum).name
    if summary["status"] == "ok" and "growth" not in summary:
        from fnsysid.results.history import above_start, above_start_line

        late = above_start(tables["errors"], getattr(hist, "fleet", None))
        if late is not None:
            summary["above_start"] = late
            log.warning(above_start_line(late, summary["rounds_completed"],
                                         getattr(strategy, "privacy", None) is not None))
    said = free_run_warning(summary)       # after every status (it names it: ok)
    if said:
        (log.warning if said[1] else log.info)(said[0])
    return Result(tables, summary, model, strategy.estimate(), dataset, diverged, settings,
                  None if per is None else per.models, None if per is None else per.se)


def communication(summary: dict, settings, model, strategy, errors, M: int,
                  measured: dict | None = None, diverged_at: list | None = None):
    """``summary["communication"]``: the bytes the run sent up and down, from what the
    strategy declares (:mod:`fnsysid.learning.communication`) times the rounds recorded and
    the clients taking part; beside them ``measured``, what the Flower runtime counted in
    its messages (None in process). Returns ``errors`` with the column ``bytes_per_client``:
    the bytes up and down per client (mean over clients) up to each round (empty when the
    strategy declares no payload). A repeat that diverged at round d (``diverged_at``)
    counts the rounds before d, and its rows from d on are empty, as its errors are."""
    from fnsysid.learning import communication as comm
    from fnsysid.results.tables import Table

    sparsity = getattr(strategy, "sparsity", None)
    if sparsity is not None and sparsity.support is None:
        sparsity = None
    plan = comm.plan_of(strategy, len(model.param_names), model, sparsity,
                        settings.personalize.name)
    repeat, rnd = np.asarray(errors["repeat"], int), np.asarray(errors["round"], int)
    S, R = int(repeat.max()) + 1, int(rnd.max())
    taking_part = comm.participants(strategy, R, M, S)
    gone = np.zeros((S, R + 1), dtype=bool)              # rows of diverged repeats
    for s, d in enumerate(diverged_at or []):
        if d is not None and s < S:
            taking_part[s, d - 1:] = 0
            gone[s, d:] = True
    out = comm.account(plan, taking_part, M)
    cumulative = out.pop("_cumulative", None)
    if cumulative is not None:
        cumulative = np.where(gone, np.nan, cumulative)
    if measured is not None:
        out["measured"] = measured
    summary["communication"] = out
    column = (np.full(len(repeat), np.nan) if cumulative is None
              else cumulative[repeat, rnd])
    return Table({**errors.columns, "bytes_per_client": column})


#: a client whose predictions the round-off of the pooled sums moves by this fraction of
#: its data keeps fewer than two correct digits of them (:func:`conditioning`)
ROUNDOFF_LIMIT = 0.01


def conditioning(summary: dict, data, support, clients=None, enters=None,
                 model=None, own_used: bool | str = True) -> None:
    """The pooled Gram's condition number in ``summary["conditioning"]`` (per repeat, on the
    kept terms; :func:`fnsysid.results.metrics.gram_condition`). When some repeat's reaches
    1 / machine epsilon its estimate keeps no correct digit: a warning, and the status
    ``ill_conditioned`` instead of ``ok`` (exit code 3 from the command line). The same when
    the round-off of the pooled sums moves some client's predictions by
    :data:`ROUNDOFF_LIMIT` of its targets' spread or more (:func:`roundoff_lost`;
    ``conditioning.roundoff`` names those ``clients``, labels of axis 1), each target
    against its own spread with ``enters`` (n_y, p), which targets each coefficient enters;
    and when each client's own least squares loses that much where ``own_used``
    (:func:`own_fits_used`: what of the run is made from them) is not empty."""
    from fnsysid.results.metrics import (
        COND_LIMIT,
        REPEATED_CAUSES,
        flat_term,
        gram_condition,
        repeated_terms,
        repeated_words,
        roundoff_facts,
        roundoff_loss,
        zero_regressors,
    )

    cond = gram_condition(data.H, support)
    bad = [s for s, c in enumerate(cond) if not c < COND_LIMIT and not np.isnan(c)]
    summary["conditioning"] = {"cond": [float(c) for c in cond], "limit": COND_LIMIT}
    if model is not None:
        undetermined(summary, zero_regressors(data.H, support), model.param_names)
    if bad:
        summary["conditioning"]["repeats"] = bad
        worst = float(np.nanmax(cond))
        rep = None if model is None else repeated_terms(data.H, model.param_names,
                                                        model.structure, support)
        if rep is not None:
            summary["conditioning"]["repeated"] = rep
        check = (f"{repeated_words(rep)}: {REPEATED_CAUSES}" if rep else
                 "check the data for trajectories that escape or features that repeat each "
                 "other")
        log.warning("the pooled Gram matrix has condition number %.3g (repeat%s %s), at or "
                    "above 1/eps = %.3g: the estimate keeps no correct digit (status: "
                    "ill_conditioned); %s", worst, "s" if len(bad) > 1 else "",
                    ", ".join(map(str, bad[:10])), COND_LIMIT, check)
    elif model is not None and model.library is not None and data.factor is not None \
            and data.y_mean is not None and data.yy_target is not None:
        # a generic library: the loss measured against a stable solve of the same least
        # squares, the pooled one's and each client's own
        loss = roundoff_loss(model, data, support)
        own = {k[4:]: v for k, v in loss.items() if k.startswith("own_")}
        if not roundoff_lost(summary, loss, clients, flat=lambda: flat_term(
                model, data.H.sum(axis=1, keepdims=True))) and \
                not (roundoff_lost(summary, own, clients, own=True, affects=own_used,
                                   flat=lambda: flat_term(model, data.H)) and own_used):
            return
    elif not roundoff_lost(summary, roundoff_facts(data, support, enters), clients):
        return
    if summary["status"] == "ok":
        summary["status"] = "ill_conditioned"


def undetermined(summary: dict, zero: np.ndarray, names) -> None:
    """``conditioning.undetermined`` and a warning where some coefficients' regressor is 0 in
    every client's data (``zero`` (S, p), :func:`fnsysid.results.metrics.zero_regressors`):
    their printed value is no estimate. The status stays (the other coefficients are
    determined; the condition number is taken without them); ``equations.txt`` and
    ``estimates.csv``'s intervals say the same."""
    if not zero.any():
        return
    reps = [int(s) for s in np.flatnonzero(zero.any(axis=1))]
    terms = [str(names[k]) for k in np.flatnonzero(zero[reps[0]])]
    summary["conditioning"]["undetermined"] = {"terms": terms, "repeats": reps}
    shown = ", ".join(terms[:6]) + (f" and {len(terms) - 6} more" if len(terms) > 6 else "")
    log.warning("the data do not determine %d coefficient(s) (%s, repeat %d%s): their regressor "
                "is 0 in every client's training data (an input held at 0, a state that stays "
                "at 0), so their printed value is no estimate (where the rounds started, 0 for "
                "the closed forms, moved only by privacy noise where there is any; "
                "conditioning.undetermined); give data in which those terms move, or leave "
                "them out of the library", len(terms), shown, reps[0],
                f" and {len(reps) - 1} more repeat(s)" if len(reps) > 1 else "")


def estimate_from_own_fits(settings, strategy) -> str:
    """How the run's estimate is made from each client's own least squares, in words (""
    if it is not): ``oneshot`` averages them; local steps whitened by each client's own
    Gram matrix (``optimizer.scale_features=whiten``, the generic system's default) reach
    their mean."""
    from fnsysid.learning.strategies import Cyclic, Federated, Local

    if isinstance(strategy, OneShot):
        return "the estimate (strategy=oneshot averages them)"
    if isinstance(strategy, (Federated, Local, Cyclic)) \
            and getattr(settings.optimizer, "scale_features", None) == "whiten":
        return "the estimate (local steps whitened by each client's own Gram matrix)"
    return ""


def own_fits_used(settings, strategy) -> str:
    """What of the run is made from each client's own least squares, in words ("" if
    nothing): the estimate (:func:`estimate_from_own_fits`) and the personalized models of
    ``personalize=auto`` (its homogeneity test, heterogeneity and intervals are fitted to
    the own fits)."""
    uses = [estimate_from_own_fits(settings, strategy)]
    if getattr(getattr(settings, "personalize", None), "name", None) == "auto":
        uses.append("the personalized models of personalize=auto")
    return " and ".join(u for u in uses if u)


def own_precision(summary: dict, data, support, clients, model, how: str,
                  weights=None) -> None:
    """Where the run's estimate is a mean of the clients' own fits (``how``,
    :func:`estimate_from_own_fits`; ``weights`` the strategy's, None: uniform), whether the
    estimation error of that mean alone adds a one-step NRMSE that matters on some target
    (:func:`fnsysid.results.metrics.mean_error_flagged`: 0.1 or more, or 0.01 or more and
    above the noise's own; :func:`fnsysid.results.metrics.own_mean_error`): a fit its data
    hardly determine weighs on the mean as much as any other (a tank whose input is held at 5
    with a spread of 1e-6 made FedAvg's one-step NRMSE 66 where the pooled least squares gives
    0.04).
    ``summary["conditioning"]["own_precision"]`` names the clients that stand out
    (:func:`standing_out`; none where the error is spread over them, e.g. every client has
    few samples), the largest share and its client's least precise coefficient, with a
    warning; the status stays (it is about the rounds, as for a poor free run)."""
    from fnsysid.results.metrics import mean_error_flagged, own_mean_error

    err = own_mean_error(model, data, support, weights)
    if err is None:
        return
    flagged = mean_error_flagged(err)                                 # (S, n_y)
    if not flagged.any():
        return
    worst = np.where(flagged, np.nan_to_num(err["nrmse"], nan=0.0), 0.0)
    s, j = np.unravel_index(int(np.argmax(worst)), worst.shape)
    noise = float(err["noise"][s, j])
    share = err["share"][s, j]
    top = int(np.argmax(share))
    fits = int(err["fits"][s, j])
    order = standing_out(share, fits, most=None)
    names = [str(clients[m]) for m in order]
    coefficient = model.param_names[int(err["coefficient"][s, j, top])]
    summary.setdefault("conditioning", {})["own_precision"] = {
        "clients": names[:NAMED], "named": len(names), "coefficient": coefficient,
        "nrmse_added": float(worst[s, j]), "share": float(share[top]),
        "largest": str(clients[top]), "noise": noise,
        "repeats": [int(r) for r in np.flatnonzero(flagged.any(axis=1))]}
    of = f" (the noise's own: {noise:.3g})" if np.isfinite(noise) else ""
    head = ("the estimation error of the clients' own fits alone adds a one-step NRMSE of "
            f"{float(worst[s, j]):.3g}{of} to {how}, a mean of those fits that weighs them "
            "alike")
    if fits == 1:
        log.warning("the estimation error of the one client's own fit (client %s's) adds a "
                    "one-step NRMSE of %.3g%s to %s: its data determine it poorly there (few "
                    "samples for its coefficients); give it more samples", clients[top],
                    float(worst[s, j]), of, how)
        return
    if not names:
        log.warning("%s; it is spread over the fits, no client stands out (the largest share, "
                    "client %s's, is %.0f %% of %d fits): several fits are imprecise there "
                    "(few samples for their coefficients); strategy=centralized_exact weighs "
                    "each client's data by what they determine, or give the clients with few "
                    "samples more", head, clients[top], 100 * float(share[top]), fits)
        return
    shown = ", ".join(names[1:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    leave = ("" if 2 * len(names) >= fits else
             f", or leave {'that client' if len(names) == 1 else 'those clients'} out")
    log.warning("%s; %.0f %% of it is client %s's (its least precise coefficient: %s)%s: their "
                "data hardly determine their fit there; strategy=centralized_exact weighs each "
                "client's data by what they determine%s", head, 100 * float(share[top]),
                names[0], coefficient, f", then {shown}" if len(names) > 1 else "", leave)


#: the most clients ``conditioning.own_precision`` lists (``named`` counts them all)
NAMED = 20


#: a client whose share of the added error is at least this may be named
#: (:func:`standing_out`)
SHARE_LEVEL = 0.1


def standing_out(share: np.ndarray, fits: int, most: int | None = 5) -> list[int]:
    """The clients (at most ``most``, None: all; largest first) whose ``share`` (M,) of the
    error that ``fits`` clients' own fits add stands out: the largest shares down to the last
    one that is at least :data:`SHARE_LEVEL` and more than three times the median of the
    smaller shares (of the fits that enter), so that clients of about equal shares (few
    samples everywhere) are not named, two weak clients beside a strong one are, and one fit
    never is.

    >>> standing_out(np.array([0.9, 0.05, 0.05]), 3)
    [0]
    >>> standing_out(np.array([0.22, 0.2, 0.2, 0.19, 0.19]), 5)
    []
    >>> standing_out(np.array([0.98, 0.02]), 2)
    [0]
    >>> standing_out(np.array([0.593, 0.4, 0.007]), 3)
    [0, 1]
    """
    if fits < 2:
        return []
    order = [int(m) for m in np.argsort(-share, kind="stable") if share[m] > 0]
    s = share[order]
    last = -1
    for k in range(len(order) - 1):
        if s[k] >= SHARE_LEVEL and s[k] > 3.0 * float(np.median(s[k + 1:])):
            last = k
    return order[:last + 1][:most]


#: targets whose means sit at this many times their standard deviation or more are far
#: from 0 beside their spread (the cause ``offset`` of a round-off loss)
OFFSET_LEVEL = 10.0
#: a term of a generic library with the constant that moves this many times less than the
#: targets beside their means (``|mean| / sd``) is named as the cause of a round-off loss
FLAT_LEVEL = 100.0


def roundoff_lost(summary: dict, facts: dict, clients=None, own: bool = False,
                  affects: bool | str = True, flat=None) -> bool:
    """Where :func:`fnsysid.results.metrics.roundoff_facts` (``facts``, each (S, M)) says
    some client's predictions keep fewer than two correct digits (``ratio`` at or above
    :data:`ROUNDOFF_LIMIT`): ``summary["conditioning"]["roundoff"]`` names those clients,
    the ``cause`` (``offset``: the data far from 0 beside their spread, the loss seen only
    against the spread or the worst client's targets at :data:`OFFSET_LEVEL` times their
    standard deviation or more, or a term that barely moves; ``scale``: otherwise) and the
    worst ratio, a warning says it, and True (the caller sets the status). ``own``: the
    ratios are of each client's own least squares (what Flower clients send), not of the
    pooled sums; ``affects`` false (``""``): the run's results do not use them
    (:func:`own_fits_used`: neither ``oneshot``, local steps whitened by the client's own
    Gram matrix nor ``personalize=auto``), so the status stays and the line says that only
    what fits them (the model check, Cochran's Q) is not read (``roundoff.status`` false);
    a string: what uses them, which the line names. ``flat``: a function that gives the term
    that moves least beside its mean (:func:`fnsysid.results.metrics.flat_term`, of each
    client's data for ``own``, of the pooled data otherwise; called only when some loss is
    found): where the worst client's moves
    :data:`FLAT_LEVEL` times less than its targets do, relative to their means, the line
    names it (``roundoff.term``), advises an operating point and says that where the term
    moves by little more than the noise its coefficient is hardly determined there, which
    an operating point does not mend."""
    ratio = np.asarray(facts["ratio"], float)
    lost = np.nan_to_num(ratio, nan=0.0) >= ROUNDOFF_LIMIT                      # (S, M)
    if not lost.any():
        return False
    names = _labels(lost, clients if clients is not None else range(lost.shape[1]))
    s, m = np.unravel_index(int(np.nanargmax(np.where(lost, ratio, -np.inf))), lost.shape)
    who = str(clients[m]) if clients is not None else str(m)
    level, sd = float(facts["level"][s, m]), float(facts["sd"][s, m])
    term = None
    flat = None if flat is None else flat()
    if flat is not None:
        f = (s, m) if own else (s, 0)
        relative = level / sd if sd > 0 else np.inf
        if flat["term"][f] >= 0 and flat["ratio"][f] >= FLAT_LEVEL * max(relative, 1.0):
            term = {"name": flat["name"][int(flat["term"][f])], "mean": float(flat["mean"][f]),
                    "sd": float(flat["sd"][f])}
            if own:
                term["client"] = who
    # far from 0 beside their spread: the change is small against the targets' norm, or
    # the targets sit at ten times their spread or more, or a term barely moves
    offset = term is not None or not (facts["raw"][s, m] >= ROUNDOFF_LIMIT) or \
        bool(level >= OFFSET_LEVEL * sd)
    summary.setdefault("conditioning", {})["roundoff"] = {
        "clients": names, "repeats": [int(r) for r in np.flatnonzero(lost.any(axis=1))],
        "worst_ratio": float(ratio[s, m]), "cause": "offset" if offset else "scale",
        "of": "own fits" if own else "pooled sums", "status": bool(affects)}
    if term is not None:
        summary["conditioning"]["roundoff"]["term"] = term
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    plural = "s" if len(names) > 1 else ""
    what = ("the round-off of their own least squares moves the predictions of client"
            if own else "the round-off of the pooled sums moves the predictions of client")
    if term is not None:
        where = f"client {who}'s data" if own else "the fleet's data"
        moves = (f"moving by {term['sd']:.3g}" if term["sd"] > 0
                 else "not moving within the precision of the sums")
        said = (f"the term {term['name']} barely moves in {where} (about {term['mean']:.3g} "
                f"{moves}), where it nearly repeats the constant")
        mend = ("subtract an operating point (e.g. each state's and input's mean) from the "
                f"data; where {term['name']} moves by little more than the noise, those data "
                f"hardly determine its coefficient at all, which that does not mend: excite "
                f"it there, or leave {'that client' if own else 'it'} or the term out")
    if not affects:
        log.warning("%s%s %s by up to %.3g times how much their targets move%s: the model "
                    "check and Cochran's Q, which fit them, are not read; the run's estimate "
                    "does not use them (status unchanged)%s", what, plural, shown,
                    float(ratio[s, m]),
                    f"; {said}" if term is not None else
                    f" (client {who}: targets about {level:.3g} moving by {sd:.3g})",
                    f"; {mend}" if term is not None else
                    "; subtract an operating point (e.g. each state's and input's mean) "
                    "from the data to have them" if offset else "")
        return True
    # what is made from the own fits, named where the status is set for them
    made = f"; made from them: {affects}" if own and isinstance(affects, str) and affects \
        else ""
    if term is not None:
        log.warning("%s%s %s by up to %.3g times how much their targets move: %s, and the "
                    "predictions keep fewer than two correct digits (status: "
                    "ill_conditioned%s); %s", what, plural, shown, float(ratio[s, m]), said,
                    made, mend)
    elif offset:
        log.warning("%s%s %s by up to %.3g times how much their targets move: their data sit "
                    "far from 0 beside their spread (client %s: targets about %.3g moving "
                    "by %.3g), where the library's terms nearly repeat each other, and the "
                    "predictions keep fewer than two correct digits (status: "
                    "ill_conditioned%s); subtract an operating point (e.g. each state's and "
                    "input's mean) from the data before the fit", what, plural, shown,
                    float(ratio[s, m]), who, level, sd, made)
    elif own:
        log.warning("%s%s %s by up to %.3g times their data: their own data keep fewer than "
                    "two correct digits of a fit (status: ill_conditioned%s); check their data "
                    "for trajectories that escape or features that repeat each other", what,
                    plural, shown, float(ratio[s, m]), made)
    else:
        log.warning("%s%s %s by up to %.3g times their data (the sums hold a far larger "
                    "client's data at the same precision): their predictions keep fewer than "
                    "two correct digits (status: ill_conditioned); check the data for "
                    "trajectories that escape or clients whose data are many orders of "
                    "magnitude apart", what, plural, shown, float(ratio[s, m]))
    return True


def _labels(left: np.ndarray, clients) -> list[str]:
    """The labels of the clients marked in ``left`` (S, M) in some repeat."""
    return [str(clients[m]) for m in np.flatnonzero(left.any(axis=0))]


def left_out_clients(strategy, clients: list[str]) -> list[str]:
    """The labels of the clients a strategy left out of its estimate (``strategy.left_out``,
    (S, M), set by :class:`~fnsysid.learning.strategies.OneShot` for clients whose data do not
    determine their own model), each named once in a warning (the first 10) and in the
    summary (the first 50); [] when none."""
    left = getattr(strategy, "left_out", None)
    if left is None or not left.any():
        return []
    names = _labels(left, clients)
    S = left.shape[0]
    where = ("" if S == 1 else " in every repeat" if (left == left[:1]).all()
             else f" in some of the {S} repeats")
    log.warning("strategy=oneshot: %d of %d client(s) left out of the average%s, their own data "
                "not determining their model (Gram matrix of rank below %d: no data, all-zero "
                "data or too few samples): %s", len(names), left.shape[1], where,
                strategy.data.H.shape[-1], ", ".join(some(names, 10)))
    return some(names, 50)


def unscored_clients(model, dataset) -> list[str]:
    """The labels of the clients with held-out data left out of the held-out NRMSE because no
    predicted state varies in them (:func:`~fnsysid.results.metrics.scored`), named in a
    warning (the first 10) and in the summary (the first 50); [] when none."""
    ho = getattr(dataset, "heldout", None)
    if ho is None:
        return []
    left = (ho.n > 0) & ~scored(model, ho)
    if not left.any():
        return []
    names = _labels(left, dataset.clients)
    log.warning("held-out NRMSE: %d of %d client(s) left out of its max and mean, no predicted "
                "state varying in their held-out data (an NRMSE has no scale there): %s",
                len(names), left.shape[1], ", ".join(some(names, 10)))
    return some(names, 50)


def run_experiment(cfg, output_dir: str | Path) -> dict:
    """Run the experiment described by ``cfg`` and write its results into ``output_dir``.

    Files (see :func:`fnsysid.results.files.write_outputs`): ``config.yaml`` (resolved),
    ``errors.csv`` (repeat, round, e_max, e_mean and the held-out NRMSE columns),
    ``clients.csv`` (repeat, round, client, error; small M or ``output.per_client=true``),
    ``estimates.csv`` (final server estimate per repeat and parameter), ``theory.csv`` (the
    right-hand side of Theorem 1 per repeat, see :mod:`fnsysid.results.theory`), ``summary.json``,
    ``error.png``, ``fit.png`` (held-out fit of one client) and, with
    ``output.trajectories=true``, ``trajectories.parquet`` and ``truth.csv``. Returns the
    summary. Raises :class:`ConfigError` before writing anything if a setting is not allowed.
    """
    result = execute(cfg)
    write_outputs(output_dir, result.settings, result)
    return result.summary
