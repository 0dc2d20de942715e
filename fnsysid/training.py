"""The communication rounds of a run, with the metrics recorded after each round."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from .metrics import ParameterErrors, nrmse_free_run, nrmse_one_step, over_clients
from .model import ClientData

#: columns of errors.csv after repeat and round
COLUMNS = ("e_max", "e_mean", "nrmse_1step_max", "nrmse_1step_mean", "nrmse_sim_max",
           "nrmse_sim_mean")


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
        self.rows["e_max"].append(e.max(axis=1))
        self.rows["e_mean"].append(e.mean(axis=1))
        S = e.shape[0]
        for name, v in (("nrmse_1step", one_step), ("nrmse_sim", free_run)):
            vmax, vmean = over_clients(v, valid) if v is not None else (np.full(S, np.nan),) * 2
            self.rows[name + "_max"].append(vmax)
            self.rows[name + "_mean"].append(vmean)
        if self.per_client is not None:
            self.per_client.append(e.copy())


def train(strategy, data: ClientData, theta0, optimizer, model, cfg, progress=True,
          keep_clients=False, heldout=None, eval_every: int = 1):
    """Run R rounds; stop at the first round whose model is not finite.

    With held-out data, the one-step NRMSE is recorded every round and the free-run NRMSE at
    round 0, every ``eval_every`` rounds and at the last round. Returns (history,
    diverged_round or None).
    """
    strategy.setup(theta0, data, model, optimizer, cfg.K, cfg.lr, cfg.seed)
    hist = History(per_client=[] if keep_clients else None)
    has_truth = bool(np.isfinite(data.theta_true).all())

    def record(r: int, estimate, e) -> None:
        if heldout is None:
            hist.record(e)
            return
        sim = r == 0 or r == cfg.R or r % eval_every == 0
        hist.record(e, nrmse_one_step(model, estimate, heldout),
                    nrmse_free_run(model, estimate, heldout) if sim else None, heldout.valid)

    errors = ParameterErrors(data.theta_true)
    est = strategy.estimate()
    record(0, est, errors(est))
    diverged = None
    with np.errstate(over="ignore", invalid="ignore"):
        for r in tqdm(range(1, cfg.R + 1), desc="rounds", unit="round", leave=False,
                      disable=None if progress else True):
            strategy.round(r)
            est = strategy.estimate()
            e = errors(est)
            if not np.isfinite(est).all() or (has_truth and not np.isfinite(e).all()):
                diverged = r
                break
            record(r, est, e)
    return hist, diverged


def keep_per_client(cfg, M: int | None = None) -> bool:
    """Whether per-client errors are kept (``output.per_client``: auto, true or false)."""
    flag = cfg.output.per_client
    if flag == "auto":
        return (cfg.M if M is None else M) <= cfg.output.per_client_max
    return bool(flag)
