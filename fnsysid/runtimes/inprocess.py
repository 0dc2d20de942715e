"""The communication rounds of a run, with the metrics recorded after each round."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from fnsysid.dynamics.model import ClientData, threads
from fnsysid.learning.local_work import local_steps
from fnsysid.results.history import (
    History,
    Repeats,
    errors_diverged,
    fleet_errors,
    growth_limit,
)
from fnsysid.results.metrics import (
    SMALL,
    HeldOutScores,
    ParameterErrors,
    over_clients,
    shared_summary,
)
from fnsysid.runtimes import interrupt


def _rounds(R: int, progress: bool):
    """Rounds 1..R, with a progress bar if ``progress`` (tqdm is imported only then)."""
    if not progress:
        return range(1, R + 1)
    import importlib.util

    isatty = getattr(sys.stderr, "isatty", None)
    if isatty is not None and not isatty() and importlib.util.find_spec("ipywidgets") is None:
        return range(1, R + 1)    # the text bar (disable=None) shows nothing off a terminal
    return progress_bar()(range(1, R + 1), desc="rounds", unit="round", leave=False,
                          disable=None)


def progress_bar():
    """tqdm's class for the progress bar: ``tqdm.auto`` (a widget in Jupyter) when ipywidgets
    is installed, else the plain text bar (``tqdm.auto`` without ipywidgets warns
    ``IProgress not found`` in Jupyter and falls back to text anyway)."""
    import importlib.util

    if importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.auto import tqdm
    else:
        from tqdm.std import tqdm
    return tqdm


def train(strategy, data: ClientData, theta0, optimizer, model, settings, progress=True,
          keep_clients=False, heldout=None, eval_every: int = 1):
    """Run R rounds; a repeat that diverged is left out from then on, and the run stops when
    every repeat has diverged.

    A repeat diverged at a round when its model is not finite or, with a ground truth, some
    client's error is not finite or, on the scale of the largest true parameters of the repeat
    (:func:`~fnsysid.results.history.errors_diverged`), exceeds
    ``DIVERGENCE_FACTOR * max(1, max_i e_0^(i))``
    (finite but unbounded growth, e.g. the pendulum at lr = 10); without a ground truth, the
    same rule on the held-out one-step NRMSE (the loss). Its rows from that round on are NaN;
    the other repeats run on (their rounds do not depend on it), so their errors stay on
    record. ``hist.diverged_at`` gives each repeat's round (None where it did not diverge).
    With ``sparsity`` (the server prunes across rounds) the run stops at the first divergence.

    With held-out data, the one-step NRMSE is recorded every round and the free-run NRMSE at
    round 0, every ``eval_every`` rounds and at the last round. Returns (history, the first
    round at which a repeat diverged or None).
    """
    R = int(settings.R)                   # read once: a config lookup costs more than a round
    K = local_steps(settings.K, data.shape[1], data.shape[0], settings.seed)
    sparsity = getattr(strategy, "sparsity", None)          # sparsity=stlsq: the server prunes
    if sparsity is None:
        strategy.setup(theta0, data, model, optimizer, K, settings.lr, settings.seed)
    else:                               # the support first, then the strategy on it
        sparsity.start(strategy, theta0, data, model, optimizer, K, settings.lr, settings.seed,
                       heldout=heldout)
    hist = History(per_client=[] if keep_clients else None)
    has_truth = bool(np.isfinite(data.theta_true).any(axis=-1).all())    # some scored

    scores = None if heldout is None else HeldOutScores(model, heldout)
    # many clients, one model for all, nothing per client kept: summaries read the clients'
    # statistics once per round (shared_summary), without (S, M) arrays
    summarize = (has_truth and not keep_clients
                 and (scores is None or bool(scores.valid.all())))

    # there, a free run (compute-bound rollouts) goes to a thread of its own beside the next
    # rounds (memory-bound summaries): one at a time, its row filled in when the next one is
    # due or before train returns
    background = (ThreadPoolExecutor(1, thread_name_prefix="fnsysid-free-run")
                  if summarize and scores is not None and data.shape[1] >= SMALL
                  and threads(2) > 1 else None)
    pending: list = []                  # (row, future) of the free run in flight

    def collect() -> None:
        """Wait for the free run in flight (its errors surface here) and fill in its row."""
        if pending:
            row, job, gone = pending.pop()
            v = over_clients(job.result(), scores.valid)
            hist.rows["nrmse_sim_max"][row], hist.rows["nrmse_sim_mean"][row] = (
                np.where(gone, np.nan, a) for a in v)

    def free_run_due(r: int) -> bool:
        return r == 0 or r == R or r % eval_every == 0

    def free_run(r: int, estimate):
        if not free_run_due(r):
            return None
        if background is None:
            return tuple(blank(a) for a in over_clients(scores.free_run(estimate), scores.valid))
        collect()
        pending.append((len(hist.e_max), background.submit(scores.free_run, estimate.copy()),
                        dead.copy()))
        return (np.full(estimate.shape[0], np.nan),) * 2          # filled in by collect()

    def record(r: int, estimate, e, one_step=None) -> None:
        if scores is None:
            hist.record(e)
            return
        if one_step is None:
            one_step = scores.one_step(estimate)
        hist.record(e, blank(one_step),
                    blank(scores.free_run(estimate)) if free_run_due(r) else None, scores.valid)

    S = data.shape[0]
    repeats = Repeats(S, stop_at_first=sparsity is not None)   # as in the other runtime
    judge, blank = repeats.judge, repeats.blank
    dead, diverged_at = repeats.dead, repeats.diverged_at

    def summary(r: int, estimate) -> bool | None:
        """Record round ``r`` from summaries if it can be (None otherwise); whether the run
        stops (then nothing is recorded)."""
        if not summarize or estimate.shape[1] != 1:
            return None
        e_max, e_mean, s_max, s_mean = shared_summary(errors, scores, estimate)
        if r:
            bad = ~(np.isfinite(e_max) & (e_max <= limit))
            if bad.any():               # on the fleet's scale (errors_diverged), per client
                bad = grown(estimate, errors(estimate))[0]
            if judge(r, bad):
                return True
        hist.add(blank(e_max), blank(e_mean),
                 None if scores is None else (blank(s_max), blank(s_mean)),
                 None if scores is None else free_run(r, estimate))
        return False

    def grown(est, e):
        """(diverged? per repeat (S,), one-step NRMSE if computed) by the rule above."""
        if has_truth:
            return np.array([errors_diverged(e_s, limit, n_s)
                             for e_s, n_s in zip(e, errors.norm, strict=True)]), None
        if scores is None:
            return np.zeros(S, dtype=bool), None
        n1 = scores.one_step(est)
        worst = over_clients(n1, scores.valid)[0]
        return worst > limit, n1             # NaN (no valid client) never diverges

    errors = ParameterErrors(data.theta_true)
    est = strategy.estimate()
    try:
        if summary(0, est) is None:
            e0 = errors(est)
            record(0, est, e0)
        if has_truth:
            fleet_start = fleet_errors(errors(est), errors.norm)
        if has_truth:
            start = float(np.max(hist.e_max[0]))
        elif heldout is not None:
            start = float(np.nanmax(hist.rows["nrmse_1step_max"][0], initial=0.0))
        else:
            start = 1.0
        limit = growth_limit(start)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for r in _rounds(R, progress):
                if interrupt.requested():           # SIGINT/SIGTERM: stop between rounds
                    break
                strategy.round(r)
                if sparsity is not None:
                    sparsity.after_round(strategy, r)
                est = strategy.estimate()
                if judge(r, ~np.isfinite(est).reshape(S, -1).all(axis=1)):
                    break
                done = summary(r, est)
                if done is None:
                    e = errors(est)
                    bad, n1 = grown(est, e)
                    if judge(r, bad):
                        break
                    record(r, blank(est), blank(e), blank(n1))
                elif done:
                    break
        collect()                       # also after an interrupted or diverged round
        if has_truth:                   # the growth rule's errors (fleet_errors)
            hist.fleet = {"start": fleet_start,
                          "final": blank(fleet_errors(errors(est), errors.norm))}
    finally:
        if background is not None:      # after an error: no free run left behind
            background.shutdown(wait=False, cancel_futures=True)
    hist.diverged_at = diverged_at
    return hist, min((d for d in diverged_at if d is not None), default=None)
