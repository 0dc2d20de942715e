"""Local solvers: K gradient steps on a client's least-squares loss.

The step functions are pure and broadcast over any leading axes, so the same code updates all
clients of all repeats at once, ``theta`` (S, M, p), or one client's arrays alone, ``theta``
(p,). The loss of a client is ``f(theta) = 1/2 ||Y - Theta(theta) Phi||^2``; its gradient from the
sufficient statistics is ``H theta - b`` (``reduction="sum"``, the paper's eq. 10) or that divided
by the number of samples (``reduction="mean"``).

Extra terms used by federated strategies enter every step:
``d = P (g + correction) + mu (theta - anchor)`` (FedLin/SCAFFOLD corrections, FedProx), with
``P`` the optional feature-scaling preconditioner (diagonal or full).

Full-batch GD is affine in the starting model, so its K local steps are one precomputed map
``theta_K = P theta_0 + q - C correction`` per client (:class:`LocalMap`, built by
:meth:`GD.local_map`); a strategy that uses the map pays O(M p^2) per round whatever K is.
:func:`gd_steps` is the step-by-step path (SGD's analogue, and the reference in tests).
"""

from __future__ import annotations

import numpy as np

from fnsysid.config.registry import Registered
from fnsysid.dynamics import random as rnd
from fnsysid.dynamics.model import centred_stats, equilibrated_pinv, for_slices

SCHEDULES = ("constant", "inverse_k")
REDUCTIONS = ("sum", "mean")


def step_sizes(lr: float, K, schedule: str = "constant") -> np.ndarray:
    """Step sizes of the K local steps of a round: constant, or ``lr / k`` (published code).

    Parameters
    ----------
    lr : float
        The learning rate.
    K : int or array_like of int, shape (..., M)
        The local steps, or each client's.
    schedule : {"constant", "inverse_k"}, default="constant"
        ``inverse_k``: ``lr / k`` at local step k.

    Returns
    -------
    numpy.ndarray, shape (K,) or (..., M, max K)
        For per-client ``K``, zeros after a client's own ``K_i`` steps (a zero step leaves the
        model unchanged, so every client can run ``max K`` steps).
    """
    K = np.asarray(K)
    k = np.arange(1, int(K.max()) + 1, dtype=float)
    lrs = np.full(k.shape, float(lr)) if schedule == "constant" else lr / k
    if K.ndim == 0:
        return lrs
    return np.where(k <= K[..., None], lrs, 0.0)


SCALINGS = ("none", "diagonal", "zscore", "whiten")


def preconditioner(H: np.ndarray, n: np.ndarray, kind: str = "diagonal") -> np.ndarray:
    """Feature-scaling preconditioner of each client: a diagonal or a full matrix.

    ``diagonal``: ``n / diag(H)``. Running GD on features divided by their root mean square
    ``sqrt(H_pp / n)`` (the published code's per-client z-scoring, without centring) and mapping
    the iterate back to physical units is GD with this preconditioner. Directions without data
    keep scale 1.

    ``zscore`` (the published code's per-client standardization) uses the same diagonal
    preconditioner on centred statistics; the solver then also optimizes the centred loss (see
    :class:`LocalSolver`).

    ``whiten``: ``n H^+`` (:func:`~fnsysid.dynamics.model.equilibrated_pinv`, whose cut of
    small singular values does not depend on the data's units). GD on whitened features
    ``(H / n)^(-1/2) phi`` mapped back to physical units; it removes the correlation between
    features that diagonal scaling leaves (large transients when uncentred features are
    strongly correlated, as in the quadrotor).

    Parameters
    ----------
    H : numpy.ndarray, shape (..., p, p)
        The clients' Gram matrices.
    n : array_like, shape (...)
        Their numbers of samples.
    kind : {"diagonal", "zscore", "whiten"}, default="diagonal"
        ``zscore`` takes the diagonal one (on centred statistics).

    Returns
    -------
    numpy.ndarray, shape (..., p) or (..., p, p)
        The diagonal, or for ``whiten`` the matrix.
    """
    nn = np.asarray(n, float)
    if kind == "whiten":
        return nn[..., None, None] * equilibrated_pinv(H)
    d = np.diagonal(H, axis1=-2, axis2=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(d > 0, nn[..., None] / d, 1.0)


def apply_preconditioner(P: np.ndarray, g: np.ndarray) -> np.ndarray:
    """``P g`` for a diagonal or full preconditioner.

    Parameters
    ----------
    P : numpy.ndarray, shape (..., p) or (..., p, p)
        The preconditioner (:func:`preconditioner`).
    g : numpy.ndarray, shape (..., p)
        A gradient.

    Returns
    -------
    numpy.ndarray, shape (..., p)
    """
    if P.ndim == g.ndim:
        return P * g
    return np.einsum("...pq,...q->...p", P, g)


def undo_preconditioner(P: np.ndarray, H: np.ndarray, n: np.ndarray, d: np.ndarray):
    """``P^-1 d`` (for whitening, ``H d / n``, exact where ``H`` is invertible).

    Parameters
    ----------
    P : numpy.ndarray, shape (..., p) or (..., p, p)
        The preconditioner (:func:`preconditioner`).
    H : numpy.ndarray, shape (..., p, p)
        The Gram matrices it was made from.
    n : array_like, shape (...)
        Their numbers of samples.
    d : numpy.ndarray, shape (..., p)
        A preconditioned direction.

    Returns
    -------
    numpy.ndarray, shape (..., p)
    """
    if P.ndim == d.ndim:
        return d / P
    return np.einsum("...pq,...q->...p", H, d) / np.asarray(n, float)[..., None]


def matvec(A: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``A x`` for stacks of matrices and vectors (broadcasting).

    Parameters
    ----------
    A : numpy.ndarray, shape (..., p, q)
    x : numpy.ndarray, shape (..., q)

    Returns
    -------
    numpy.ndarray, shape (..., p)
    """
    return np.einsum("...pq,...q->...p", A, x)


def lsq_gradient(theta, H, b):
    """Gradient ``H theta - b`` of the summed least-squares loss (broadcasting).

    Parameters
    ----------
    theta : numpy.ndarray, shape (..., p)
        The models.
    H : numpy.ndarray, shape (..., p, p)
        The Gram matrices.
    b : numpy.ndarray, shape (..., p)
        The moments ``X'y``.

    Returns
    -------
    numpy.ndarray, shape (..., p)
    """
    return np.einsum("...pq,...q->...p", H, theta) - b


def gd_steps(theta, H, b, n, lrs, *, reduction="sum", precond=None, mu=0.0, anchor=None,
             correction=None):
    """Full-batch local gradient steps from sufficient statistics.

    Parameters
    ----------
    theta : numpy.ndarray, shape (..., p)
        The starting models (not modified).
    H : numpy.ndarray, shape (..., p, p)
        The clients' Gram matrices (sufficient statistics).
    b : numpy.ndarray, shape (..., p)
        The clients' ``X'y``.
    n : numpy.ndarray, shape (...)
        The clients' numbers of samples (for ``reduction="mean"``).
    lrs : array_like, shape (K,) or (..., K)
        The step sizes, or per client (zeros past a client's own K_i); see
        :func:`step_sizes`.
    reduction : {"sum", "mean"}, default="sum"
        The gradient summed or averaged over samples.
    precond : numpy.ndarray, shape (..., p) or (..., p, p), or None, default=None
        A diagonal or full preconditioner.
    mu : float, default=0.0
        The proximal weight (FedProx).
    anchor : numpy.ndarray or None, default=None
        The proximal centre, broadcastable to ``theta``.
    correction : numpy.ndarray, shape (..., p), or None, default=None
        A constant gradient correction (SCAFFOLD, FedLin).

    Returns
    -------
    numpy.ndarray, shape (..., p)
        The models after ``len(lrs)`` steps.

    Examples
    --------
    One step on ``f = 1/2 (2 theta - 2)^2`` from 0 with lr 0.25 lands on the minimizer 1:

    >>> gd_steps(np.zeros(1), np.array([[4.0]]), np.array([4.0]), 1, [0.25])
    array([1.])
    """
    scale = 1.0 / np.asarray(n, float)[..., None] if reduction == "mean" else 1.0
    lrs = np.asarray(lrs, float)
    for k in range(lrs.shape[-1]):
        lr = lrs[..., k, None] if lrs.ndim > 1 else lrs[k]
        g = lsq_gradient(theta, H, b) * scale
        theta = theta - lr * _finish(g, theta, precond, mu, anchor, correction)
    return theta


def _finish(g, theta, precond, mu, anchor, correction):
    """Add the strategy's terms to a loss gradient ``g`` and precondition.

    The preconditioner (feature scaling) acts on loss gradients and gradient corrections,
    which live in feature units; the proximal term does not: with z-scored features
    ``theta' = D theta`` a proximal term ``mu/2 ||theta' - theta_s'||^2`` turns into
    ``mu (theta - theta_s)`` after mapping the step back to physical units.
    """
    if correction is not None:
        g = g + correction
    if precond is not None:
        g = apply_preconditioner(precond, g)
    if mu:
        g = g + mu * (theta - anchor)
    return g


class LocalMap:
    """K local steps of a batch of clients as one affine map of the starting model.

    ``theta_K = P theta_0 + q - C c`` where ``c`` is a gradient correction held fixed during
    the round (FedLin, SCAFFOLD). ``P`` (..., p, p) and ``q`` (..., p) carry the loss, the
    step sizes, the reduction, the preconditioner and a proximal term anchored at the starting
    model (FedProx); ``C`` (..., p, p) is the response to ``c`` (None when not kept).

    How a strategy uses it: per-client maps for per-client state (``local``, SCAFFOLD);
    :meth:`aggregate` for the server map of averaging strategies (FedAvg: ``theta_s <-
    Pbar theta_s + qbar``, O(p^2) per round); :meth:`compose_clients` for clients updated in
    sequence. A correction that is itself affine in the server model (FedLin) folds into
    ``P`` and ``q`` once.

    Parameters
    ----------
    P : numpy.ndarray, shape (..., p, p)
        The response to the starting model.
    q : numpy.ndarray, shape (..., p)
        The offset.
    C : numpy.ndarray, shape (..., p, p), or None, default=None
        The response to a correction; None: not kept.

    Examples
    --------
    >>> m = LocalMap(np.array([[0.5]]), np.array([1.0]), np.array([[2.0]]))
    >>> m(np.array([4.0]), correction=np.array([0.5]))
    array([2.])
    """

    def __init__(self, P: np.ndarray, q: np.ndarray, C: np.ndarray | None = None):
        self.P, self.q, self.C = P, q, C

    def __call__(self, theta: np.ndarray, correction: np.ndarray | None = None) -> np.ndarray:
        out = matvec(self.P, theta) + self.q
        if correction is not None:
            out = out - matvec(self.C, correction)
        return out

    def aggregate(self, weights: np.ndarray | None = None) -> LocalMap:
        """Map to the weighted mean over the clients axis (-3 of ``P``) of the local models.

        Parameters
        ----------
        weights : numpy.ndarray, shape (..., M), or None, default=None
            The clients' weights; None: the plain mean.

        Returns
        -------
        LocalMap
            The clients axis kept with length 1.
        """
        def avg(a, extra):
            if a is None:
                return None
            if weights is None:
                return a.mean(axis=-2 - extra, keepdims=True)
            w = np.asarray(weights, float)
            w = (w / w.sum(axis=-1, keepdims=True)).reshape(w.shape + (1,) * (1 + extra))
            return (w * a).sum(axis=-2 - extra, keepdims=True)

        return LocalMap(avg(self.P, 1), avg(self.q, 0), avg(self.C, 1))

    def compose_clients(self) -> LocalMap:
        """One map for the clients run one after another, client 0 first (no correction).

        Composed pairwise, ``(P2, q2) o (P1, q1) = (P2 P1, P2 q1 + q2)``, in log2(M) levels.
        """
        P, q = self.P, self.q
        while P.shape[-3] > 1:
            m = P.shape[-3] // 2 * 2
            first, second = P[..., 0:m:2, :, :], P[..., 1:m:2, :, :]
            Pn = second @ first
            qn = matvec(second, q[..., 0:m:2, :]) + q[..., 1:m:2, :]
            if P.shape[-3] > m:                                        # odd: carry the last
                Pn = np.concatenate([Pn, P[..., m:, :, :]], axis=-3)
                qn = np.concatenate([qn, q[..., m:, :]], axis=-2)
            P, q = Pn, qn
        return LocalMap(P, q)


def affine_gd(H, b, n, lr: float, K, *, schedule="constant", reduction="sum", precond=None,
              mu=0.0, correction=True, whitened=None) -> LocalMap:
    """The map of :func:`gd_steps` (``anchor`` = the starting model) as a :class:`LocalMap`.

    A step is ``theta <- A_k theta + l_k u`` with ``A_k = I - l_k (s D H + mu I)`` and
    ``u = s D b - D c + mu theta_0`` (``s`` = 1 or 1/n, ``D`` the preconditioner). After K steps
    ``theta_K = P theta_0 + G u`` with ``P = A_K ... A_1`` and ``G = sum_k A_K ... A_{k+1} l_k``,
    so ``q = G s D b`` and ``C = G D``; the proximal term ``mu (theta - theta_0)`` adds
    ``mu G theta_0`` (``P + mu G``).

    ``K`` is an int or per-client step counts (..., M) broadcasting against ``n``. A constant
    schedule uses binary powering (O(log K) products of (..., p, p) stacks); ``inverse_k``
    multiplies the K step matrices in sequence.

    Parameters
    ----------
    H : numpy.ndarray, shape (..., p, p)
        The clients' Gram matrices.
    b : numpy.ndarray, shape (..., p)
        Their moments ``X'y``.
    n : numpy.ndarray, shape (...)
        Their numbers of samples.
    lr : float
        The learning rate.
    K : int or array_like of int, shape (..., M)
        The local steps, or each client's (broadcasting against ``n``).
    schedule : {"constant", "inverse_k"}, default="constant"
        The step sizes (:func:`step_sizes`).
    reduction : {"sum", "mean"}, default="sum"
        The gradient summed or averaged over samples.
    precond : numpy.ndarray, shape (..., p) or (..., p, p), or None, default=None
        The preconditioner ``D`` (:func:`preconditioner`).
    mu : float, default=0.0
        The proximal weight (FedProx).
    correction : bool, default=True
        Keep ``C`` (False: ``C`` is None).
    whitened : tuple of two numpy.ndarray of bool, shapes (..., p) and (...), or None
        Where ``precond`` is the whitening ``n H^+`` (:func:`preconditioner`): the regressors
        that are not identically 0 (``diag(H) > 0``) and whether ``H`` has full rank on
        them. ``D H`` is then ``n`` times the 0/1 diagonal of those regressors exactly
        (``H^+`` of :func:`~fnsysid.dynamics.model.equilibrated_pinv` is 0 on the others),
        and is taken so. Computed, it is that only up to the Gram matrix's condition number
        times the machine epsilon, and the map's fixed point moves by that error times the
        model: a fleet whose input sits about 1e6 (moving by 1) ended at one-step NRMSE 3.6
        where the steps taken one by one and the clients' own fits give 0.063.

    Returns
    -------
    LocalMap
    """
    p = H.shape[-1]
    eye = np.eye(p)
    DH = H if precond is None else (precond[..., :, None] * H if precond.ndim == b.ndim
                                    else precond @ H)
    if whitened is not None and precond is not None and precond.ndim > b.ndim:
        live, full = (np.asarray(a) for a in whitened)
        exact = np.asarray(n, float)[..., None, None] * (live[..., None, :] * eye)
        DH = np.where(full[..., None, None], exact, DH)
    Db = b if precond is None else apply_preconditioner(precond, b)
    if reduction == "mean":
        inv_n = 1.0 / np.asarray(n, float)
        DH, Db = DH * inv_n[..., None, None], Db * inv_n[..., None]
    B = DH + mu * eye
    if schedule == "constant":
        P, S = _power_sum(eye - lr * B, np.asarray(K))
        G = lr * S
    else:
        lrs = step_sizes(lr, K, schedule)                          # (K,) or (..., M, K)
        P, G = np.broadcast_to(eye, B.shape).copy(), np.zeros(B.shape)
        for k in range(lrs.shape[-1]):
            lk = lrs[..., k, None, None] if lrs.ndim > 1 else lrs[k]
            A = eye - lk * B
            P, G = A @ P, A @ G + lk * eye
    if mu:
        P = P + mu * G                                 # the anchor is the starting model
    q = matvec(G, Db)
    C = None
    if correction:
        C = G if precond is None else (G * precond[..., None, :] if precond.ndim == b.ndim
                                       else G @ precond)
    return LocalMap(P, q, C)


def _power_sum(A: np.ndarray, K: np.ndarray):
    """``A^K`` and ``sum_{j<K} A^j`` by binary powering; ``K`` an int or per-client counts
    (..., M) broadcasting against ``A`` (..., M, p, p)."""
    eye = np.eye(A.shape[-1])
    P = np.broadcast_to(eye, A.shape).copy()           # A^k and sum_{j<k} A^j of the bits
    S = np.zeros(A.shape)                              # taken so far (k = 0)
    Apow, Tpow = A, np.broadcast_to(eye, A.shape)      # A^(2^i) and sum_{j<2^i} A^j
    Kmax = int(K.max())
    i = 0
    while Kmax >> i:
        bit = (K >> i) & 1
        if bit.ndim == 0:
            if bit:
                P, S = Apow @ P, S + P @ Tpow
        elif bit.any():
            take = bit.astype(bool)[..., None, None]
            P, S = np.where(take, Apow @ P, P), np.where(take, S + P @ Tpow, S)
        i += 1
        if Kmax >> i:
            Tpow = Tpow + Apow @ Tpow
            Apow = Apow @ Apow
    return P, S


class LocalSolver(Registered):
    """Base of the ``optimizer`` group: K local steps for a batch of clients.

    Parameters
    ----------
    schedule : {"constant", "inverse_k"}, default="constant"
        ``inverse_k``: lr / k at local step k, restarting each round.
    reduction : {"sum", "mean"}, default="sum"
        The per-sample gradients summed or averaged.
    scale_features : {"none", "diagonal", "zscore", "whiten"} or bool, default=False
        ``false`` is ``none``, ``true`` is ``diagonal``: local steps on rescaled features,
        iterates kept in physical units (see
        :func:`preconditioner`). ``zscore`` also centres each client's features, as the
        published code does (it centres the features only; centring the targets as well would
        change nothing, since the centred features sum to zero against any constant): the
        local loss becomes the slope part of a regression with an intercept, which has the same
        minimizer only when the feature means are zero.
    """

    config_group = "optimizer"
    needs_samples = False

    def __init__(self, schedule: str = "constant", reduction: str = "sum",
                 scale_features: bool | str = False):
        if schedule not in SCHEDULES:
            raise ValueError(f"optimizer.schedule={schedule}; allowed: {', '.join(SCHEDULES)}")
        if reduction not in REDUCTIONS:
            raise ValueError(f"optimizer.reduction={reduction}; allowed: {', '.join(REDUCTIONS)}")
        self.schedule, self.reduction = schedule, reduction
        if isinstance(scale_features, bool):
            scale_features = "diagonal" if scale_features else "none"
        if scale_features not in SCALINGS:
            raise ValueError(f"optimizer.scale_features={scale_features}; allowed: "
                             f"{', '.join(SCALINGS)} (true = diagonal, false = none)")
        self.scale_features = scale_features

    def setup(self, data, model, seed: int) -> None:
        """Prepare per-client state (loss statistics, preconditioners, shuffles) once."""
        self.H, self.b, self.n = data.H, data.b, data.n
        if self.scale_features == "zscore":
            self.H, self.b = centred_stats(data, model.structure)
        kind = "diagonal" if self.scale_features == "zscore" else self.scale_features
        self.precond = None if kind == "none" else preconditioner(self.H, self.n, kind)
        self.whitened = None                       # found by the first map (_whitened)

    def local_steps(self, theta, K, lr, clients=slice(None), **extra):  # pragma: no cover
        """Run K local steps for clients ``clients`` (of the data given to :meth:`setup`)
        starting from ``theta``."""
        raise NotImplementedError

    def local_map(self, K, lr, mu: float = 0.0, correction: bool = True) -> LocalMap | None:
        """The K local steps of every client as one :class:`LocalMap` (proximal term
        ``mu (theta - theta_0)`` anchored at the starting model), or None when the steps are
        not affine in the starting model (SGD) or the solver is told to step (``affine=false``).
        ``K`` an int or per-client counts (S, M) or (M,)."""
        return None

    def gradient(self, theta, clients=slice(None)):
        """Full-batch gradient of the clients' losses at ``theta`` (with this reduction)."""
        g = lsq_gradient(theta, self.H[:, clients], self.b[:, clients])
        return g / self.n[:, clients, None] if self.reduction == "mean" else g

    def gradient_map(self):
        """``(A, c)`` with gradient ``A theta - c`` for every client (this reduction)."""
        if self.reduction == "mean":
            inv_n = 1.0 / self.n
            return self.H * inv_n[..., None, None], self.b * inv_n[..., None]
        return self.H, self.b

    def step_total(self, lr, K):
        """Sum of the K step sizes of a round (``K lr`` for a constant schedule): a float, or
        (S, M) for per-client step counts ``K`` (S, M)."""
        total = step_sizes(lr, K, self.schedule).sum(axis=-1)
        return float(total) if np.ndim(K) == 0 else total

    def _precond(self, clients):
        return None if self.precond is None else self.precond[:, clients]


#: clients whose local maps are computed together
MAP_CHUNK = 1 << 16


class GD(LocalSolver):
    """Full-batch gradient descent on the client's sufficient statistics.

    Parameters
    ----------
    affine : bool, default=True
        Strategies run the K local steps as one precomputed affine map (:meth:`local_map`);
        false: step by step (:meth:`local_steps`, the reference).
    **kwargs
        :class:`LocalSolver`'s parameters.
    """

    settings = "GD"

    def __init__(self, affine: bool = True, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(affine, (bool, np.bool_)):
            raise ValueError(f"optimizer.affine={affine}; allowed: true, false")
        self.affine = bool(affine)

    def local_map(self, K, lr, mu=0.0, correction=True):
        """The clients' maps (:func:`affine_gd`), a slice of clients at a time on the data
        threads (the values do not depend on the slicing)."""
        if not self.affine:
            return None
        whitened = self._whitened()
        parts: dict[int, LocalMap] = {}

        def work(sl: slice) -> None:
            parts[sl.start] = affine_gd(
                self.H[:, sl], self.b[:, sl], self.n[:, sl], lr,
                np.asarray(K)[:, sl] if np.ndim(K) else K, schedule=self.schedule,
                reduction=self.reduction, precond=self._precond(sl), mu=mu,
                correction=correction,
                whitened=None if whitened is None else (whitened[0][:, sl], whitened[1][:, sl]))

        for_slices(self.n.shape[1], MAP_CHUNK, work)
        if len(parts) == 1:
            return parts[0]
        maps = [parts[k] for k in sorted(parts)]
        return LocalMap(*(None if a[0] is None else np.concatenate(a, axis=1)
                          for a in zip(*((m.P, m.q, m.C) for m in maps), strict=True)))

    def _whitened(self):
        """For whitening (``n H^+``), each client's regressors that are not identically 0 (a
        pruned term, a feature the client never excites) and whether its Gram matrix has full
        rank on them: :func:`affine_gd` then takes ``D H`` exactly. Found once, by the first
        map (the step-by-step path does not need it); None for other preconditioners."""
        if self.whitened is None and self.scale_features == "whiten":
            from fnsysid.learning.ownfit import ranks

            live = np.diagonal(self.H, axis1=-2, axis2=-1) > 0               # (S, M, p)
            full = ranks(self.H) == live.sum(axis=-1)
            self.whitened = np.where(full[..., None], live, False), full
        return self.whitened

    def local_steps(self, theta, K, lr, clients=slice(None), **extra):
        if np.ndim(K):                                   # per-client counts (S, M)
            K = np.asarray(K)[:, clients]
        return gd_steps(theta, self.H[:, clients], self.b[:, clients], self.n[:, clients],
                        step_sizes(lr, K, self.schedule), reduction=self.reduction,
                        precond=self._precond(clients), **extra)


class SGD(LocalSolver):
    """Mini-batch SGD: each local step uses the next ``batch_size`` samples of the client's
    current epoch; a client reshuffles its samples whenever it starts an epoch. The epoch
    position carries over between rounds. The last batch of an epoch may be smaller.

    Parameters
    ----------
    batch_size : int, default=10
        The samples of a local step, >= 1.
    **kwargs
        :class:`LocalSolver`'s parameters.
    """

    settings = "SGD"

    needs_samples = True
    #: (S, 1, p) 0/1 mask of the coefficients the steps may move (``sparsity``), or None
    support = None

    def __init__(self, batch_size: int = 10, **kwargs):
        super().__init__(**kwargs)
        if int(batch_size) < 1:
            raise ValueError(f"optimizer.batch_size={batch_size}; allowed: an integer >= 1")
        self.batch_size = int(batch_size)

    def setup(self, data, model, seed):
        super().setup(data, model, seed)
        S, M = data.shape
        self.structure = model.structure
        self.seed = seed
        self.n_i = data.mask.sum(axis=-1).astype(int)                # (S, M)
        self.n_batches = -(-self.n_i // self.batch_size)                # ceil
        self.pos = np.zeros((S, M), dtype=int)                         # next batch in epoch
        self.perm = np.zeros(data.mask.shape, dtype=int)
        self.mask = data.mask
        self.Phi, self.Y = data.Phi, data.Y
        if self.scale_features == "zscore":        # the features only, as GD (setup)
            self.Phi = (data.Phi - data.phi_mean[:, :, None, :]) * data.mask[..., None]
        self.t = 0                                                     # global step counter

    def _reshuffle(self, clients):
        """New permutations for the selected clients that start an epoch now.

        Step ``t`` of block ``b`` in repeat ``s`` draws its keys from its own stream, so skipping
        the blocks where no client starts an epoch changes no other draw. Padded samples sort
        last and are never drawn.
        """
        S, M, n_max = self.mask.shape
        selected = np.zeros(M, dtype=bool)
        selected[clients] = True
        fresh = (self.pos == 0) & selected
        if not fresh.any():
            return
        for s in range(S):
            for blk, lo, hi in rnd.blocks(M):
                if not fresh[s, lo:hi].any():
                    continue
                g = rnd.stream(self.seed, rnd.SHUFFLE, s, blk, self.t)
                keys = np.where(self.mask[s, lo:hi] > 0,
                                g.random((rnd.block_size(blk), n_max))[: hi - lo], 2.0)
                new = np.argsort(keys, axis=-1)
                self.perm[s, lo:hi] = np.where(fresh[s, lo:hi, None], new, self.perm[s, lo:hi])

    def local_steps(self, theta, K, lr, clients=slice(None), **extra):
        B = self.batch_size
        scale_mean = self.reduction == "mean"
        for lr_k in step_sizes(lr, K, self.schedule):
            self._reshuffle(clients)
            pos = self.pos[:, clients]
            idx = pos[..., None] * B + np.arange(B)                      # (S, m, B)
            valid = (idx < self.n_i[:, clients, None]).astype(float)
            idx = np.minimum(idx, self.perm.shape[-1] - 1)
            sample = np.take_along_axis(self.perm[:, clients], idx, axis=-1)
            Phi = np.take_along_axis(self.Phi[:, clients], sample[..., None], axis=-2)
            Y = np.take_along_axis(self.Y[:, clients], sample[..., None], axis=-2)
            g = self._batch_gradient(theta, Phi, Y, valid)
            if scale_mean:
                g = g / valid.sum(axis=-1, keepdims=True)
            step = _finish(g, theta, self._precond(clients), extra.get("mu", 0.0),
                           extra.get("anchor"), extra.get("correction"))
            if self.support is not None:                # sparsity: pruned terms stay put
                step = step * self.support
            theta = theta - lr_k * step
            self.pos[:, clients] = (pos + 1) % self.n_batches[:, clients]
            self.t += 1
        return theta

    def _batch_gradient(self, theta, Phi, Y, weight):
        """Summed gradient of the batch: ``-S^T vec((Y - Phi Theta^T)^T Phi)``."""
        Theta = np.einsum("jkp,...p->...jk", self.structure, theta)
        resid = Y - np.einsum("...nk,...jk->...nj", Phi, Theta)
        cross = np.einsum("...nj,...nk,...n->...jk", resid, Phi, weight)
        return -np.einsum("jkp,...jk->...p", self.structure, cross)

