"""Federated strategies (the ``strategy`` config group).

A strategy owns the server state and runs one communication round at a time; local work is
delegated to the ``optimizer`` (:mod:`fnsysid.optim`) and aggregation to :func:`aggregate`.
All arrays carry a leading repeats axis S and, for client quantities, a clients axis M.
To add an algorithm, subclass :class:`Strategy`, implement ``round`` (and ``estimate`` if the
evaluated model is not the server's), and add ``conf/strategy/<name>.yaml``.
"""

from __future__ import annotations

import numpy as np

WEIGHTINGS = ("uniform", "samples")


def aggregate(models: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Weighted average of client models over the clients axis.

    Parameters
    ----------
    models : (..., M, p) client models.
    weights : (..., M) non-negative weights, or None for the plain mean.

    Returns
    -------
    (..., p) the aggregated model.

    Examples
    --------
    >>> aggregate(np.array([[1.0, 0.0], [3.0, 2.0]]), np.array([1.0, 3.0]))
    array([2.5, 1.5])
    """
    if weights is None:
        return models.mean(axis=-2)
    w = np.asarray(weights, float)
    return np.einsum("...m,...mp->...p", w, models) / w.sum(axis=-1)[..., None]


class Strategy:
    """Base class.

    Parameters
    ----------
    weighting : "uniform" (plain mean, paper Alg. 1) or "samples" (weights N_i T).
    """

    def __init__(self, weighting: str = "uniform"):
        if weighting not in WEIGHTINGS:
            raise ValueError(f"strategy.weighting={weighting}; allowed: {', '.join(WEIGHTINGS)}")
        self.weighting = weighting

    def setup(self, theta0: np.ndarray, data, optimizer, K: int, lr: float) -> None:
        """Start from server model ``theta0`` (S, p) on ``data`` (S, M clients)."""
        self.server = np.array(theta0, dtype=float)
        self.data, self.optimizer, self.K, self.lr = data, optimizer, K, lr
        self.weights = None if self.weighting == "uniform" else data.n

    def broadcast(self) -> np.ndarray:
        """The server model copied to every client, (S, M, p)."""
        S, M = self.data.shape
        return np.broadcast_to(self.server[:, None, :], (S, M, self.server.shape[-1]))

    def round(self, r: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def estimate(self) -> np.ndarray:
        """Model each client is evaluated with, broadcastable to (S, M, p)."""
        return self.server[:, None, :]


class FedAvg(Strategy):
    """FNSysId / FedAvg (paper Alg. 1): every client starts from the server model, runs K local
    steps on its own data, and the server averages the local models."""

    def round(self, r):
        local = self.optimizer.local_steps(self.broadcast(), self.data, self.K, self.lr)
        self.server = aggregate(local, self.weights)
