"""The communication rounds of a run, with the metrics recorded after each round."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from .metrics import client_errors
from .model import ClientData


@dataclass
class History:
    """Errors per round: aggregates over clients (R+1, S) and optionally per client."""

    e_max: list = field(default_factory=list)
    e_mean: list = field(default_factory=list)
    per_client: list | None = None

    def record(self, e: np.ndarray) -> None:
        self.e_max.append(e.max(axis=1))
        self.e_mean.append(e.mean(axis=1))
        if self.per_client is not None:
            self.per_client.append(e.copy())


def train(strategy, data: ClientData, theta0, optimizer, model, cfg, progress=True,
          keep_clients=False):
    """Run R rounds; stop at the first round whose model is not finite.

    Returns (history, diverged_round or None).
    """
    strategy.setup(theta0, data, model, optimizer, cfg.K, cfg.lr, cfg.seed)
    hist = History(per_client=[] if keep_clients else None)
    hist.record(client_errors(strategy.estimate(), data.theta_true))
    diverged = None
    with np.errstate(over="ignore", invalid="ignore"):
        for r in tqdm(range(1, cfg.R + 1), desc="rounds", unit="round", leave=False,
                      disable=None if progress else True):
            strategy.round(r)
            e = client_errors(strategy.estimate(), data.theta_true)
            if not np.isfinite(e).all():
                diverged = r
                break
            hist.record(e)
    return hist, diverged


def keep_per_client(cfg) -> bool:
    """Whether per-client errors are kept (``output.per_client``: auto, true or false)."""
    flag = cfg.output.per_client
    if flag == "auto":
        return cfg.M <= cfg.output.per_client_max
    return bool(flag)
