"""Federated strategies (the ``strategy`` config group).

A strategy owns the server state and runs one communication round at a time; local work is
delegated to the ``optimizer`` (:mod:`fnsysid.optim`) and aggregation to :func:`aggregate`.
All arrays carry a leading repeats axis S and, for client quantities, a clients axis M.
To add an algorithm, subclass :class:`Strategy`, implement ``round`` (and ``estimate`` if the
evaluated model is not the server's), and add ``conf/strategy/<name>.yaml``. The update rules
are written out in ``docs/ALGORITHMS.md``.
"""

from __future__ import annotations

import numpy as np

from .model import least_squares, pooled
from .optim import undo_preconditioner

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

    def setup(self, theta0, data, model, optimizer, K: int, lr: float, seed: int) -> None:
        """Start from server model ``theta0`` (S, p) on ``data`` (S, M clients)."""
        self.server = np.array(theta0, dtype=float)
        self.data, self.optimizer, self.K, self.lr = data, optimizer, K, lr
        self.weights = None if self.weighting == "uniform" else data.n
        optimizer.setup(data, model, seed)

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

    def local(self, **extra) -> np.ndarray:
        return self.optimizer.local_steps(self.broadcast(), self.K, self.lr, **extra)

    def round(self, r):
        self.server = aggregate(self.local(), self.weights)


class FedProx(FedAvg):
    """FedAvg whose local gradient carries ``mu (theta_i - theta_s)`` (Li et al. 2020)."""

    def __init__(self, mu: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        if not mu >= 0:
            raise ValueError(f"strategy.mu={mu}; allowed: a number >= 0")
        self.mu = float(mu)

    def round(self, r):
        anchor = self.server[:, None, :]
        self.server = aggregate(self.local(mu=self.mu, anchor=anchor), self.weights)


class FedLin(FedAvg):
    """FedSysID's FedLin: local gradient corrected by ``mean_j g_j(theta_s) - g_i(theta_s)``
    (Mitra et al. 2021), so the local steps follow the global gradient."""

    def round(self, r):
        g = self.optimizer.gradient(self.broadcast())          # (S, M, p)
        correction = aggregate(g, self.weights)[:, None, :] - g
        self.server = aggregate(self.local(correction=correction), self.weights)


class Scaffold(FedAvg):
    """SCAFFOLD with option II control variates (Karimireddy et al. 2020), full participation,
    global step size 1: local gradient ``g_i + c - c_i``; afterwards
    ``c_i <- c_i - c + (theta_s - theta_i) / (sum of local step sizes)`` and ``c = mean c_i``."""

    def setup(self, theta0, data, model, optimizer, K, lr, seed):
        super().setup(theta0, data, model, optimizer, K, lr, seed)
        self.c_i = np.zeros(self.broadcast().shape)
        self.c = np.zeros(self.server.shape)

    def round(self, r):
        local = self.local(correction=self.c[:, None, :] - self.c_i)
        delta = (self.server[:, None, :] - local) / self.optimizer.step_total(self.lr, self.K)
        if self.optimizer.precond is not None:      # steps were P (g + c - c_i): undo P
            delta = undo_preconditioner(self.optimizer.precond, self.optimizer.H,
                                        self.optimizer.n, delta)
        self.c_i = self.c_i - self.c[:, None, :] + delta
        self.c = aggregate(self.c_i, self.weights)
        self.server = aggregate(local, self.weights)


class OneShot(Strategy):
    """theta_bar_LSE of the paper's Theorem 1: the average of the clients' own exact
    least-squares estimates, computed once (a flat curve over rounds, round 0 included)."""

    def setup(self, theta0, data, model, optimizer, K, lr, seed):
        super().setup(theta0, data, model, optimizer, K, lr, seed)
        self.server = aggregate(least_squares(data.H, data.b), self.weights)

    def round(self, r):
        pass


class Local(Strategy):
    """No federation: every client runs K local steps per round from its own previous model and
    is evaluated with its own estimate (the "individual client" of the abstract)."""

    def setup(self, theta0, data, model, optimizer, K, lr, seed):
        super().setup(theta0, data, model, optimizer, K, lr, seed)
        self.models = np.array(self.broadcast())

    def round(self, r):
        self.models = self.optimizer.local_steps(self.models, self.K, self.lr)

    def estimate(self):
        return self.models


class Centralized(Strategy):
    """The non-private reference: all clients' data pooled in one place; K gradient steps of
    the optimizer per round (``exact=false``) or the pooled least-squares solution (flat)."""

    def __init__(self, exact: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.exact = bool(exact)

    def setup(self, theta0, data, model, optimizer, K, lr, seed):
        super().setup(theta0, pooled(data), model, optimizer, K, lr, seed)
        if self.exact:
            self.server = least_squares(self.data.H, self.data.b)[:, 0]

    def round(self, r):
        if not self.exact:
            self.server = self.optimizer.local_steps(self.broadcast(), self.K,
                                                     self.lr)[:, 0]


class Cyclic(Strategy):
    """Clients updated one after another within a round, each starting from the previous
    client's model (M K sequential steps a round); what the published pendulum code runs."""

    def round(self, r):
        theta = self.server[:, None, :]
        for m in range(self.data.shape[1]):
            theta = self.optimizer.local_steps(theta, self.K, self.lr,
                                               clients=slice(m, m + 1))
        self.server = theta[:, 0]
