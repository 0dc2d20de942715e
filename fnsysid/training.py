"""The communication rounds of a run, with the metrics recorded after each round."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from . import interrupt
from .local_work import local_steps
from .metrics import (
    SMALL,
    HeldOutScores,
    ParameterErrors,
    over_clients,
    row_means,
    shared_summary,
)
from .model import ClientData, threads

#: a run diverged when some client's error exceeds this many times the largest start error
DIVERGENCE_FACTOR = 1e3
#: columns of errors.csv after repeat and round
COLUMNS = ("e_max", "e_mean", "nrmse_1step_max", "nrmse_1step_mean", "nrmse_sim_max",
           "nrmse_sim_mean")


def growth_limit(start: float) -> float:
    """Largest error a run may reach: ``DIVERGENCE_FACTOR * max(1, start)`` with ``start`` the
    largest error at round 0."""
    return DIVERGENCE_FACTOR * max(1.0, start)


def errors_diverged(e: np.ndarray, limit: float) -> bool:
    """Whether parameter errors ``e`` (S, M) show divergence: not finite, or above ``limit``."""
    return not (np.isfinite(e).all() and e.max() <= limit)


@dataclass
class History:
    """Metrics per round, each a list of (S,) arrays (max and mean over clients), and
    optionally the per-client parameter errors."""

    rows: dict = field(default_factory=lambda: {c: [] for c in COLUMNS})
    per_client: list | None = None

    @property
    def e_max(self) -> list:
        return self.rows["e_max"]

    @property
    def e_mean(self) -> list:
        return self.rows["e_mean"]

    def record(self, e: np.ndarray, one_step=None, free_run=None, valid=None) -> None:
        """Record parameter errors ``e`` (S, M) and, if given, NRMSE (S, M) of valid clients."""
        self.add(e.max(axis=1), row_means(e),
                 None if one_step is None else over_clients(one_step, valid),
                 None if free_run is None else over_clients(free_run, valid))
        if self.per_client is not None:
            self.per_client.append(e.copy())

    def add(self, e_max: np.ndarray, e_mean: np.ndarray, one_step=None, free_run=None) -> None:
        """Record a round from its maxima and means over clients (each (S,)); ``one_step`` and
        ``free_run`` are (max, mean) pairs or None (NaN rows)."""
        self.rows["e_max"].append(e_max)
        self.rows["e_mean"].append(e_mean)
        for name, v in (("nrmse_1step", one_step), ("nrmse_sim", free_run)):
            vmax, vmean = v if v is not None else (np.full(len(e_max), np.nan),) * 2
            self.rows[name + "_max"].append(vmax)
            self.rows[name + "_mean"].append(vmean)


def _rounds(R: int, progress: bool):
    """Rounds 1..R, with a progress bar if ``progress`` (tqdm is imported only then)."""
    if not progress:
        return range(1, R + 1)
    from tqdm.auto import tqdm

    return tqdm(range(1, R + 1), desc="rounds", unit="round", leave=False, disable=None)


def train(strategy, data: ClientData, theta0, optimizer, model, cfg, progress=True,
          keep_clients=False, heldout=None, eval_every: int = 1):
    """Run R rounds; stop at the first round that diverged.

    A round diverged when the model is not finite or, with a ground truth, some client's error
    is not finite or exceeds ``DIVERGENCE_FACTOR * max(1, max_i e_0^(i))`` (finite but
    unbounded growth, e.g. the pendulum at lr = 10); without a ground truth, the same rule on
    the held-out one-step NRMSE (the loss).

    With held-out data, the one-step NRMSE is recorded every round and the free-run NRMSE at
    round 0, every ``eval_every`` rounds and at the last round. Returns (history,
    diverged_round or None).
    """
    R = int(cfg.R)                   # read once: a config lookup costs more than a round
    K = local_steps(cfg.K, data.shape[1], data.shape[0], cfg.seed)
    strategy.setup(theta0, data, model, optimizer, K, cfg.lr, cfg.seed)
    hist = History(per_client=[] if keep_clients else None)
    has_truth = bool(np.isfinite(data.theta_true).all())

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
            row, job = pending.pop()
            v = over_clients(job.result(), scores.valid)
            hist.rows["nrmse_sim_max"][row], hist.rows["nrmse_sim_mean"][row] = v

    def free_run_due(r: int) -> bool:
        return r == 0 or r == R or r % eval_every == 0

    def free_run(r: int, estimate):
        if not free_run_due(r):
            return None
        if background is None:
            return over_clients(scores.free_run(estimate), scores.valid)
        collect()
        pending.append((len(hist.e_max), background.submit(scores.free_run, estimate.copy())))
        return (np.full(estimate.shape[0], np.nan),) * 2          # filled in by collect()

    def record(r: int, estimate, e, one_step=None) -> None:
        if scores is None:
            hist.record(e)
            return
        if one_step is None:
            one_step = scores.one_step(estimate)
        hist.record(e, one_step, scores.free_run(estimate) if free_run_due(r) else None,
                    scores.valid)

    def summary(r: int, estimate) -> bool | None:
        """Record round ``r`` from summaries if it can be (None otherwise); whether the
        errors diverged (then nothing is recorded)."""
        if not summarize or estimate.shape[1] != 1:
            return None
        e_max, e_mean, s_max, s_mean = shared_summary(errors, scores, estimate)
        if r and errors_diverged(e_max, limit):
            return True
        hist.add(e_max, e_mean, None if scores is None else (s_max, s_mean),
                 None if scores is None else free_run(r, estimate))
        return False

    def grown(est, e):
        """(diverged?, one-step NRMSE if computed) by the rule above."""
        if has_truth:
            return errors_diverged(e, limit), None
        if scores is None:
            return False, None
        n1 = scores.one_step(est)
        worst = np.max(over_clients(n1, scores.valid)[0])
        return bool(worst > limit), n1       # NaN (no valid client) never diverges

    errors = ParameterErrors(data.theta_true)
    est = strategy.estimate()
    try:
        if summary(0, est) is None:
            e0 = errors(est)
            record(0, est, e0)
        if has_truth:
            start = float(np.max(hist.e_max[0]))
        elif heldout is not None:
            start = float(np.nanmax(hist.rows["nrmse_1step_max"][0], initial=0.0))
        else:
            start = 1.0
        limit = growth_limit(start)
        diverged = None
        with np.errstate(over="ignore", invalid="ignore"):
            for r in _rounds(R, progress):
                if interrupt.requested():           # SIGINT/SIGTERM: stop between rounds
                    break
                strategy.round(r)
                est = strategy.estimate()
                if not np.isfinite(est).all():
                    diverged = r
                    break
                done = summary(r, est)
                if done is None:
                    e = errors(est)
                    bad, n1 = grown(est, e)
                    if not bad:
                        record(r, est, e, n1)
                else:
                    bad = done
                if bad:
                    diverged = r
                    break
        collect()                       # also after an interrupted or diverged round
    finally:
        if background is not None:      # after an error: no free run left behind
            background.shutdown(wait=False, cancel_futures=True)
    return hist, diverged


def keep_per_client(cfg, M: int | None = None) -> bool:
    """Whether per-client errors are kept (``output.per_client``: auto, true or false)."""
    flag = cfg.output.per_client
    if flag == "auto":
        M = cfg.M if M is None else M
        return M is None or M <= cfg.output.per_client_max     # None: files not read yet
    return bool(flag)
