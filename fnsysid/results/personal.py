"""Personalized client models and confidence intervals of a finished run (in process).

:func:`personalized` computes the clients' own models of the ``personalize`` option
(:mod:`fnsysid.learning.personalize`), :func:`server_intervals` the standard errors of the
strategy's final estimate where it has a closed form, :func:`client_estimates_table`
``client_estimates.csv`` and :func:`add_personal_errors` the ``e_pers_*`` columns of
``errors.csv``. Least-squares intervals (``estimates.csv``, ``local_lo``, ``local_hi``) use
Student's t on their residual variance's degrees of freedom (:func:`t_value`), ``auto``'s the
normal quantile of ``output.ci_level`` (:func:`fnsysid.learning.personalize.z_value`); the
reasons are in ``docs/ALGORITHMS.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fnsysid.dynamics.model import pooled, residual_sums
from fnsysid.learning import personalize as pers
from fnsysid.learning.ownfit import own_fits
from fnsysid.learning.ownfit_stats import own_residual_sums
from fnsysid.learning.strategies import Centralized, OneShot
from fnsysid.results.history import DIVERGENCE_FACTOR, GROWTH_FACTOR
from fnsysid.results.metrics import ParameterErrors, zero_regressors
from fnsysid.results.tables import Table

#: how each kind of interval is made (summary.json's ``ci.method`` lists the ones a run has,
#: :func:`ci_method`)
CI_METHODS = {
    "pooled": "estimates: Student's t on the pooled residual variance's degrees of freedom",
    "oneshot": "estimates: Student's t on Welch-Satterthwaite's degrees of freedom of the "
               "clients' residual variances",
    "local": "client_estimates local_lo, local_hi: Student's t on n n_k - p_k degrees of "
             "freedom",
    "least squares": "least squares: se = sqrt(s_k^2 diag(H^-1)), one residual variance per "
                     "target (per group of targets a parameter enters together) s_k^2 = RSS_k "
                     "/ (n n_k - p_k), on the kept terms of a sparse model",
    "auto": "personalize=auto: normal quantile on the error covariance of the shrinkage "
            "estimate under the unrestricted REML heterogeneity, one residual variance per "
            "target",
}


def ci_method(estimates: str | None, per: "Personal | None") -> str:
    """summary.json's ``ci.method``: how the run's intervals were made, only those it has
    (:data:`CI_METHODS`; ``estimates`` "pooled", "oneshot" or None where ``estimates.csv``
    has no intervals, ``ci.estimates`` saying why)."""
    kinds = [estimates] if estimates else []
    if per is not None and np.isfinite(per.local_se).any():
        kinds.append("local")
    if kinds:
        kinds.append("least squares")
    if per is not None and per.option == "auto" and np.isfinite(per.se).any():
        kinds.append("auto")
    if not kinds:
        return "no intervals in this run (ci.estimates says why)"
    return "; ".join(CI_METHODS[k] for k in kinds)


@dataclass
class Personal:
    """The clients' personalized models of a run.

    ``models`` (S, M, p): each client's own model (repeat, client, parameter);
    ``se`` (S, M, p): their standard errors (NaN where they have none: ``finetune``);
    ``local`` and ``local_se`` (S, M, p): each client's own least-squares estimate and its
    standard errors (NaN where its data do not determine it); ``errors`` (S, M): each
    client's ``||models - theta_i*|| / ||theta_i*||`` (NaN without ground truth);
    ``truth`` (S, M, p) the clients' true parameters where the run knows them (NaN else).
    """

    option: str
    models: np.ndarray
    se: np.ndarray
    local: np.ndarray
    local_se: np.ndarray
    errors: np.ndarray
    truth: np.ndarray
    warning: str | None = None
    #: degrees of freedom of each local standard error (S, M, p): the residual variance's
    #: ``n n_k - p_k`` of the parameter's group (for Student's t)
    local_dof: np.ndarray | None = None
    #: ``auto``: how its REML ended (:func:`reml_summary`), None for the other options
    reml: dict | None = None


def reml_summary(fl) -> dict | None:
    """``summary.json: personalize_reml`` of a :class:`~fnsysid.learning.personalize.Fleet`,
    per repeat: the homogeneity test's statistic ``Q``, its ``pvalue`` (None with fewer than
    two clients of their own fit) and whether it ``rejected`` at ``level`` (the clients then
    get personalized models; else each gets the fleet's pooled model), the ``rank`` of the
    heterogeneity ``Sigma`` chosen (0 where not rejected), and whether its REML
    ``converged`` with its passes over the clients (``iterations``). None where the fleet
    carries no such report."""
    if getattr(fl, "reml_converged", None) is None:
        return None
    pv = np.asarray(fl.pvalue, float)
    Sig = np.asarray(fl.Sigma, float)
    scale = np.ones(Sig.shape[:2]) if fl.scale is None else np.asarray(fl.scale, float)
    # the rank in the parameters the fleet was estimated in (its eigenvalue cut is relative)
    return {"test": "Cochran's Q", "level": pers.HOMOGENEITY_LEVEL,
            "family": "each repeat on its own (a decision per repeat; ci.clients_differ "
                      "flags the run with Bonferroni over the repeats)",
            "Q": [float(q) for q in np.asarray(fl.Q, float)],
            "pvalue": [float(v) if np.isfinite(v) else None for v in pv],
            "rejected": [bool(v < pers.HOMOGENEITY_LEVEL) for v in pv],
            "rank": [int(np.linalg.matrix_rank(S / np.outer(c, c), hermitian=True))
                     if np.any(S) else 0 for S, c in zip(Sig, scale, strict=True)],
            "converged": [bool(c) for c in np.asarray(fl.reml_converged)],
            "iterations": [int(n) for n in np.asarray(fl.reml_iterations)]}


def reml_line(reml: dict | None) -> str | None:
    """The run's log line of ``auto``'s choice (None without a report): in how many repeats
    the homogeneity test found heterogeneity (of those it could test: :func:`untested`), and
    the rank chosen in each."""
    if not reml or "rejected" not in reml:
        return None
    k, S = sum(reml["rejected"]), len(reml["rejected"])
    gone = untested(reml)
    if len(gone) == S:
        return (f"personalize=auto: the clients' differences were not testable in any of the "
                f"{S} repeat(s) (see the warning); every client's model is the fleet's pooled "
                "model")
    tested = f"; not testable in {len(gone)} more, see the warning" if gone else ""
    of = f"{S - len(gone)} tested" if gone else f"{S}"
    return (f"personalize=auto: heterogeneity found in {k} of {of} repeat(s) ({reml['test']} "
            f"at level {reml['level']:g}{tested}; rank of Sigma per repeat: "
            f"{', '.join(map(str, reml['rank']))}); where it is not, or its rank is 0, every "
            "client's model is the fleet's pooled model")


def untested(reml: dict | None) -> list[int]:
    """The repeats whose homogeneity test could not be run (``pvalue`` None: fewer than two
    clients whose data determine their own fit)."""
    return [] if not reml else [s for s, v in enumerate(reml["pvalue"]) if v is None]


#: :func:`reml_warning`: below this many clients with their own fit, a heterogeneity found
#: is said to be too uncertain for the intervals to hold their level
SMALL_FLEET = 30


def reml_warning(reml: dict | None, local_se: np.ndarray | None = None) -> str | None:
    """The run's one warning line (None where there is nothing to say): the repeats where
    the clients' differences could be neither tested nor estimated (:func:`untested`; their
    models are the pooled model and :func:`blank_untested` empties their intervals), those
    whose REML did not converge, and where heterogeneity was found among fewer than
    :data:`SMALL_FLEET` clients with their own fit (a finite ``local_se`` (S, M, p)): the
    intervals take the heterogeneity as known, whose variances ``m`` clients give to about
    ``sqrt(2 / (m - 1))`` of themselves, and may cover less or more than their level (a
    Duffing fleet on its 4-term support, spread 30 % in three coefficients: 89 % at 10
    clients, 92 % at 20, 94 % at 40, against 95 % for the clients' own least squares,
    ``scripts/coverage_few_clients.py``; a linear fleet of long trajectories 94 % at 5 and
    96 % at 10; ``system=synthetic M=10 N=5 eps=0.3``, 30 repeats: 99.9 %;
    docs/ALGORITHMS.md)."""
    if not reml:
        return None
    said = []
    if local_se is not None and any(reml["rejected"]):
        own = np.isfinite(np.asarray(local_se, float)).any(axis=-1).sum(axis=1)     # (S,)
        m = int(min(own[s] for s, r in enumerate(reml["rejected"]) if r))
        if 2 <= m < SMALL_FLEET:
            said.append(
                f"personalize=auto: the heterogeneity was estimated from {m} clients' own "
                f"fits, its variances only to about {100 * np.sqrt(2 / (m - 1)):.0f} % "
                "(sqrt(2 / (m - 1))), and the intervals of client_estimates.csv (se, ci_lo, "
                "ci_hi) take it as known: how well they hold their level then depends on "
                "the fleet, below or above it (95 % intervals measured: a Duffing fleet 89 % "
                "at 10 clients and 92 % at 20; a linear one 94 % at 5 and 96 % at 10; a "
                "synthetic fleet of little spread 99.9 % at 10; docs/ALGORITHMS.md)")
    gone = untested(reml)
    if gone:
        said.append(
            f"personalize=auto: in repeat(s) {', '.join(map(str, gone[:10]))}"
            f"{', ...' if len(gone) > 10 else ''} fewer than two clients have more samples "
            "than coefficients (an own fit with residual degrees of freedom), so the clients' "
            "differences can be neither tested nor estimated: every client's model there is "
            "the fleet's pooled model, whose interval covers the fleet's mean, not each "
            "client's own model, and client_estimates.csv has no interval there (se, ci_lo, "
            "ci_hi empty); give the clients more samples (N, T) than coefficients")
    bad = [s for s, c in enumerate(reml["converged"]) if not c]
    if bad:
        its = max(reml["iterations"][s] for s in bad)
        said.append(f"personalize=auto: the REML heterogeneity did not converge in repeat(s) "
                    f"{', '.join(map(str, bad))} (stopped after {its} passes over the "
                    f"clients): its Sigma_ci is the last iterate, and the intervals of "
                    f"client_estimates.csv (se, ci_lo, ci_hi) rest on it")
    return "; ".join(said) or None


def blank_untested(se: np.ndarray, reml: dict | None) -> np.ndarray:
    """``se`` (S, M, p) with NaN in the repeats :func:`untested`: there the personalized
    model is the pooled one, whose standard error says nothing of each client's own model."""
    gone = untested(reml)
    if not gone:
        return se
    se = np.array(se, float)
    se[gone] = np.nan
    return se


def n_targets(model) -> int:
    """Targets per sample (``n_y``): each sample gives that many observations."""
    return int(model.structure.shape[0])


def target_stats(model, data):
    """``(yy, blocks)`` of the statistics ``data`` for :mod:`fnsysid.learning.personalize`:
    the sums of squares per target with the model's :class:`NoiseBlocks` (one residual
    variance per group of targets), or their total with ``n_y`` where the data carry no
    per-target sums."""
    if data.yy_target is None:
        return data.yy, n_targets(model)
    return data.yy_target, pers.noise_blocks(model.structure)


def own_sse(model, data, support=None) -> np.ndarray | None:
    """Each client's own least squares' residual sum of squares per target (S, M, n_y), from
    its training QR factors (``data.factor``, :func:`fnsysid.dynamics.model.residual_sums`);
    None where the data carry no factors."""
    if support is not None:                              # as own_intervals takes it
        if data.factor is None:
            return None
        theta = own_fits(data.H, data.b, support).theta
        with np.errstate(invalid="ignore"):
            return residual_sums(model, data.factor, theta)
    return own_residual_sums(model, data)           # made once, shared with the check


def own_intervals(model, data, support=None, sse=None):
    """Least squares of the statistics ``data`` with their standard errors, one residual
    variance per target (:func:`fnsysid.learning.personalize.least_squares_intervals`); one
    for all targets where the data carry no per-target sums of squares. The residual sums
    come from the clients' QR factors where the data carry them (``sse``, default
    :func:`own_sse` of ``data`` and ``support``)."""
    if sse is None:
        sse = own_sse(model, data, support)
    if data.yy_target is None:
        return pers.least_squares_intervals(data.H, data.b, data.yy, data.n, n_targets(model),
                                            support, sse)
    return pers.least_squares_intervals(data.H, data.b, data.yy_target, data.n,
                                        pers.noise_blocks(model.structure), support, sse)


def per_parameter_dof(model, data, dof) -> np.ndarray:
    """The degrees of freedom ``dof`` (..., g) of :func:`own_intervals` for each parameter
    (..., p)."""
    if data.yy_target is None:
        return np.broadcast_to(dof, dof.shape[:-1] + (model.p,)).copy()
    return dof[..., pers.noise_blocks(model.structure).param_block]


def t_value(level: float, dof) -> np.ndarray:
    """Two-sided Student's t quantile of a confidence level on ``dof`` degrees of freedom (NaN
    where ``dof`` <= 0); ``scipy.special.stdtrit``, the inverse of Student's t distribution
    function (the same values as ``scipy.stats.t.ppf`` without importing ``scipy.stats``),
    evaluated once per distinct ``dof`` (a fleet has few: its clients' sample counts)."""
    from scipy.special import stdtrit

    dof = np.asarray(dof, float)
    values, where = np.unique(dof, return_inverse=True)
    with np.errstate(invalid="ignore"):
        t = np.where(values > 0, stdtrit(np.maximum(values, 1.0), 0.5 + level / 2), np.nan)
    return t[where].reshape(dof.shape)


def support_groups(support) -> list[tuple[list[int], np.ndarray]]:
    """The sets of repeats that share one support (S, p): ``(rows, kept)``, the repeats and
    the indices of their kept terms, in the order of each set's first repeat."""
    support = np.asarray(support, bool)
    keys = [bytes(np.packbits(row)) for row in support]
    return [([s for s, k in enumerate(keys) if k == key],
             np.flatnonzero(support[keys.index(key)])) for key in dict.fromkeys(keys)]


def _sub_blocks(blocks, kept):
    """``blocks`` (:class:`~fnsysid.learning.personalize.NoiseBlocks`, or ``n_y``) of the
    kept terms alone."""
    if isinstance(blocks, (int, np.integer)):
        return blocks
    return pers.NoiseBlocks(blocks.param_block[kept], blocks.n_targets, blocks.targets)


def _kept(msg, rows, kept) -> pers.Message:
    """The repeats ``rows`` of the clients' messages ``msg``, restricted to the terms
    ``kept``."""
    return pers.Message(msg.H[rows][..., kept[:, None], kept], msg.b[rows][..., kept],
                        msg.rss[rows], msg.dof[rows], msg.own[rows])


def pack_kept(x: np.ndarray, support, axes: int) -> np.ndarray:
    """``x`` (S, ..., p) (``axes=1``) or (S, ..., p, p) (``axes=2``) on the kept terms of
    each repeat's support (S, p) alone, in their order, padded with 0 to the largest number
    kept (k): (S, ..., k) or (S, ..., k, k). What a message of group sparsity carries
    instead of the full-size arrays, whose pruned terms are 0 (:func:`unpack_kept`)."""
    support = np.asarray(support, bool)
    k = int(support.sum(axis=1).max(initial=0))
    out = np.zeros(x.shape[:x.ndim - axes] + (k,) * axes)
    for s, row in enumerate(support):
        idx = np.flatnonzero(row)
        n = len(idx)
        if axes == 1:
            out[s, ..., :n] = x[s][..., idx]
        else:
            out[s, ..., :n, :n] = x[s][..., idx[:, None], idx]
    return out


def unpack_kept(x: np.ndarray, support, axes: int) -> np.ndarray:
    """The full-size arrays (S, ..., p) or (S, ..., p, p) of :func:`pack_kept`'s ``x``: the
    kept terms in their places, 0 for the pruned ones."""
    support = np.asarray(support, bool)
    p = support.shape[1]
    out = np.zeros(x.shape[:x.ndim - axes] + (p,) * axes)
    for s, row in enumerate(support):
        idx = np.flatnonzero(row)
        n = len(idx)
        if axes == 1:
            out[s][..., idx] = x[s, ..., :n]
        else:
            out[s][..., idx[:, None], idx] = x[s, ..., :n, :n]
    return out


def support_message(model, data, support, sse=None) -> pers.Message:
    """Each client's message for ``auto`` on a sparse model's support (S, p) (group
    sparsity): its statistics ``H``, ``b`` of the kept terms (0 for the others, so nothing
    of the pruned terms leaves the client), and the residual sums, degrees of freedom and
    whether its data determine its own model, of its own least squares on the kept terms
    (:func:`fnsysid.learning.personalize.client_message` on them). ``sse``: those least
    squares' residual sums when known (:func:`own_sse` on the support)."""
    S, M, _ = data.b.shape
    support = np.asarray(support, bool)
    yy, blocks = target_stats(model, data)
    if sse is None:
        sse = own_sse(model, data, support[:, None, :])
    H = np.where(support[:, None, :, None] & support[:, None, None, :], data.H, 0.0)
    b = np.where(support[:, None, :], data.b, 0.0)
    g = 1 if isinstance(blocks, (int, np.integer)) else blocks.g      # one variance: n_y
    rss, dof, own = np.zeros((S, M, g)), np.zeros((S, M, g)), np.zeros((S, M), bool)
    for rows, kept in support_groups(support):
        if kept.size:
            m = pers.client_message(data.H[rows][..., kept[:, None], kept],
                                    data.b[rows][..., kept], yy[rows], data.n[rows],
                                    _sub_blocks(blocks, kept), None if sse is None else sse[rows])
            rss[rows], dof[rows], own[rows] = m.rss, m.dof, m.own
    return pers.Message(H, b, rss, dof, own)


def support_fleet(msg: pers.Message, blocks, support) -> pers.Fleet:
    """The server's part of ``auto`` on the support (S, p) from the clients'
    :func:`support_message`: for each set of repeats with one support
    (:func:`support_groups`), :func:`fnsysid.learning.personalize.fleet` of the kept terms
    alone; the pieces of the :class:`~fnsysid.learning.personalize.Fleet` in the full
    parameters, 0 for the pruned terms (scale 1)."""
    S, _, p = msg.b.shape
    g = msg.rss.shape[-1]
    out = pers.Fleet(np.zeros((S, p)), np.zeros((S, p, p)), np.zeros((S, p, p)),
                     np.ones((S, g)), np.zeros((S, p, p)), np.full(S, np.nan),
                     np.full(S, np.nan), np.ones(S, bool), np.zeros(S, int), np.ones((S, p)))
    for rows, kept in support_groups(support):
        if not kept.size:
            continue
        fl = pers.fleet(_kept(msg, rows, kept), _sub_blocks(blocks, kept))
        r = np.asarray(rows)
        out.mu[np.ix_(r, kept)], out.scale[np.ix_(r, kept)] = fl.mu, fl.scale
        for name in ("cov_mu", "Sigma", "Sigma_ci"):
            getattr(out, name)[np.ix_(r, kept, kept)] = getattr(fl, name)
        out.s2[r], out.Q[r], out.pvalue[r] = fl.s2, fl.Q, fl.pvalue
        out.reml_converged[r], out.reml_iterations[r] = fl.reml_converged, fl.reml_iterations
    return out


def support_posterior(msg: pers.Message, fl: pers.Fleet, blocks,
                      support) -> tuple[np.ndarray, np.ndarray]:
    """Each client's model and standard errors (S, M, p) on the support (S, p) from its
    :func:`support_message` and the server's :func:`support_fleet`:
    :func:`fnsysid.learning.personalize.client_posterior` of the kept terms; the pruned
    terms 0, with no standard error (NaN)."""
    S, M, p = msg.b.shape
    theta, se = np.zeros((S, M, p)), np.full((S, M, p), np.nan)
    for rows, kept in support_groups(support):
        if not kept.size:
            continue
        r = np.asarray(rows)
        sub = pers.Fleet(fl.mu[np.ix_(r, kept)], fl.cov_mu[np.ix_(r, kept, kept)],
                         fl.Sigma[np.ix_(r, kept, kept)], fl.s2[r],
                         fl.Sigma_ci[np.ix_(r, kept, kept)], fl.Q[r], fl.pvalue[r],
                         scale=None if fl.scale is None else fl.scale[np.ix_(r, kept)])
        t, e = pers.client_posterior(_kept(msg, rows, kept), sub, _sub_blocks(blocks, kept))
        theta[np.ix_(r, np.arange(M), kept)], se[np.ix_(r, np.arange(M), kept)] = t, e
    return theta, se


def auto_on_support(model, data, support,
                    sse=None) -> tuple[np.ndarray, np.ndarray, dict | None]:
    """``personalize=auto`` on a sparse model's shared support (group sparsity: the terms
    the server kept, each client's own values): for each set of repeats with the same
    support (S, p), ``auto`` on the statistics of the kept terms alone (each client's own
    least squares, its residual sums and the heterogeneity on them), as the clients and the
    server compute it under ``runtime=flower`` (:func:`support_message`,
    :func:`support_fleet`, :func:`support_posterior`); the pruned terms are 0 in every
    client's model, with no standard error (NaN). ``sse``: the own fits' residual sums on the
    support when known (:func:`own_sse`). Returns (models, se) (S, M, p) and the REML report
    per repeat (:func:`reml_summary`)."""
    _, blocks = target_stats(model, data)
    msg = support_message(model, data, support, sse)
    fl = support_fleet(msg, blocks, support)
    models, se = support_posterior(msg, fl, blocks, support)
    return models, se, reml_summary(fl)


def personalized(settings, model, strategy, data) -> Personal | None:
    """The ``personalize`` option's client models (None for ``none``); with ``sparsity``'s
    support, ``auto`` on the kept terms (:func:`auto_on_support`)."""
    option = settings.personalize
    if option.name == "none":
        return None
    support = getattr(getattr(strategy, "sparsity", None), "support", None)
    if support is not None and option.name == "auto":
        sup = np.asarray(support, bool)[:, None, :]
        sse = own_sse(model, data, sup)
        local, local_se, _, dof = own_intervals(model, data, sup, sse=sse)
        models, se, reml, warning = _auto(
            lambda: auto_on_support(model, data, support, sse), local_se)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            errors = ParameterErrors(data.theta_true)(models)
        return Personal(option.name, models, se, local, local_se, errors, data.theta_true,
                        warning, per_parameter_dof(model, data, dof), reml)
    sse = own_sse(model, data)
    local, local_se, _, dof = own_intervals(model, data, sse=sse)
    local_dof = per_parameter_dof(model, data, dof)
    warning, reml = None, None
    if option.name == "auto":
        yy, blocks = target_stats(model, data)

        def dense():
            models, se, fl = pers.auto(data.H, data.b, yy, data.n, blocks, sse=sse)
            return models, se, reml_summary(fl)

        models, se, reml, warning = _auto(dense, local_se)
    else:
        with np.errstate(over="ignore", invalid="ignore"):    # judged by judge_models
            models = pers.finetune(strategy.optimizer, data, model, strategy.estimate(),
                                   option.K, option.lr, settings.seed)
        se = np.full(models.shape, np.nan)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        errors = ParameterErrors(data.theta_true)(models)
    return Personal(option.name, models, se, local, local_se, errors, data.theta_true, warning,
                    local_dof, reml)


def auto_outcome(se, reml: dict | None, local_se) -> tuple[np.ndarray, str | None]:
    """``auto``'s standard errors as reported (:func:`blank_untested`) and its warning line
    (:func:`reml_warning`), in process and under Flower alike."""
    return blank_untested(se, reml), reml_warning(reml, local_se)


def _auto(compute, local_se) -> tuple:
    """``(models, se, reml, warning)`` of ``compute()``, which gives ``auto``'s (models, se,
    reml): where its linear algebra raises, no models (NaN, which :func:`judge_models`
    finds not finite: the run exits 3) and a line that says why."""
    try:
        models, se, reml = compute()
    except np.linalg.LinAlgError:
        nan = np.full(np.shape(local_se), np.nan)
        return nan, nan.copy(), None, (
            "personalize=auto: a matrix of its fleet computation is singular to working "
            "precision on these data (a heterogeneity many orders of magnitude beyond the "
            "clients' information: data that escape, or terms that repeat each other; see the "
            "conditioning line): no personalized models")
    se, warning = auto_outcome(se, reml, local_se)
    return models, se, reml, warning


def _judged(models, errors, start: float, absent_ok: bool) -> dict:
    """The server's divergence and growth rules applied to one kind of client models
    ``models`` (S, M, p) with their errors ``errors`` (S, M) (NaN without ground truth):
    ``diverged`` when a model is not finite (``absent_ok``: NaN is a model the data do not
    determine, only an infinity counts) or an error is above ``DIVERGENCE_FACTOR * max(1,
    start)``; ``growing`` above ``GROWTH_FACTOR * max(1, start)``; else ``ok``."""
    models, errors = np.asarray(models, float), np.asarray(errors, float)
    bad = np.isinf(models) if absent_ok else ~np.isfinite(models)
    limit = max(1.0, start)
    e = np.where(np.isfinite(errors), errors, -np.inf)
    e = np.where(bad.any(axis=-1) | np.isinf(errors), np.inf, e)
    worst = np.unravel_index(int(np.argmax(e)), e.shape)
    out = {"status": "ok", "start": start, "final": float(e[worst]) if np.isfinite(e[worst])
           else None, "repeat": int(worst[0]), "client": int(worst[1])}
    if not np.isfinite(e[worst]) and e[worst] > 0 or e[worst] > DIVERGENCE_FACTOR * limit:
        out.update(status="diverged", factor=DIVERGENCE_FACTOR)
    elif e[worst] > GROWTH_FACTOR * limit:
        out.update(status="growing", factor=GROWTH_FACTOR)
    return out


def judge_models(per: Personal, errors) -> dict:
    """The status of every kind of client model the run reports (``personalized``: the
    ``personalize`` option's; ``local``: each client's own least squares), by the rules the
    server's model is judged by (:mod:`fnsysid.results.history`): each a dict with
    ``status`` (``ok``, ``growing``, ``diverged``; ``local``: ``ok`` or ``poor``, the
    clients' own least squares being a closed form and a diagnostic beside the run's models,
    which does not make the run's exit code), the worst ``final`` error (None where not
    finite), its ``repeat`` and ``client``, and ``start`` (the largest error at round 0)."""
    rounds = np.asarray(errors["round"])
    first = np.asarray(errors["e_max"], float)[rounds == 0]
    start = float(np.nanmax(first)) if np.isfinite(first).any() else 0.0
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        local_e = ParameterErrors(per.truth)(per.local)
    local = _judged(per.local, local_e, start, True)
    if local["status"] != "ok":     # a closed form: nothing ran away; a diagnostic, not a result
        local["status"] = "poor"
    return {"personalized": _judged(per.models, per.errors, start, False), "local": local}


def judgment_line(kind: str, option: str, j: dict) -> str | None:
    """The status line of one kind of client model (None where ``ok``)."""
    if j["status"] == "ok":
        return None
    what = {"personalized": f"personalized models (personalize={option})",
            "local": "the clients' own least squares (local)"}[kind]
    at = f"repeat {j['repeat']}, client {j['client']}"
    if j["final"] is None:
        why = f"a model not finite ({at})"
    else:
        why = (f"an error {j['final']:.3g} ({at}) above {j['factor']:g} times max(1, the "
               f"start {j['start']:.4g})")
    advice = ("; try a smaller personalize.lr or personalize.K" if kind == "personalized" and
              option == "finetune" else "")
    if kind == "local":         # a closed form: nothing ran away; its data hardly determine it
        return (f"{what} are not a result: {why}, where a fit's data hardly determine it (as "
                "many samples as coefficients or barely more, or regressors that barely move); "
                "they are a diagnostic in client_estimates.csv (local), not the run's models, "
                "whose status this does not change")
    return f"{what} {j['status']}: {why}, not a result (status: {j['status']}){advice}"


def clients_differ(model, data, support=None) -> dict:
    """Whether the clients' own fits differ by more than their noise: Cochran's Q over the
    clients with their own fit (:func:`fnsysid.learning.personalize.homogeneity`, as
    ``personalize=auto`` tests it), per repeat: ``{test, level, pvalue, rejected}``, rejected
    at the family-wise ``level`` over the S repeats (Bonferroni: p < level / S), so that a
    run of many homogeneous repeats is not flagged for the test's own 5 % per repeat. The
    server's intervals (:func:`server_intervals`) treat the clients as one system; where the
    test rejects they cover the pooled value, not the clients' mean truth. With a sparse
    model's ``support`` (S, p), the own fits and the test are on its kept terms, as the
    intervals are, and on the terms the data determine (:func:`zero_regressors`; ``support``
    in the summary names which)."""
    yy, blocks = target_stats(model, data)
    label = None if support is None else "the kept terms"
    zero = zero_regressors(data.H, support)     # coefficients no data determine: left out
    if zero.any():
        support = ~zero if support is None else np.asarray(support, bool) & ~zero
        label = label or "the determined terms"
    if support is None:
        msg = pers.client_message(data.H, data.b, yy, data.n, blocks, own_sse(model, data))
        pv = np.asarray(pers.homogeneity_from(msg, blocks, own_fits(data.H, data.b).theta)[1],
                        float)
    else:                    # the messages of auto on a support, tested group by group
        msg = support_message(model, data, support)
        pv = np.full(len(msg.b), np.nan)
        for rows, kept in support_groups(support):
            if kept.size:
                sub = _kept(msg, rows, kept)
                pv[rows] = pers.homogeneity_from(sub, _sub_blocks(blocks, kept),
                                                 own_fits(sub.H, sub.b).theta)[1]
    level = pers.HOMOGENEITY_LEVEL
    out = {"test": "Cochran's Q", "level": level, "family": "Bonferroni over the repeats",
           "pvalue": [float(v) if np.isfinite(v) else None for v in pv],
           "rejected": [bool(v < level / len(pv)) for v in pv]}
    if label:
        out["support"] = label
    return out


def differ_line(differ: dict | None, note: str) -> str | None:
    """The log line when :func:`clients_differ` rejects in some repeat (``note``: how the
    server's intervals were made), else None."""
    if not differ or not any(differ["rejected"]):
        return None
    reps = [s for s, r in enumerate(differ["rejected"]) if r]
    low = min(differ["pvalue"][s] for s in reps)
    where = "" if len(differ["rejected"]) == 1 else \
        f" in {len(reps)} of {len(differ['rejected'])} repeats"
    # an average of the clients' own fits errs from the same average of their truths by
    # their noise alone; pooled least squares weights each client's truth by its Gram matrix
    covered = ("the same average of the clients' truths, not any one client's"
               if note.startswith("average of the clients'") else
               "the pooled value, the clients' truths weighted by their data (their Gram "
               "matrices), which is neither their plain mean nor any one client's")
    kept = ("; under sparsity a support that is not the clients' also sets their fits apart: "
            "terms may have been kept to stand for the spread, or needed ones pruned (the "
            "model check judges the kept terms)"
            if differ.get("support") == "the kept terms" else "")
    return (f"the intervals of estimates.csv ({note}) treat the clients as one system, but "
            f"their own fits differ by more than their noise (Cochran's Q, p = {low:.2g}"
            f"{where}): the intervals cover {covered}{kept} (personalize=auto models the spread "
            "and gives each client an interval)")


def server_intervals(strategy, data, model) -> tuple[np.ndarray | None, str, np.ndarray | None]:
    """Standard errors (S, 1, p) of the strategy's final estimate, how they were made and
    their degrees of freedom (S, 1, p) for Student's t; or None, the reason why it has none
    and None.

    Pooled least squares (``centralized_exact``): the pooled residual variance's
    ``n n_k - p_k`` of the parameter's group (all clients' samples). ``oneshot``: the variance
    ``sum_i w_i^2 se_i^2`` is a combination of the clients' residual variances, and its
    degrees of freedom are Welch-Satterthwaite's ``(sum_i w_i^2 se_i^2)^2 / sum_i (w_i^2
    se_i^2)^2 / nu_i`` (``nu_i`` each client's own)."""
    if data is None:
        return None, ("the server holds no statistics of the clients' data (runtime=flower); "
                      "see client_estimates.csv"), None
    if getattr(strategy, "privacy", None) is not None:
        return None, ("privacy: the estimate carries the privacy noise and clipping, which the "
                      "clients' noise covariance does not describe"), None
    sparsity = getattr(strategy, "sparsity", None)
    support = None if sparsity is None else sparsity.support            # (S, p) or None
    if support is not None and getattr(sparsity, "alpha", 0.0):
        return None, (f"sparsity.alpha={sparsity.alpha}: the ridge biases the estimate by an "
                      "amount no noise covariance describes (sparsity.alpha=0 has intervals)"), None
    if isinstance(strategy, Centralized) and strategy.exact:
        pool = pooled(data)
        zero = zero_regressors(data.H, support)      # no data determine them: no interval
        kept = None if support is None and not zero.any() else \
            ~zero if support is None else support & ~zero
        _, se, _, dof = own_intervals(model, pool, None if kept is None else kept[:, None])
        note = "pooled least squares" + ("" if support is None else " refitted on the kept terms")
        if zero.any():
            note += ("; none for the coefficients the data do not determine "
                     "(conditioning.undetermined)")
        return se, note, per_parameter_dof(model, pool, dof)
    if isinstance(strategy, OneShot):
        sup = None if support is None else support[:, None]
        # the statistics OneShot was set up on (restricted to the support with sparsity; the
        # same numbers on the kept terms): their own fits are already made
        own = getattr(strategy, "data", None) or data
        _, se, _, dof = own_intervals(model, own, sup)
        nu = per_parameter_dof(model, own, dof)                             # (S, M, p)
        w = np.ones(data.n.shape) if strategy.weights is None else strategy.weights
        w = w * own_fits(own.H, own.b, sup).full     # the clients the average takes
        w = w / w.sum(axis=1, keepdims=True)
        part = np.where(w[..., None] > 0, w[..., None] ** 2 * se ** 2, 0.0)    # (S, M, p)
        var = part.sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            ws = var ** 2 / np.where(part > 0, part ** 2 / nu, 0.0).sum(axis=1)
        if support is not None:
            var = np.where(support, var, np.nan)
        note = "average of the clients' least squares"
        se_all = np.sqrt(var)[:, None]
        if support is None and not np.isfinite(se_all).any():
            return None, (f"{note}: no client has more samples than coefficients, so none "
                          "has a residual variance to give its fit an error (more samples a "
                          "client, or strategy=centralized_exact, whose pooled fit has one)"), None
        return (se_all, note if support is None else note + " on the kept terms",
                ws[:, None])
    return None, ("the estimate is an iterate of gradient steps, not the solution of a "
                  "least-squares problem: its error is mostly the distance to its fixed point, "
                  "which no noise covariance describes (strategy=centralized_exact or oneshot "
                  "have intervals)"), None


def client_estimates_table(per: Personal, param_names, level: float,
                           labels=None) -> Table:
    """``client_estimates.csv``: one row per (repeat, client, parameter) with the
    personalized ``estimate``, ``se``, ``ci_lo``, ``ci_hi``, the client's own least squares
    ``local`` with ``local_se`` and its interval ``local_lo``, ``local_hi`` (Student's t on
    the degrees of freedom of its residual variance), and ``truth`` (empty where unknown)."""
    S, M, p = per.models.shape
    z = pers.z_value(level)
    tq = (np.full(per.local.shape, np.nan) if per.local_dof is None
          else t_value(level, per.local_dof))
    client = np.arange(M) if labels is None else np.asarray(labels, dtype=object)
    return Table({
        "repeat": np.repeat(np.arange(S), M * p),
        "client": np.tile(np.repeat(client, p), S),
        # fixed-width strings: pyarrow takes 1.5 million of them in a third of the time of
        # Python str objects
        "parameter": np.tile(np.asarray(param_names, dtype=str), S * M),
        "estimate": per.models.ravel(),
        "se": per.se.ravel(),
        "ci_lo": (per.models - z * per.se).ravel(),
        "ci_hi": (per.models + z * per.se).ravel(),
        "local": per.local.ravel(),
        "local_se": per.local_se.ravel(),
        "local_lo": (per.local - tq * per.local_se).ravel(),
        "local_hi": (per.local + tq * per.local_se).ravel(),
        "truth": per.truth.ravel(),
    })


def add_personal_errors(errors: Table, per: Personal | None) -> Table:
    """``errors.csv`` with ``e_pers_max`` and ``e_pers_mean`` (max and mean over clients of
    the personalized models' error) on each repeat's last recorded round, empty elsewhere and
    without ground truth or personalization."""
    e_max = np.full(len(errors), np.nan)
    e_mean = np.full(len(errors), np.nan)
    if per is not None and np.isfinite(per.errors).all():
        e = per.errors                                                  # (S, M)
        last = errors["round"] == errors["round"].max()
        rows = np.flatnonzero(last)
        e_max[rows] = e.max(axis=1)[errors["repeat"][rows]]
        e_mean[rows] = e.mean(axis=1)[errors["repeat"][rows]]
    return Table({**errors.columns, "e_pers_max": e_max, "e_pers_mean": e_mean})


def personal_summary(settings, errors, ci_note: str | None, per: Personal | None = None,
                     estimates: str | None = None) -> dict:
    """The summary's fields of this module: ``personalize`` (the option), the final
    ``e_pers`` values (mean and std over repeats of the last round's max and mean over
    clients; null without them) and ``ci`` (level, method: :func:`ci_method` of
    ``estimates``, the kind of ``estimates.csv``'s intervals; for ``estimates.csv`` what the
    intervals are or why they are empty, and ``client_estimates`` when the personalized
    intervals are not right: :func:`target_variances`, or ``auto``'s REML did not converge:
    :func:`reml_warning`); for ``auto``, ``personalize_reml`` (:func:`reml_summary`), for
    ``finetune``, ``personalize_finetune`` (its local steps ``K`` and step size ``lr``)."""
    out: dict = {"personalize": settings.personalize.name}
    if settings.personalize.name == "finetune":          # its steps from the server model
        out["personalize_finetune"] = {"K": int(settings.personalize.K),
                                       "lr": float(settings.personalize.lr)}
    if per is not None and per.reml is not None:
        out["personalize_reml"] = per.reml
    cols = getattr(errors, "columns", errors)
    for col in ("e_pers_max", "e_pers_mean"):
        v = None
        if col in cols:
            last = np.asarray(errors[col], float)[np.asarray(errors["round"]) ==
                                                   np.max(errors["round"])]
            v = last if np.isfinite(last).all() else None
        if v is None and per is not None and not np.isfinite(per.errors).all() and \
                np.isfinite(per.truth).all():     # not finite: null, listed in null_values
            v = np.array([np.inf])
        with np.errstate(invalid="ignore"):
            out[f"final_{col}_mean"] = None if v is None else float(v.mean())
            out[f"final_{col}_std"] = None if v is None else float(v.std())
    out["ci"] = {"level": settings.output.ci_level, "method": ci_method(estimates, per),
                 "estimates": ci_note}
    if per is not None and per.warning:
        out["ci"]["client_estimates"] = per.warning
    return out
