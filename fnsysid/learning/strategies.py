"""Federated strategies (the ``strategy`` config group).

A strategy owns the server state and runs one communication round at a time; local work is
delegated to the ``optimizer`` (:mod:`fnsysid.learning.optim`) and aggregation to :func:`aggregate`.
All arrays carry a leading repeats axis S and, for client quantities, a clients axis M.

With full-batch GD the K local steps are one affine map per client,
``theta_K = P_i theta_0 + q_i - C_i c`` (:class:`fnsysid.learning.optim.LocalMap`, from
``optimizer.local_map``; None for SGD or ``optimizer.affine=false``). Each strategy then
precomputes what its round needs once per run: FedAvg and FedProx the averaged map (a round is
``theta_s <- Pbar theta_s + qbar``), FedLin the same after folding its correction (affine in
``theta_s``) into ``P_i, q_i``, Cyclic the composition of the clients' maps; Local and
SCAFFOLD keep per-client state and apply the per-client maps (O(M p^2) a round). Otherwise
(SGD) the strategy runs ``optimizer.local_steps`` step by step.

The federated strategies (:class:`Federated`: FedAvg, FedProx, FedLin, SCAFFOLD) are also
written as message exchanges: the server's :meth:`~Federated.message`, each client's
:meth:`~Federated.client_update` on its own data and state (:class:`Clients`), the server's
:meth:`~Federated.server_update` on the stacked replies. Rounds without a precomputed server
map run these exchanges for all clients at once; the Flower runtime
(:mod:`fnsysid.runtimes.flower`) runs the same functions with one client per ClientApp.
A precomputed server map stands for the update rules it was derived for: a subclass that
overrides one of them (:data:`UPDATE_RULES`) without a ``client_maps`` of its own runs the
exchanges (:func:`changed_rules`), unless it declares ``affine = True``.

To add an algorithm, subclass :class:`Federated` or :class:`FedAvg` and override its
message, client update and server update (it then runs on Flower too), or subclass
:class:`Strategy` and implement ``round`` (and ``estimate`` if the evaluated model is not the
server's); add ``conf/strategy/<name>.yaml`` (docs/EXTENDING.md, "A strategy"). The update
rules are written out in ``docs/ALGORITHMS.md``.
"""

from __future__ import annotations

import logging

import numpy as np

from fnsysid.config.errors import ConfigError
from fnsysid.config.registry import Registered
from fnsysid.dynamics import random as rnd
from fnsysid.dynamics.model import least_squares, pooled
from fnsysid.learning import communication as comm
from fnsysid.learning.optim import LocalMap, matvec, undo_preconditioner
from fnsysid.learning.ownfit import OwnFits, own_fits, ranks
from fnsysid.learning.privacy import (
    clipped_mean,
    clipped_pooled,
    private_change,
    private_mean,
    private_pooled_solution,
)

WEIGHTINGS = ("uniform", "samples")
log = logging.getLogger("fnsysid")


def aggregate(models: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Weighted average of client models over the clients axis.

    Parameters
    ----------
    models : numpy.ndarray, shape (..., M, p)
        The client models.
    weights : numpy.ndarray, shape (..., M), or None, default=None
        Non-negative weights; None: the plain mean.

    Returns
    -------
    numpy.ndarray, shape (..., p)
        The aggregated model.

    Examples
    --------
    >>> aggregate(np.array([[1.0, 0.0], [3.0, 2.0]]), np.array([1.0, 3.0]))
    array([2.5, 1.5])
    """
    if weights is None:
        return models.mean(axis=-2)
    w = np.asarray(weights, float)
    return np.einsum("...m,...mp->...p", w, models) / w.sum(axis=-1)[..., None]


class Clients:
    """The client side of a federated round: the local solver, set up on the data these clients
    hold, their local work (K steps of size lr, FedProx's ``mu``) and their own state between
    rounds (SCAFFOLD's ``c_i``).

    In process one object stands for all M clients (arrays (S, M, ...)); a Flower ClientApp
    holds one for its own client alone (arrays (S, 1, ...)). ``sel`` in the methods below
    selects among the clients this object holds. The local steps are each client's
    precomputed affine map when the solver has one
    (:meth:`fnsysid.learning.optim.LocalSolver.local_map`, built on first use), else the
    solver's step-by-step ``local_steps``.

    Parameters
    ----------
    solver : fnsysid.learning.optim.LocalSolver
        The local solver, set up on the clients' data.
    K : int or numpy.ndarray of int
        The local steps, or each client's (:func:`fnsysid.learning.local_work.local_steps`).
    lr : float
        The learning rate.
    mu : float, default=0.0
        FedProx's proximal weight.
    correction : bool, default=False
        Whether the local steps take a gradient correction (SCAFFOLD, FedLin): the
        precomputed maps then keep their response to it.
    """

    def __init__(self, solver, K, lr: float, mu: float = 0.0, correction: bool = False):
        self.solver, self.K, self.lr, self.mu = solver, K, lr, float(mu)
        self.correction = correction
        self.state: dict[str, np.ndarray] = {}
        self._maps = None

    def broadcast(self, server: np.ndarray, sel=slice(None)) -> np.ndarray:
        """A server array (S, p) as the selected clients' starting point, (S, m, p)."""
        S, M = self.solver.n.shape
        return np.broadcast_to(server[:, None, :], (S, len(range(M)[sel]), server.shape[-1]))

    @staticmethod
    def active(msg: dict, sel=slice(None)) -> np.ndarray | None:
        """Where the selected clients take part (S, m) from ``msg["active"]`` ((S, M), or
        (S,) for a node's own client), or None when everyone does."""
        a = msg.get("active")
        if a is None:
            return None
        a = np.asarray(a, bool)
        return a[:, None] if a.ndim == 1 else a[:, sel]

    def step_total(self, sel=slice(None)):
        """Sum of the local step sizes of the selected clients: a float, or (S, m, 1) for
        per-client step counts."""
        total = self.solver.step_total(self.lr, self.K)
        return total if np.ndim(total) == 0 else total[:, sel, None]

    def local_steps(self, start: np.ndarray, sel=slice(None), correction=None) -> np.ndarray:
        """The K local steps of the selected clients from ``start`` (S, m, p), with a gradient
        correction held fixed during the round (FedLin, SCAFFOLD) and FedProx's proximal term
        anchored at ``start``."""
        if self._maps is None:
            self._maps = self.solver.local_map(self.K, self.lr, mu=self.mu,
                                               correction=self.correction) or False
        if self._maps:
            m = self._maps
            return LocalMap(m.P[:, sel], m.q[:, sel],
                            None if m.C is None else m.C[:, sel])(start, correction)
        extra = {} if correction is None else {"correction": correction}
        if self.mu:
            extra.update(mu=self.mu, anchor=start)
        return self.solver.local_steps(start, self.K, self.lr, clients=sel, **extra)


class Strategy(Registered):
    """Base class.

    Parameters
    ----------
    weighting : {"uniform", "samples"}, default="uniform"
        ``uniform``: the plain mean (paper Alg. 1); ``samples``: weights ``N_i T``.
    """

    config_group = "strategy"
    #: the run's differential privacy (:class:`fnsysid.learning.privacy.Privacy`), set by
    #: :func:`fnsysid.app.build.build` with ``privacy=central`` or ``local``; None without
    privacy = None
    #: p x p arrays the strategy keeps per client and repeat besides the Gram matrix of the
    #: client's statistics (its affine maps, its own fits' factors), for the memory estimate
    #: of :func:`fnsysid.app.resources.estimate_bytes`
    client_matrices = 2

    def __init__(self, weighting: str = "uniform"):
        if weighting not in WEIGHTINGS:
            raise ValueError(f"strategy.weighting={weighting}; allowed: {', '.join(WEIGHTINGS)}")
        self.weighting = weighting

    def setup(self, theta0, data, model, optimizer, K: int, lr: float, seed: int) -> None:
        """Start from server model ``theta0`` (S, p) on ``data`` (S, M clients)."""
        self.data, self.optimizer, self.K, self.lr = data, optimizer, K, lr
        optimizer.setup(data, model, seed)
        self.clients = self.make_clients(optimizer, K, lr)
        self.setup_server(theta0, data.n, seed)

    def make_clients(self, solver, K, lr) -> Clients:
        """The client side of this strategy on the data ``solver`` was set up with."""
        return Clients(solver, K, lr)

    def setup_server(self, theta0, n, seed: int = 0) -> None:
        """The server's part of :meth:`setup`: start model ``theta0`` (S, p), the clients'
        sample counts ``n`` (S, M) (the weights of ``weighting=samples``) and the root seed
        (client sampling)."""
        self.server = np.array(theta0, dtype=float)
        self.n_clients, self.seed = np.shape(n)[1], seed
        self.weights = None if self.weighting == "uniform" else np.asarray(n, float)

    def broadcast(self) -> np.ndarray:
        """The server model copied to every client, (S, M, p)."""
        return self.clients.broadcast(self.server)

    def round(self, r: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def estimate(self) -> np.ndarray:
        """Model each client is evaluated with, broadcastable to (S, M, p)."""
        return self.server[:, None, :]

    def payload(self, p: int) -> comm.Plan:
        """What one client sends and receives in one repeat, for ``p`` parameters
        (:class:`fnsysid.learning.communication.Plan`: arrays (name, shape) of float64 per
        round and once before the first round); the run's summary multiplies them by the
        rounds and the clients taking part (``communication``). A new strategy declares its
        own; this base declares none (the summary then says so)."""
        return comm.Plan(note=f"{type(self).__qualname__} declares no payload (define "
                         f"{type(self).__qualname__}.payload)")


class Federated(Strategy):
    """A strategy whose round is a sequence of message exchanges between server and clients,
    so that it runs the same in process and on a federated runtime (:mod:`fnsysid.runtimes.flower`).

    Each name in ``exchanges`` is one exchange: the server sends :meth:`message` (arrays
    (S, ...)) to the clients, each client answers with :meth:`client_update` computed from that
    message and its own data and state only, and the server combines the answers, stacked over
    clients to (S, M, ...), in :meth:`server_update`. In process a strategy may instead run a
    precomputed ``server_map`` (the same round as one affine map of the server model).

    Parameters
    ----------
    weighting : {"uniform", "samples"}, default="uniform"
        The server's mean (:class:`Strategy`).
    fraction : float, default=1.0
        The share of clients taking part in a round, in (0, 1].
    """

    exchanges: tuple[str, ...] = ("train",)
    server_map = None
    #: whether :meth:`FedAvg.client_maps` gives this class's rounds: None (default) decides by
    #: :func:`changed_rules` (a class that overrides an update rule of the class its
    #: ``client_maps`` was derived for runs the message exchanges); True: the class declares
    #: its rounds affine and its ``client_maps`` right; False: always the exchanges
    affine: bool | None = None

    def __init__(self, weighting: str = "uniform", fraction: float = 1.0):
        super().__init__(weighting)
        if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
            raise ValueError(f"strategy.fraction={fraction}; allowed: a number in (0, 1]")
        self.fraction = float(fraction)

    def participants(self, r: int) -> np.ndarray | None:
        """Clients taking part in round ``r``: None (all) or a mask (S, M) with
        ``max(1, round(fraction M))`` clients per repeat, drawn from the round's own stream
        (the same on every runtime). Under ``privacy`` each client takes part independently
        with probability ``fraction`` (Poisson sampling, what the accountant assumes)."""
        if self.fraction >= 1.0:
            return None
        S, M = self.server.shape[0], self.n_clients
        if self.privacy is not None:
            return np.stack([rnd.stream(self.seed, rnd.PARTICIPATION, s, r).random(M)
                             < self.fraction for s in range(S)])
        m = max(1, int(round(self.fraction * M)))
        mask = np.zeros((S, M), dtype=bool)
        for s in range(S):
            mask[s, rnd.stream(self.seed, rnd.PARTICIPATION, s, r).permutation(M)[:m]] = True
        return mask

    def message(self, exchange: str) -> dict[str, np.ndarray]:
        """What the server sends every client in ``exchange``."""
        return {"theta": self.server}

    def payload(self, p):
        """Each round: the server model down, the client's local model up (p each)."""
        return comm.Plan(round=comm.exchange(down=[("theta", (p,))], up=[("theta", (p,))]))

    def client_update(self, exchange: str, msg: dict, clients: Clients,
                      sel=slice(None)) -> dict[str, np.ndarray]:
        """Replies of the selected clients ``sel`` of ``clients`` to ``msg``, arrays (S, m, ...).
        ``msg["active"]``, when present, marks the repeats in which a client takes part."""
        return {"theta": clients.local_steps(clients.broadcast(msg["theta"], sel), sel)}

    def server_update(self, exchange: str, replies: dict[str, np.ndarray], sel=slice(None),
                      active=None) -> None:
        """Combine the replies (S, m, ...) of clients ``sel`` (active where ``active``)."""
        self.server = aggregate(replies["theta"], self.weights_of(sel, active))

    def weights_of(self, sel=slice(None), active=None):
        """Aggregation weights of clients ``sel``, zero where not ``active`` (None: uniform)."""
        if active is None:
            return None if self.weights is None else self.weights[:, sel]
        w = np.ones(active.shape) if self.weights is None else self.weights[:, sel]
        return w * active

    def model_change(self, replies: dict[str, np.ndarray]) -> np.ndarray:
        """Each client's change of the server model (S, M, p) from its replies to the
        ``train`` exchange, the update its DP-FedAvg round clips (privacy)."""
        return replies["theta"] - self.server[:, None, :]

    def private_round(self, r: int, active) -> None:
        """A round under ``privacy`` (DP-FedAvg): the clients' changes clipped, summed with
        Gaussian noise, divided by the expected number of participants."""
        msg = self.message("train")
        if active is not None:
            msg = {**msg, "active": active}
        replies = self.client_update("train", msg, self.clients)
        self.server = self.server + private_change(
            self.privacy, self.model_change(replies), active, self.seed, r,
            self.fraction * self.n_clients)

    def round(self, r):
        active = self.participants(r)
        if self.privacy is not None:
            self.private_round(r, active)
            return
        if active is None and self.server_map is not None:
            self.server = self.server_map(self.server[:, None, :])[:, 0]
            return
        for exchange in self.exchanges:
            msg = self.message(exchange)
            if active is not None:
                msg = {**msg, "active": active}
            replies = self.client_update(exchange, msg, self.clients)
            self.server_update(exchange, replies, active=active)


class FedAvg(Federated):
    """FNSysId / FedAvg (paper Alg. 1): every client starts from the server model, runs K local
    steps on its own data, and the server averages the local models."""

    settings = "Federated"

    #: proximal weight of the local steps (FedProx)
    mu = 0.0

    def setup(self, theta0, data, model, optimizer, K, lr, seed):
        super().setup(theta0, data, model, optimizer, K, lr, seed)
        self.server_map = None
        if self.affine is False:
            return
        changed = [] if self.affine else changed_rules(type(self))
        if changed:
            if getattr(optimizer, "affine", False):          # GD, which has the maps
                owner = comm.owner(type(self), "client_maps")
                log.info("strategy %s overrides %s of %s: its rounds run as message exchanges, "
                         "not as %s's precomputed server map (set affine = True on the class "
                         "if its client_maps gives its rounds)", _qualname(type(self)),
                         ", ".join(changed), owner.__name__, owner.__name__)
            return
        maps = self.client_maps()
        self.server_map = None if maps is None else maps.aggregate(self.weights)

    def make_clients(self, solver, K, lr):
        return Clients(solver, K, lr, mu=self.mu)

    def client_maps(self) -> LocalMap | None:
        """Per-client maps from the server model to the local models (None: step by step)."""
        return self.optimizer.local_map(self.K, self.lr, mu=self.mu, correction=False)


#: what a precomputed server map (:meth:`FedAvg.client_maps`) stands for: a class whose
#: members of these names are those of the class that defines its ``client_maps``
UPDATE_RULES = ("exchanges", "message", "client_update", "server_update", "weights_of",
                "make_clients", "round")


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def changed_rules(cls: type) -> list[str]:
    """The update rules (:data:`UPDATE_RULES`) that ``cls`` takes from elsewhere than the class
    its ``client_maps`` was derived for (the class in its MRO that defines ``client_maps``).

    Parameters
    ----------
    cls : type
        A strategy class.

    Returns
    -------
    list of str
        Empty when the precomputed server map computes ``cls``'s rounds.

    Examples
    --------

    >>> class Damped(FedAvg):
    ...     def server_update(self, exchange, replies, sel=slice(None), active=None):
    ...         self.server = 0.5 * (self.server + aggregate(replies["theta"]))
    >>> changed_rules(Damped), changed_rules(FedProx)
    (['server_update'], [])
    """
    base = comm.owner(cls, "client_maps")
    return [name for name in UPDATE_RULES if comm.owner(cls, name) is not comm.owner(base, name)]


class FedProx(FedAvg):
    """FedAvg whose local gradient carries ``mu (theta_i - theta_s)`` (Li et al. 2020).

    Parameters
    ----------
    mu : float, default=0.1
        The proximal weight.
    **kwargs
        :class:`Federated`'s parameters.
    """

    settings = "FedProx"

    def __init__(self, mu: float = 0.1, **kwargs):
        super().__init__(**kwargs)
        if not mu >= 0:
            raise ValueError(f"strategy.mu={mu}; allowed: a number >= 0")
        self.mu = float(mu)


def _aggregate_matrices(A: np.ndarray, weights) -> np.ndarray:
    """:func:`aggregate` of (..., M, p, q) matrices."""
    flat = A.reshape(A.shape[:-2] + (-1,))
    return aggregate(flat, weights).reshape(A.shape[:-3] + A.shape[-2:])


class FedLin(FedAvg):
    """FedSysID's FedLin: local gradient corrected by ``mean_j g_j(theta_s) - g_i(theta_s)``
    (Mitra et al. 2021), so the local steps follow the global gradient.

    As exchanges, two a round: the clients' gradients at the server model, then the local steps
    with the averaged gradient. In process with affine maps the correction
    ``(Abar - A_i) theta_s - (cbar - c_i)`` (gradients ``A_i theta - c_i``) is affine in the
    server model and folds into ``P_i, q_i``."""

    settings = "Federated"

    exchanges = ("gradient", "train")

    def payload(self, p):
        """Each round two exchanges: the server model down and the client's gradient up; then
        the server model and the averaged gradient down and the local model up."""
        gradient = comm.exchange(down=[("theta", (p,))], up=[("g", (p,))])
        train = comm.exchange(down=[("theta", (p,)), ("g", (p,))], up=[("theta", (p,))])
        return comm.Plan(round=gradient + train)

    def make_clients(self, solver, K, lr):
        return Clients(solver, K, lr, correction=True)

    def setup(self, theta0, data, model, optimizer, K, lr, seed):
        super().setup(theta0, data, model, optimizer, K, lr, seed)
        refuse_unstable(self, "fedlin")

    def client_maps(self):
        return fedlin_maps(self.optimizer, self.K, self.lr, self.weights)

    def message(self, exchange):
        if exchange == "gradient":
            return {"theta": self.server}
        return {"theta": self.server, "g": self.g}

    def client_update(self, exchange, msg, clients, sel=slice(None)):
        start = clients.broadcast(msg["theta"], sel)
        g_i = clients.solver.gradient(start, sel)
        if exchange == "gradient":
            return {"g": g_i}
        return {"theta": clients.local_steps(start, sel, correction=msg["g"][:, None, :] - g_i)}

    def server_update(self, exchange, replies, sel=slice(None), active=None):
        if exchange == "gradient":
            self.g = aggregate(replies["g"], self.weights_of(sel, active))
        else:
            super().server_update(exchange, replies, sel, active)


def fedlin_maps(optimizer, K, lr, weights) -> LocalMap | None:
    """FedLin's per-client maps of the server model (its correction folded into ``P_i, q_i``).

    Parameters
    ----------
    optimizer : fnsysid.learning.optim.LocalSolver
        The local solver, set up on the clients' data.
    K : int or numpy.ndarray of int
        The local steps, or each client's.
    lr : float
        The learning rate.
    weights : numpy.ndarray, shape (S, M), or None
        The clients' weights in the mean; None: the plain mean.

    Returns
    -------
    fnsysid.learning.optim.LocalMap or None
        None without affine local steps.
    """
    maps = optimizer.local_map(K, lr)
    if maps is None:
        return None
    A, c = optimizer.gradient_map()
    dA = _aggregate_matrices(A, weights)[:, None] - A
    dc = aggregate(c, weights)[:, None] - c
    return LocalMap(maps.P - maps.C @ dA, maps.q + matvec(maps.C, dc))


def round_radius(optimizer, K, lr, weights) -> np.ndarray | None:
    """Spectral radius of FedLin's round, ``theta_s <- Pbar theta_s + qbar``, on the data
    ``optimizer`` was set up with. SCAFFOLD's rounds approach the same map once its control
    variates have settled (``c_i -> g_i(theta_s)``). Above 1 the rounds diverge from any
    start off the fixed point.

    Parameters
    ----------
    optimizer : fnsysid.learning.optim.LocalSolver
        The local solver, set up on the clients' data.
    K : int or numpy.ndarray of int
        The local steps, or each client's.
    lr : float
        The learning rate.
    weights : numpy.ndarray, shape (S, M), or None
        The clients' weights in the mean; None: the plain mean.

    Returns
    -------
    numpy.ndarray, shape (S,), or None
        None without affine local steps; inf where the map is not finite.
    """
    maps = fedlin_maps(optimizer, K, lr, weights)
    if maps is None:
        return None
    with np.errstate(all="ignore"):
        P = maps.aggregate(weights).P[:, 0]
        if not np.isfinite(P).all():
            return np.where(np.isfinite(P).all(axis=(-2, -1)), 0.0, np.inf)
        return np.abs(np.linalg.eigvals(P)).max(axis=-1)


#: a round's map whose spectral radius is above this diverges (1 + round-off: directions
#: without data keep eigenvalue 1)
RADIUS_LIMIT = 1.0 + 1e-9


def refuse_unstable(strategy, name: str) -> None:
    """Refuse, before the first round, FedLin or SCAFFOLD on data where their rounds diverge
    in every repeat (:func:`round_radius` above 1 in each). Where some repeats contract the
    run goes ahead (the others are reported as diverged when they do).

    Parameters
    ----------
    strategy : Strategy
        The strategy, set up (its ``optimizer``, ``K``, ``lr`` and ``weights``).
    name : str
        Its ``strategy`` option, for the message.

    Raises
    ------
    fnsysid.config.errors.ConfigError
        In one line naming the settings, with the spectral radius at ``lr`` and at
        ``lr / 100``.
    """
    opt, K, lr = strategy.optimizer, strategy.K, strategy.lr
    rho = round_radius(opt, K, lr, strategy.weights)
    if rho is None or (rho <= RADIUS_LIMIT).any():
        return
    s = int(np.argmin(rho))
    small = round_radius(opt, K, lr / 100, strategy.weights)
    scaling = getattr(opt, "scale_features", "none")
    why = {"whiten": "each client's steps apply its own inverse Gram matrix n_i H_i^+ to the "
                     "fleet's gradient correction, which their mean amplifies where some "
                     "client's features are weakly excited",
           "diagonal": "each client's steps apply its own feature scaling to the fleet's "
                       "gradient correction"}.get(scaling, "the local steps are too large for "
                                                           "the features' scale")
    K_text = K if np.ndim(K) == 0 else "per client"
    raise ConfigError(
        f"strategy={name} with optimizer.scale_features={scaling}, lr={lr:g}, K={K_text}: a "
        f"round multiplies the distance to its fixed point by {rho[s]:.3g} or more (spectral "
        f"radius of the round's map, smallest in repeat {s}), so the rounds diverge in every "
        "repeat "
        f"({why}; at lr={lr / 100:g} it is {float(np.min(small)):.3g}); allowed: "
        "strategy=fedavg, fedprox or fednova, or settings whose rounds contract "
        "(docs/ALGORITHMS.md, fedlin)")


class Scaffold(FedAvg):
    """SCAFFOLD with option II control variates (Karimireddy et al. 2020), full participation,
    global step size 1: local gradient ``g_i + c - c_i``; afterwards
    ``c_i <- c_i - c + (theta_s - theta_i) / (sum of local step sizes)`` and ``c = mean c_i``.
    Each client keeps its ``c_i`` (per-client maps, O(M p^2) a round); the server keeps ``c``.

    With whitened features (``optimizer.scale_features=whiten``, preconditioner ``n_i H_i^+``)
    every client's Gram matrix must have full rank (:func:`determined`): ``H_i^+`` is blind to
    the directions a client's data lack, so its local steps cannot apply the correction
    ``c - c_i`` there and its ``c_i`` drifts, moving the result (4 clients, one all zeros: 0.09
    from the other three's solution). Such data are refused (with ``sparsity``, whose
    restricted statistics are zero outside the support, a client needs full rank on the kept
    terms only)."""

    settings = "Federated"

    def setup(self, theta0, data, model, optimizer, K, lr, seed):
        if getattr(optimizer, "scale_features", "none") == "whiten":
            support = getattr(optimizer, "support", None)     # sparsity: restricted data
            ok = determined(data.H, support)
            if not ok.all():
                bad = np.flatnonzero(~ok.all(axis=0))
                what = f"the {data.H.shape[-1]} parameters" if support is None else \
                    "the terms kept by sparsity"
                raise ConfigError(
                    f"strategy=scaffold with optimizer.scale_features=whiten: {len(bad)} of "
                    f"{ok.shape[1]} client(s) (numbers {', '.join(map(str, bad[:10]))}"
                    f"{', ...' if len(bad) > 10 else ''}, from 0 in the data's order) have "
                    f"data whose Gram matrix has rank below {what}, "
                    "where whitening cannot apply SCAFFOLD's correction; allowed: "
                    "optimizer.scale_features=diagonal or none, another strategy, or data of "
                    "full rank for every client")
        super().setup(theta0, data, model, optimizer, K, lr, seed)
        refuse_unstable(self, "scaffold")

    #: per-client state: the rounds always run the exchanges (no server map to bypass)
    affine = False

    def make_clients(self, solver, K, lr):
        return Clients(solver, K, lr, correction=True)

    def client_maps(self):
        return None                       # per-client state: the rounds run the exchange

    def setup_server(self, theta0, n, seed=0):
        super().setup_server(theta0, n, seed)
        self.c = np.zeros(self.server.shape)

    def message(self, exchange):
        return {"theta": self.server, "c": self.c}

    def payload(self, p):
        """Each round the server model and control variate ``c`` down, the local model and
        the change of the client's control variate up (p each)."""
        return comm.Plan(round=comm.exchange(down=[("theta", (p,)), ("c", (p,))],
                                             up=[("theta", (p,)), ("dc", (p,))]))

    def client_update(self, exchange, msg, clients, sel=slice(None)):
        start = clients.broadcast(msg["theta"], sel)
        c = msg["c"][:, None, :]
        c_i = clients.state.get("c_i")
        if c_i is None:
            c_i = np.zeros(clients.broadcast(msg["c"]).shape)
        local = clients.local_steps(start, sel, correction=c - c_i[:, sel])
        solver = clients.solver
        delta = (start - local) / clients.step_total(sel)
        if solver.precond is not None:      # steps were P (g + c - c_i): undo P
            delta = undo_preconditioner(solver.precond[:, sel], solver.H[:, sel],
                                        solver.n[:, sel], delta)
        dc = delta - c                                  # c_i <- c_i - c + delta
        active = clients.active(msg, sel)
        if active is not None:                          # clients left out keep their c_i
            dc = dc * active[..., None]
        c_i = np.array(c_i)
        c_i[:, sel] = c_i[:, sel] + dc
        clients.state["c_i"] = c_i
        return {"theta": local, "dc": dc}

    def server_update(self, exchange, replies, sel=slice(None), active=None):
        """``c <- c + sum_i w_i (c_i' - c_i) / sum over all clients of w_i`` (with everyone
        taking part: ``c = mean c_i``); the model averages the active clients."""
        w = np.ones(self.server.shape[0:1] + (self.n_clients,)) if self.weights is None \
            else self.weights
        self.c = self.c + np.einsum("sm,smp->sp", w[:, sel], replies["dc"]) / \
            w.sum(axis=-1)[:, None]
        super().server_update(exchange, replies, sel, active)


class FedNova(FedAvg):
    """FedNova (Wang et al. 2020, "Tackling the objective inconsistency problem in heterogeneous
    federated optimization"): normalized averaging. Client i's update
    ``Delta_i = theta_s - theta_i`` is divided by its total step size ``s_i`` (the sum of its
    local step sizes, ``K_i lr`` for a constant schedule) and the server moves
    ``theta_s <- theta_s - s_eff sum_i p_i Delta_i / s_i`` with ``s_eff = sum_i p_i s_i``
    (``p_i`` the normalized weights). With equal ``K_i`` it is FedAvg; with heterogeneous
    ``K_i`` it removes FedAvg's pull towards the clients that take more steps.

    In process with affine maps each client's normalized update is affine in the server model,
    so a round is again one averaged map."""

    settings = "Federated"

    def client_maps(self):
        maps = self.optimizer.local_map(self.K, self.lr, correction=False)
        if maps is None:
            return None
        s_i = np.broadcast_to(self.optimizer.step_total(self.lr, self.K), self.data.n.shape)
        s_eff = (_normalized(self.weights, s_i.shape) * s_i).sum(axis=-1, keepdims=True)
        scale = s_eff / s_i                                               # (S, M)
        eye = np.eye(maps.P.shape[-1])
        return LocalMap(eye + scale[..., None, None] * (maps.P - eye),
                        scale[..., None] * maps.q)

    def payload(self, p):
        """Each round the server model down, the normalized update (p) and the total step
        size (1) up."""
        return comm.Plan(round=comm.exchange(down=[("theta", (p,))],
                                             up=[("d", (p,)), ("s", (1,))]))

    def client_update(self, exchange, msg, clients, sel=slice(None)):
        start = clients.broadcast(msg["theta"], sel)
        s_i = np.broadcast_to(clients.step_total(sel), start.shape[:-1] + (1,))
        return {"d": (start - clients.local_steps(start, sel)) / s_i, "s": s_i[..., 0]}

    def server_update(self, exchange, replies, sel=slice(None), active=None):
        w = self.weights_of(sel, active)
        s_eff = (_normalized(w, replies["s"].shape) * replies["s"]).sum(axis=-1)
        self.server = self.server - s_eff[:, None] * aggregate(replies["d"], w)

    def model_change(self, replies):
        """``-s_eff d_i`` with ``s_eff`` the mean total step size over all clients (fixed by
        the configuration, not by who takes part)."""
        s_eff = replies["s"].mean(axis=-1)
        return -s_eff[:, None, None] * replies["d"]


def _normalized(weights, shape) -> np.ndarray:
    """Aggregation weights ``p_i`` summing to one over the clients axis, (S, M)."""
    w = np.ones(shape) if weights is None else np.broadcast_to(np.asarray(weights, float), shape)
    return w / w.sum(axis=-1, keepdims=True)


def determined(H: np.ndarray, support: np.ndarray | None = None) -> np.ndarray:
    """Whether each client's statistics determine its own least-squares solution: its Gram
    matrix ``H_i`` has full rank p (:func:`numpy.linalg.matrix_rank`, whose tolerance is
    ``p`` machine epsilons of the largest eigenvalue; a client without data, with all-zero
    data or with fewer samples than the features need has a lower rank).

    Parameters
    ----------
    H : numpy.ndarray, shape (..., p, p)
        The clients' Gram matrices.
    support : array_like of bool or 0/1, broadcast against (..., p), or None, default=None
        ``H`` holds statistics restricted to it
        (:func:`fnsysid.learning.sparsity.restrict_data`, zero outside) and the rank must be
        the number of kept terms instead; None: every term.

    Returns
    -------
    numpy.ndarray of bool, shape (...)
    """
    H = np.asarray(H)
    rank = ranks(H)
    if support is None:
        return rank == H.shape[-1]
    kept = np.broadcast_to(np.asarray(support, bool), H.shape[:-1]).sum(axis=-1)
    return rank == kept


class OneShot(Strategy):
    """theta_bar_LSE of the paper's Theorem 1: the average of the clients' own exact
    least-squares estimates, computed once (a flat curve over rounds, round 0 included).

    A client whose statistics do not determine its own solution (:func:`determined`) is left
    out of the average (its weight set to zero; ``left_out`` (S, M) marks them, for the
    run's warning): its minimum-norm solution would pull the average towards zero. A repeat
    in which no client determines its solution is refused.

    With ``sparsity=stlsq`` the statistics are restricted to the support (the solver's
    ``support``, (S, 1, p), set by :class:`~fnsysid.learning.sparsity.STLSQ` before this
    setup): a client then has to determine the kept terms only.
    """

    settings = "Weighted"

    #: (S, M) clients left out of the average (set by :meth:`setup`)
    left_out: np.ndarray | None = None
    #: the clients' own least squares the average is made of (set by :meth:`setup`;
    #: :func:`fnsysid.learning.ownfit.own_fits` of the statistics it was set up on)
    fits: OwnFits | None = None

    def setup(self, theta0, data, model, optimizer, K, lr, seed):
        super().setup(theta0, data, model, optimizer, K, lr, seed)
        support = getattr(optimizer, "support", None)
        self.fits = own_fits(data.H, data.b, support)
        ok = self.fits.full
        if not ok.any(axis=1).all():
            s = int(np.flatnonzero(~ok.any(axis=1))[0])
            what = f"the {data.H.shape[-1]} parameters" if support is None else \
                f"the {int(np.asarray(support, bool)[s].sum())} terms kept by sparsity"
            raise ConfigError(
                f"strategy=oneshot: no client's own data determine its least-squares model in "
                f"repeat {s} (every client's Gram matrix has rank below {what}, from at most "
                f"{int(data.n[s].max())} samples each: too few samples, or data without "
                "excitation); allowed: clients whose data have full rank, or a strategy that "
                "pools or iterates (centralized_exact, fedavg, ...)")
        self.left_out = ~ok
        if self.privacy is not None:      # noisy sum of clipped estimates over a noisy count
            self.server = private_mean(self.privacy, self.fits.theta, ok, seed)
            self.privacy.compare(self.server, aggregate(self.fits.solutions(), ok * 1.0),
                                 clipped=clipped_mean(self.privacy, self.fits.theta, ok))
            return
        w = self.weights
        if not ok.all():
            w = (np.ones(ok.shape) if w is None else w) * ok
        self.server = aggregate(self.fits.solutions(), w)

    def round(self, r):
        pass

    def payload(self, p):
        """Once, before round 1: each client's own least-squares estimate up (p); nothing
        after (the rounds are empty)."""
        return comm.Plan(start=comm.upload(("theta_i", (p,))))


class Local(Strategy):
    """No federation: every client runs K local steps per round from its own previous model and
    is evaluated with its own estimate (the "individual client" of the abstract)."""

    settings = "Weighted"

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

    def payload(self, p):
        """Nothing: each client keeps its data and its model."""
        return comm.Plan()


class Centralized(Strategy):
    """The non-private reference: all clients' data pooled in one place.

    Parameters
    ----------
    exact : bool, default=False
        True: the pooled least-squares solution (flat over rounds); False: K gradient steps
        of the optimizer per round.
    **kwargs
        :class:`Strategy`'s parameters.
    """

    settings = "Centralized"

    client_matrices = 0         # one pooled map per repeat, nothing per client

    def __init__(self, exact: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.exact = bool(exact)

    def setup(self, theta0, data, model, optimizer, K, lr, seed):
        if np.ndim(K) and not self.exact:
            raise ConfigError("strategy=centralized runs one K on the pooled data; a list or "
                              "distribution K is for federated strategies")
        super().setup(theta0, pooled(data), model, optimizer, K, lr, seed)
        self.maps = None
        if self.exact and self.privacy is not None:       # noisy sums of clipped statistics
            self.server = private_pooled_solution(self.privacy, data.H, data.b, seed,
                                                  model.structure)
            self.privacy.compare(self.server, least_squares(self.data.H, self.data.b)[:, 0],
                                 clipped=clipped_pooled(self.privacy, data.H, data.b))
        elif self.exact:
            self.server = least_squares(self.data.H, self.data.b)[:, 0]
        else:
            self.maps = optimizer.local_map(K, lr, correction=False)

    def payload(self, p):
        """Once, before round 1: each client's least-squares statistics ``H_i`` (p x p) and
        ``b_i`` (p) up, which is all the pooled fit (exact or by gradient steps) needs; with an
        optimizer that reads samples (SGD) the samples would have to be sent: not declared."""
        if not self.exact and getattr(self.optimizer, "needs_samples", False):
            return comm.Plan(note="strategy=centralized with an optimizer that reads samples "
                                  "pools the clients' samples, whose size is not declared")
        return comm.Plan(start=comm.upload(("H", (p, p)), ("b", (p,))))

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

    settings = "Weighted"

    def setup(self, theta0, data, model, optimizer, K, lr, seed):
        super().setup(theta0, data, model, optimizer, K, lr, seed)
        maps = optimizer.local_map(K, lr, correction=False)
        self.server_map = None if maps is None else maps.compose_clients()

    def payload(self, p):
        """Each round each client receives the model of the one before it and sends its own
        on (through the server): p each way."""
        return comm.Plan(round=comm.exchange(down=[("theta", (p,))], up=[("theta", (p,))]))

    def round(self, r):
        if self.server_map is not None:
            self.server = self.server_map(self.server[:, None, :])[:, 0]
            return
        theta = self.server[:, None, :]
        for m in range(self.data.shape[1]):
            theta = self.optimizer.local_steps(theta, self.K, self.lr,
                                               clients=slice(m, m + 1))
        self.server = theta[:, 0]
