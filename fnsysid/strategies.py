"""Federated strategies (the ``strategy`` config group).

A strategy owns the server state and runs one communication round at a time; local work is
delegated to the ``optimizer`` (:mod:`fnsysid.optim`) and aggregation to :func:`aggregate`.
All arrays carry a leading repeats axis S and, for client quantities, a clients axis M.

With full-batch GD the K local steps are one affine map per client,
``theta_K = P_i theta_0 + q_i - C_i c`` (:class:`fnsysid.optim.LocalMap`, from
``optimizer.local_map``; None for SGD or ``optimizer.affine=false``). Each strategy then
precomputes what its round needs once per run: FedAvg and FedProx the averaged map (a round is
``theta_s <- Pbar theta_s + qbar``), FedLin the same after folding its correction (affine in
``theta_s``) into ``P_i, q_i``, Cyclic the composition of the clients' maps; Local and
SCAFFOLD keep per-client state and apply the per-client maps (O(M p^2) a round). Otherwise
(SGD) the strategy runs ``optimizer.local_steps`` step by step.
To add an algorithm, subclass :class:`Strategy`, implement ``round`` (and ``estimate`` if the
evaluated model is not the server's), and add ``conf/strategy/<name>.yaml``. The update rules
are written out in ``docs/ALGORITHMS.md``.
"""

from __future__ import annotations

import numpy as np

from .model import least_squares, pooled
from .optim import LocalMap, matvec, undo_preconditioner

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

    #: proximal weight of the local steps (FedProx)
    mu = 0.0

    def setup(self, theta0, data, model, optimizer, K, lr, seed):
        super().setup(theta0, data, model, optimizer, K, lr, seed)
        maps = self.client_maps()
        self.server_map = None if maps is None else maps.aggregate(self.weights)

    def client_maps(self) -> LocalMap | None:
        """Per-client maps from the server model to the local models (None: step by step)."""
        return self.optimizer.local_map(self.K, self.lr, mu=self.mu, correction=False)

    def local(self, **extra) -> np.ndarray:
        return self.optimizer.local_steps(self.broadcast(), self.K, self.lr, **extra)

    def local_extra(self) -> dict:
        """Extra terms of the step-by-step local steps (FedProx, FedLin)."""
        return {}

    def round(self, r):
        if self.server_map is not None:
            self.server = self.server_map(self.server[:, None, :])[:, 0]
        else:
            self.server = aggregate(self.local(**self.local_extra()), self.weights)


class FedProx(FedAvg):
    """FedAvg whose local gradient carries ``mu (theta_i - theta_s)`` (Li et al. 2020)."""

    def __init__(self, mu: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        if not mu >= 0:
            raise ValueError(f"strategy.mu={mu}; allowed: a number >= 0")
        self.mu = float(mu)

    def local_extra(self):
        return dict(mu=self.mu, anchor=self.server[:, None, :])


def _aggregate_matrices(A: np.ndarray, weights) -> np.ndarray:
    """:func:`aggregate` of (..., M, p, q) matrices."""
    flat = A.reshape(A.shape[:-2] + (-1,))
    return aggregate(flat, weights).reshape(A.shape[:-3] + A.shape[-2:])


class FedLin(FedAvg):
    """FedSysID's FedLin: local gradient corrected by ``mean_j g_j(theta_s) - g_i(theta_s)``
    (Mitra et al. 2021), so the local steps follow the global gradient.

    With affine maps the correction ``(Abar - A_i) theta_s - (cbar - c_i)`` (gradients
    ``A_i theta - c_i``) is affine in the server model and folds into ``P_i, q_i``."""

    def client_maps(self):
        maps = self.optimizer.local_map(self.K, self.lr)
        if maps is None:
            return None
        A, c = self.optimizer.gradient_map()
        dA = _aggregate_matrices(A, self.weights)[:, None] - A
        dc = aggregate(c, self.weights)[:, None] - c
        return LocalMap(maps.P - maps.C @ dA, maps.q + matvec(maps.C, dc))

    def local_extra(self):
        g = self.optimizer.gradient(self.broadcast())          # (S, M, p)
        return dict(correction=aggregate(g, self.weights)[:, None, :] - g)


class Scaffold(FedAvg):
    """SCAFFOLD with option II control variates (Karimireddy et al. 2020), full participation,
    global step size 1: local gradient ``g_i + c - c_i``; afterwards
    ``c_i <- c_i - c + (theta_s - theta_i) / (sum of local step sizes)`` and ``c = mean c_i``."""

    def setup(self, theta0, data, model, optimizer, K, lr, seed):
        Strategy.setup(self, theta0, data, model, optimizer, K, lr, seed)
        self.maps = optimizer.local_map(K, lr)
        self.c_i = np.zeros(self.broadcast().shape)
        self.c = np.zeros(self.server.shape)

    def round(self, r):
        correction = self.c[:, None, :] - self.c_i
        if self.maps is not None:
            local = self.maps(self.server[:, None, :], correction=correction)
        else:
            local = self.local(correction=correction)
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
        self.maps = optimizer.local_map(K, lr, correction=False)

    def round(self, r):
        if self.maps is not None:
            self.models = self.maps(self.models)
        else:
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
        self.maps = None
        if self.exact:
            self.server = least_squares(self.data.H, self.data.b)[:, 0]
        else:
            self.maps = optimizer.local_map(K, lr, correction=False)

    def round(self, r):
        if self.exact:
            return
        if self.maps is not None:
            self.server = self.maps(self.server[:, None, :])[:, 0]
        else:
            self.server = self.optimizer.local_steps(self.broadcast(), self.K, self.lr)[:, 0]


class Cyclic(Strategy):
    """Clients updated one after another within a round, each starting from the previous
    client's model (M K sequential steps a round); what the published pendulum code runs.
    With affine maps the M clients' maps are composed into one once per run."""

    def setup(self, theta0, data, model, optimizer, K, lr, seed):
        super().setup(theta0, data, model, optimizer, K, lr, seed)
        maps = optimizer.local_map(K, lr, correction=False)
        self.server_map = None if maps is None else maps.compose_clients()

    def round(self, r):
        if self.server_map is not None:
            self.server = self.server_map(self.server[:, None, :])[:, 0]
            return
        theta = self.server[:, None, :]
        for m in range(self.data.shape[1]):
            theta = self.optimizer.local_steps(theta, self.K, self.lr,
                                               clients=slice(m, m + 1))
        self.server = theta[:, 0]
