"""A run's metrics per round and the rule that stops a run that diverged (both runtimes)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fnsysid.results.metrics import over_clients, row_means

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



def keep_per_client(settings, M: int | None = None) -> bool:
    """Whether per-client errors are kept (``output.per_client``: auto, true or false)."""
    flag = settings.output.per_client
    if flag == "auto":
        M = settings.M if M is None else M
        return M is None or M <= settings.output.per_client_max     # None: files not read yet
    return bool(flag)
