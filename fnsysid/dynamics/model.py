"""The regression problem of one (system, feature map) pair, and client data built from it.

The estimated parameter is a vector ``theta`` (p,). A sample contributes
``y_t = Theta(theta) phi_t + noise`` with ``Theta[j, k] = sum_p S[j, k, p] theta[p]``, so the
least-squares loss of a client is ``f(theta) = 1/2 theta^T H theta - b^T theta + c`` with the
sufficient statistics ``H = sum_t G_t^T G_t`` and ``b = sum_t G_t^T y_t`` (``G_t`` the
n_y x p Jacobian). Gradient steps on least squares therefore never touch the raw samples.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from fnsysid.dynamics import random as rnd
from fnsysid.dynamics.features import Library
from fnsysid.dynamics.systems import System, dense_structure


class FeatureMapError(ValueError):
    """A feature map that cannot represent the chosen system."""


@dataclass
class Model:
    """Linear-in-parameters model of a system.

    Attributes
    ----------
    system : the client family.
    library : a generic feature library, or None for the system's own features.
    param_names : names of the p estimated parameters.
    structure : (n_y, n_phi, p) map from theta to the matrix Theta.
    embed : (p0, p) map from the system's own parameters to the estimated ones.
    """

    system: System
    library: Library | None
    param_names: list[str]
    structure: np.ndarray
    embed: np.ndarray

    @property
    def p(self) -> int:
        return len(self.param_names)

    def regression(self, x, u):
        """Features ``Phi`` (..., T, n_phi) and targets ``Y`` (..., T, n_y) of trajectories."""
        if self.library is None:
            return self.system.regression(x, u)
        return self.library.transform(x[..., :-1, :], u), x[..., 1:, :]

    def features(self, x, u):
        """Features ``phi`` (..., n_phi) of states (..., n_x) and inputs (..., n_u)."""
        if self.library is None:
            return self.system.features(x, u)
        return self.library.transform(x, u)

    def predict(self, x, u, theta):
        """One-step prediction of the next state (..., n_x) with parameters ``theta`` (..., p)."""
        y = np.einsum("...jk,...k->...j", self.theta_matrix(theta), self.features(x, u))
        return self.system.predict(x, u, y)

    def theta_matrix(self, theta: np.ndarray) -> np.ndarray:
        """``Theta`` (..., n_y, n_phi) of parameter vectors ``theta`` (..., p)."""
        return np.einsum("jkp,...p->...jk", self.structure, theta)

    def stats(self, Phi, Y, weight):
        """Sufficient statistics of samples.

        Parameters
        ----------
        Phi : numpy.ndarray, shape (..., n, n_phi)
            The features of each sample.
        Y : numpy.ndarray, shape (..., n, n_y)
            The targets.
        weight : numpy.ndarray, shape (..., n)
            The 0/1 sample mask.

        Returns
        -------
        H : numpy.ndarray, shape (..., p, p)
        b : numpy.ndarray, shape (..., p)
        yy : numpy.ndarray, shape (...)
            ``sum ||y||^2``.
        n : numpy.ndarray, shape (...)
            The number of samples.
        """
        return sample_stats(self, Phi, Y, weight)[:4]


def build_model(system: System, library: Library | None = None) -> Model:
    """Model of ``system`` with its own features, or with a generic ``library``.

    Parameters
    ----------
    system : fnsysid.dynamics.systems.System
        The dynamics.
    library : fnsysid.dynamics.features.Library or None, default=None
        A generic feature library; None: the system's own features.

    Returns
    -------
    Model

    Raises
    ------
    FeatureMapError
        If the system admits no generic features, or the library lacks one of the system's
        own features (then the true parameters are not representable).
    """
    p0 = len(system.param_names)
    if library is None:
        return Model(system, None, list(system.param_names), system.structure, np.eye(p0))
    if not system.generic_features:
        raise FeatureMapError(
            f"system={system.name} identifies physical parameters with its own features")
    names = system.name_features(library.feature_names(system.n_x, system.n_u))
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise FeatureMapError(f"feature_map repeats features {', '.join(dup)}; "
                              "each feature may appear once")
    # a system without a nominal model (generic) has no truth that must be representable
    own = system.feature_names if system.simulates else []
    missing = [f for f in own if f not in names]
    if missing:
        raise FeatureMapError(
            f"its features lack {', '.join(missing)}")
    n_y, n_phi = len(system.target_names), len(names)
    param_names = [f"{t}:{f}" for t in system.target_names for f in names]
    own_S = system.structure
    embed = np.zeros((p0, n_y * n_phi))
    for j in range(n_y):
        for k_own, f in enumerate(own):
            k = names.index(f)
            embed[:, j * n_phi + k] = own_S[j, k_own, :]
    return Model(system, library, param_names, dense_structure(n_y, n_phi), embed)


@dataclass
class ClientData:
    """Everything the clients of ``S`` repeats hold, stacked as (S, M, ...).

    ``theta_true`` are the clients' true parameters in the model's basis; ``H, b, yy, n`` their
    sufficient statistics; ``Phi, Y, mask`` the samples (kept only when an optimizer needs them);
    ``phi2max`` the largest squared feature norm ``max_t ||phi_t||^2`` of each client;
    ``phi_mean`` (S, M, n_phi) and ``y_mean`` (S, M, n_y) the sample means of features and
    targets (for centred feature scaling); ``yy_target`` (S, M, n_y) the sums of squares of
    each target (``yy`` is their sum; the residual variance of each target needs them);
    ``factor`` (S, M, terms) the QR factors of each client's training data, one per group of
    targets with the same features (:func:`training_factor`), from which
    :func:`residual_sums` gives sums of squared residuals without the cancellation of the
    expanded ``yy - 2 theta'b + theta'H theta`` (None: not built, e.g. pooled data).
    """

    theta_true: np.ndarray
    H: np.ndarray
    b: np.ndarray
    yy: np.ndarray
    n: np.ndarray
    Phi: np.ndarray | None = None
    Y: np.ndarray | None = None
    mask: np.ndarray | None = None
    phi2max: np.ndarray | None = None
    phi_mean: np.ndarray | None = None
    y_mean: np.ndarray | None = None
    yy_target: np.ndarray | None = None
    factor: np.ndarray | None = None
    #: (S, M, n_phi) the largest magnitude of each feature over the client's samples (the
    #: model check's range of the training data)
    phimax: np.ndarray | None = None

    def take(self, clients) -> ClientData:
        """The same data of the ``clients`` only (an index array, mask or slice along M)."""
        return ClientData(*(None if a is None else a[:, clients] for a in vars(self).values()))

    @property
    def shape(self) -> tuple[int, int]:
        return self.theta_true.shape[:2]


def pooled(data: ClientData) -> ClientData:
    """All clients' data pooled into one client per repeat.

    Parameters
    ----------
    data : ClientData
        The clients' data, (S, M, ...).

    Returns
    -------
    ClientData
        One client per repeat, (S, 1, ...): statistics summed, samples concatenated, means
        weighted by the clients' samples, true parameters averaged; no QR factor (a
        pooled client's residuals are the sum of its clients', :func:`residual_sums`).
    """
    def cat(a):
        return None if a is None else a.reshape(a.shape[0], 1, -1, *a.shape[3:])

    def mean(a):
        if a is None:
            return None
        w = data.n[..., None]
        return (a * w).sum(axis=1, keepdims=True) / w.sum(axis=1, keepdims=True)

    return ClientData(data.theta_true.mean(axis=1, keepdims=True),
                      data.H.sum(axis=1, keepdims=True), data.b.sum(axis=1, keepdims=True),
                      data.yy.sum(axis=1, keepdims=True), data.n.sum(axis=1, keepdims=True),
                      cat(data.Phi), cat(data.Y), cat(data.mask),
                      None if data.phi2max is None else data.phi2max.max(axis=1, keepdims=True),
                      mean(data.phi_mean), mean(data.y_mean),
                      None if data.yy_target is None else
                      data.yy_target.sum(axis=1, keepdims=True), None,
                      None if data.phimax is None else data.phimax.max(axis=1, keepdims=True))


def centred_stats(data: ClientData, structure: np.ndarray):
    """``H`` and ``b`` of the clients' samples after subtracting the features' means.

    ``b`` is the same whether or not the targets are centred too (centred features sum to zero
    against a constant). With centred features the least-squares problem is the slope part of a
    regression with an intercept: ``H_c = H - n Gbar' Gbar``, ``b_c = b - n Gbar' ybar`` with
    ``Gbar`` the mean regressor in parameter space.

    Parameters
    ----------
    data : ClientData
        The clients' data, with ``phi_mean`` and ``y_mean``.
    structure : numpy.ndarray, shape (n_y, n_phi, p)
        The model's structure (:attr:`Model.structure`).

    Returns
    -------
    H : numpy.ndarray, shape (S, M, p, p)
    b : numpy.ndarray, shape (S, M, p)
    """
    Gbar = np.einsum("jkp,...k->...jp", structure, data.phi_mean)
    n = np.asarray(data.n, float)
    H = data.H - n[..., None, None] * np.einsum("...jp,...jq->...pq", Gbar, Gbar)
    b = data.b - n[..., None] * np.einsum("...jp,...j->...p", Gbar, data.y_mean)
    return H, b


def masked_gram(H: np.ndarray, mask) -> np.ndarray:
    """Gram matrices restricted to some coefficients: their rows and columns outside them set
    to 0.

    Parameters
    ----------
    H : numpy.ndarray, shape (..., p, p)
        The Gram matrices.
    mask : array_like of bool or 0/1, broadcast against (..., p)
        The coefficients kept.

    Returns
    -------
    numpy.ndarray, shape (..., p, p)
    """
    m = np.asarray(mask, float)
    return H * m[..., :, None] * m[..., None, :]


def equilibration(diagonal, fill: float = 1.0) -> np.ndarray:
    """The factors ``1 / sqrt(d)`` that scale regressors whose Gram diagonal is ``d`` to unit
    norm, ``fill`` where ``d`` is not positive and finite (a regressor identically 0).

    >>> equilibration(np.array([4.0, 0.0, 1e-6]))
    array([5.e-01, 1.e+00, 1.e+03])
    """
    d = np.asarray(diagonal, float)
    good = (d > 0) & np.isfinite(d)
    return np.where(good, 1.0 / np.sqrt(np.where(good, d, 1.0)), fill)


def equilibrated_pinv(H: np.ndarray) -> np.ndarray:
    """Pseudo-inverses of Gram matrices computed on their equilibrated form,
    ``D (D H D)^+ D`` with ``D = diag(H)^(-1/2)`` (0 where a regressor is identically 0),
    batched.

    Equal to ``H^+`` where ``H`` is invertible, but the cut of small singular values applies to
    the regressors scaled to unit size, so the result does not depend on the data's units: a
    position in millimetres beside a force in newtons gives a Gram matrix whose raw condition
    number reaches 1e16 while the scaled one is small, and ``numpy.linalg.pinv`` of the raw
    matrix drops directions the data determine. Where ``H`` is singular the solution is the
    minimum norm one in the scaled coordinates.

    Parameters
    ----------
    H : numpy.ndarray, shape (..., p, p)
        Gram matrices (symmetric, positive semi-definite).

    Returns
    -------
    numpy.ndarray, shape (..., p, p)

    Examples
    --------
    Two regressors with correlation 0.5, the second in units 1e9 times smaller:

    >>> H = np.array([[1.0, 0.5e9], [0.5e9, 1e18]]); theta = np.array([2.0, 3e-9])
    >>> equilibrated_pinv(H) @ (H @ theta)
    array([2.e+00, 3.e-09])
    >>> np.linalg.pinv(H, hermitian=True) @ (H @ theta)        # the first coefficient lost
    array([2.e-18, 4.e-09])
    """
    s = equilibration(np.diagonal(H, axis1=-2, axis2=-1), fill=0.0)
    scaled = H * s[..., :, None] * s[..., None, :]
    return np.linalg.pinv(scaled, hermitian=True) * s[..., :, None] * s[..., None, :]


def least_squares(H: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact least-squares solutions ``H^+ b``, batched, from the equilibrated Gram matrices
    (:func:`equilibrated_pinv`: independent of the data's units); minimum norm in the scaled
    coordinates if singular.

    Parameters
    ----------
    H : numpy.ndarray, shape (..., p, p)
        Gram matrices (symmetric).
    b : numpy.ndarray, shape (..., p)
        Moments ``X'y``.

    Returns
    -------
    numpy.ndarray, shape (..., p)
    """
    return np.einsum("...pq,...q->...p", equilibrated_pinv(H), b)


def generate(model: Model, M: int, N, T: int, eps: float, repeats: int, seed: int,
             keep_samples: bool = False, shared_noise: bool = False,
             clients=None) -> ClientData:
    """Draw client systems and trajectories and reduce them to per-client statistics.

    Parameters
    ----------
    model : Model
        The regression model (system and features).
    M : int
        The number of clients.
    N : int or sequence of M ints
        Trajectories per client.
    T : int
        Trajectory length (samples per trajectory).
    eps : float
        Heterogeneity: ``gamma ~ U(0, eps)`` per client and direction.
    repeats : int
        Independent repetitions (new systems and data each).
    seed : int
        The root seed; see :mod:`fnsysid.dynamics.random` for how streams are derived.
    keep_samples : bool, default=False
        Also return the per-sample arrays (needed by mini-batch SGD).
    shared_noise : bool, default=False
        Every client draws the same trajectory noise (the published pendulum code's
        behaviour); client parameters still differ.
    clients : sequence of int or None, default=None
        Indices of the clients to build (None: all M, in order); a client's system and data
        are the same whichever others are built with it (what a federated node that holds
        one client draws). Costs at most the clients of a block before it.

    Returns
    -------
    ClientData
        The clients' statistics, (S, M, ...): ``S = repeats``, M the clients built.
    """
    N = np.broadcast_to(np.asarray(N, dtype=int), (M,))
    blocks, keep = rnd.blocks(M), None
    if clients is not None:
        blocks, built, keep = _prefix_blocks(np.asarray(clients, dtype=int).reshape(-1))
        N, M = N[built], len(built)
    n_max = int(N.max())
    S, p = repeats, model.p
    theta_true = np.empty((S, M, p))
    H, b = np.empty((S, M, p, p)), np.empty((S, M, p))
    yy, n, phi2max = np.empty((S, M)), np.empty((S, M)), np.empty((S, M))
    n_y, n_phi = model.structure.shape[:2]
    phi_mean, y_mean = np.empty((S, M, n_phi)), np.empty((S, M, n_y))
    yy_target = np.empty((S, M, n_y))
    factor = np.empty((S, M, factor_terms(model)))
    phimax = np.empty((S, M, n_phi))
    traj_mask = (np.arange(n_max)[None, :] < N[:, None]).astype(float)  # (M, n_max)
    if keep_samples:
        Phi = np.zeros((S, M, n_max * T, n_phi))
        Y = np.zeros((S, M, n_max * T, n_y))
        mask = np.repeat(traj_mask, T, axis=1)[None].repeat(S, axis=0)
    limit = chunk_clients(model, n_max, T) if keep is None else 1

    def work(s: int, chunk: list[tuple[int, int, int]]) -> None:
        lo, hi = chunk[0][1], chunk[-1][2]
        size = hi - lo
        own, x, u = simulate_blocks(model, s, chunk, n_max, T, eps, seed, shared_noise)
        theta_true[s, lo:hi] = own @ model.embed
        Phi_b, Y_b = model.regression(x, u)          # (size, n_max, T, .)
        Phi_b = Phi_b.reshape(size, n_max * T, -1)
        Y_b = Y_b.reshape(size, n_max * T, -1)
        wgt = np.repeat(traj_mask[lo:hi], T, axis=1)
        (H[s, lo:hi], b[s, lo:hi], yy[s, lo:hi], n[s, lo:hi], phi2max[s, lo:hi],
         phi_mean[s, lo:hi], y_mean[s, lo:hi], yy_target[s, lo:hi],
         factor[s, lo:hi], phimax[s, lo:hi]) = sample_stats(model, Phi_b, Y_b, wgt)
        if keep_samples:
            Phi[s, lo:hi], Y[s, lo:hi] = Phi_b * wgt[..., None], Y_b * wgt[..., None]

    for_chunks(S, blocks, limit, work)
    if not keep_samples:
        Phi = Y = mask = None
    data = ClientData(theta_true, H, b, yy, n, Phi, Y, mask, phi2max, phi_mean, y_mean,
                      yy_target, factor, phimax)
    if keep is None:
        return data
    return data.take(keep)


def _prefix_blocks(ids: np.ndarray):
    """Blocks to simulate for clients ``ids``: in each block touched, its clients up to the
    last one wanted. Returns the blocks ``(blk, lo, hi)`` with positions in the built arrays,
    the client index at each position, and the positions of ``ids``."""
    blocks, built, start = [], [], {}
    of = rnd.block_of(ids)
    for blk in np.unique(of):
        first = rnd.block_start(int(blk))
        size = int(ids[of == blk].max()) - first + 1
        start[blk] = len(built) - first
        blocks.append((int(blk), len(built), len(built) + size))
        built.extend(range(first, first + size))
    keep = np.array([start[b] + i for i, b in zip(ids, of, strict=True)])
    return blocks, np.array(built), keep


def simulate_clients(model: Model, clients, n_traj: int, T: int, eps: float, repeats: int,
                     seed: int, shared_noise: bool = False, purpose: int = rnd.TRAJECTORY):
    """Trajectories of some clients only: those the same clients get when all are simulated
    (what a federated node that holds one client draws, e.g. its held-out trajectories with
    ``purpose=rnd.HOLDOUT``).

    Parameters
    ----------
    model : Model
        The model (its system simulates).
    clients : array_like of int, shape (m,)
        The clients simulated.
    n_traj : int
        Trajectories per client.
    T : int
        Trajectory length.
    eps : float
        Heterogeneity (:func:`generate`).
    repeats : int
        The repeats S.
    seed : int
        The root seed.
    shared_noise : bool, default=False
        Every client draws the same trajectory noise.
    purpose : int, default=rnd.TRAJECTORY
        The streams' purpose (:mod:`fnsysid.dynamics.random`).

    Returns
    -------
    x : numpy.ndarray, shape (S, m, n_traj, T + 1, n_x)
        The states.
    u : numpy.ndarray, shape (S, m, n_traj, T, n_u)
        The inputs.
    """
    blocks, _, keep = _prefix_blocks(np.asarray(clients, dtype=int).reshape(-1))
    xs, us = [], []
    for s in range(repeats):
        _, x, u = simulate_blocks(model, s, blocks, n_traj, T, eps, seed, shared_noise, purpose)
        xs.append(x[keep])
        us.append(u[keep])
    return np.stack(xs), np.stack(us)


def simulate_blocks(model: Model, s: int, blocks: list[tuple[int, int, int]], n_traj: int,
                    T: int, eps: float, seed: int, shared_noise: bool = False,
                    purpose: int = rnd.TRAJECTORY):
    """Client parameters and trajectories of consecutive blocks of clients.

    Trajectory ``j`` of repeat ``s`` is drawn from stream ``(purpose, s, blk, j)`` for the
    whole block; held-out trajectories use their own ``purpose``.

    Parameters
    ----------
    model : Model
        The model (its system simulates).
    s : int
        The repeat.
    blocks : list of tuple of (int, int, int)
        Consecutive blocks ``(blk, lo, hi)``; the m clients ``blocks[0].lo ..
        blocks[-1].hi``.
    n_traj : int
        Trajectories per client.
    T : int
        Trajectory length.
    eps : float
        Heterogeneity (:func:`generate`).
    seed : int
        The root seed.
    shared_noise : bool, default=False
        Every client draws the same trajectory noise.
    purpose : int, default=rnd.TRAJECTORY
        The streams' purpose.

    Returns
    -------
    own : numpy.ndarray, shape (m, p0)
        The clients' own parameters.
    x : numpy.ndarray, shape (m, n_traj, T + 1, n_x)
        The states.
    u : numpy.ndarray, shape (m, n_traj, T, n_u)
        The inputs.
    """
    system = model.system
    own = np.concatenate([system.client_params(eps * rnd.stream(
        seed, rnd.PARAMS, s, blk).random((rnd.block_size(blk), system.n_gamma))[: hi - lo])
        for blk, lo, hi in blocks])
    x0, eta, w = draw_trajectories(system, seed, s, [blk for blk, _, _ in blocks], n_traj, T,
                                   shared_noise, len(own), purpose)
    x, u = system.simulate(own, x0, eta, w)
    return own, x, u


def moments(Phi, Y, wgt):
    """Weighted second moments of padded samples.

    Parameters
    ----------
    Phi : numpy.ndarray, shape (..., n, n_phi)
        The features.
    Y : numpy.ndarray, shape (..., n, n_y)
        The targets.
    wgt : numpy.ndarray, shape (..., n)
        The 0/1 weights.

    Returns
    -------
    F : numpy.ndarray, shape (n_phi, ..., n)
        The features with their coordinate moved first (sums then run along a contiguous
        axis).
    Z : numpy.ndarray, shape (n_y, ..., n)
        The targets likewise.
    Fw, Zw : numpy.ndarray
        The same times the weights (``F`` and ``Z`` themselves when every weight is 1).
    gram : numpy.ndarray, shape (..., n_phi, n_phi)
        ``sum_t w_t phi_t phi_t'``.
    cross : numpy.ndarray, shape (..., n_y, n_phi)
        ``sum_t w_t y_t phi_t'``.
    """
    F = np.ascontiguousarray(np.moveaxis(Phi, -1, 0))          # (n_phi, ..., n)
    Z = np.ascontiguousarray(np.moveaxis(Y, -1, 0))            # (n_y, ..., n)
    Fw, Zw = (F, Z) if bool(wgt.all()) else (F * wgt, Z * wgt)
    gram = np.einsum("k...n,l...n->...kl", Fw, F)
    cross = np.einsum("y...n,k...n->...yk", Zw, F)
    return F, Z, Fw, Zw, gram, cross


def sample_stats(model: Model, Phi, Y, wgt):
    """Per-client statistics of padded samples: ``H, b, yy, n`` (see :meth:`Model.stats`),
    ``phi2max``, ``phi_mean``, ``y_mean``, ``yy_target`` and ``factor`` (the fields of
    :class:`ClientData`).

    Sums over samples run along a contiguous axis (features moved first).

    Parameters
    ----------
    model : Model
        The model (its ``structure``).
    Phi : numpy.ndarray, shape (..., n, n_phi)
        The features.
    Y : numpy.ndarray, shape (..., n, n_y)
        The targets.
    wgt : numpy.ndarray, shape (..., n)
        The 0/1 weights.

    Returns
    -------
    H : numpy.ndarray, shape (..., p, p)
    b : numpy.ndarray, shape (..., p)
    yy : numpy.ndarray, shape (...)
    n : numpy.ndarray, shape (...)
    phi2max : numpy.ndarray, shape (...)
    phi_mean : numpy.ndarray, shape (..., n_phi)
    y_mean : numpy.ndarray, shape (..., n_y)
    yy_target : numpy.ndarray, shape (..., n_y)
    factor : numpy.ndarray, shape (..., terms)
        :func:`training_factor`.
    phimax : numpy.ndarray, shape (..., n_phi)
        The largest magnitude of each feature over the samples.
    """
    F, Z, Fw, Zw, gram, cross = moments(Phi, Y, wgt)
    full = Fw is F
    S = model.structure
    H = np.einsum("jkp,...kl,jlq->...pq", S, gram, S, optimize=True)
    b = np.einsum("jkp,...jk->...p", S, cross, optimize=True)
    yy_target = np.moveaxis(np.einsum("y...n,y...n->y...", Zw, Z), 0, -1)
    yy = yy_target.sum(axis=-1)
    n = wgt.sum(axis=-1)
    phi2 = np.einsum("k...n,k...n->...n", F, F)
    phi2max = (phi2 if full else phi2 * wgt).max(axis=-1)
    phi_mean = np.moveaxis(Fw.sum(axis=-1), 0, -1) / n[..., None]
    y_mean = np.moveaxis(Zw.sum(axis=-1), 0, -1) / n[..., None]
    factor = training_factor(model, Phi, Y, wgt)
    phimax = np.moveaxis(np.abs(Fw).max(axis=-1), 0, -1)
    return H, b, yy, n, phi2max, phi_mean, y_mean, yy_target, factor, phimax


def target_features(model: Model) -> list[np.ndarray]:
    """The features ``F_j`` (indices into ``phi``) each regression target's model can use: those
    that some parameter maps onto for that target (``model.structure``). ``Theta[j]`` is zero
    elsewhere, so target ``j``'s prediction is ``Theta[j, F_j] . phi[F_j]``."""
    return [np.flatnonzero(row) for row in np.asarray(model.structure).any(axis=-1)]


def constant_feature(model: Model) -> tuple[list[str], int] | None:
    """The names of a generic library's features and the index of its constant feature
    ``1``; None for a system's own features or a library without ``1``."""
    if model.library is None:
        return None
    system = model.system
    names = system.name_features(model.library.feature_names(system.n_x, system.n_u))
    return (names, names.index("1")) if "1" in names else None


def target_groups(model: Model) -> list[tuple[np.ndarray, np.ndarray]]:
    """The targets grouped by the features they use: ``(F, J)`` pairs, the features ``F`` and
    the targets ``J`` that use exactly them (:func:`target_features`), by first target. One
    QR factor serves a group: one for every target of a linear model, one per target of the
    quadrotor's."""
    groups: dict[tuple, list[int]] = {}
    for j, F in enumerate(target_features(model)):
        groups.setdefault(tuple(int(k) for k in F), []).append(j)
    return [(np.array(F, dtype=int), np.array(J)) for F, J in groups.items()]


def factor_starts(model: Model) -> list[int]:
    """Where each group's rows start in :attr:`HeldOut.factor`, and (last) their total: a
    group of ``f`` features and ``q`` targets has ``k (k + 1) / 2`` of them, ``k = f + q``."""
    out = [0]
    for F, J in target_groups(model):
        k = len(F) + len(J)
        out.append(out[-1] + k * (k + 1) // 2)
    return out


def factor_terms(model: Model) -> int:
    """Values of a client's :func:`training_factor`: ``k (k + 1) / 2`` per group of targets
    with the same features (``k`` = features + targets of the group)."""
    return factor_starts(model)[-1]


def training_factor(model: Model, Phi, Y, wgt) -> np.ndarray:
    """The QR factors of samples, one per group of targets with the same features.

    For each group ``(F, J)`` of :func:`target_groups` in turn, the upper
    triangle, row after row, of the ``(k, k)`` factor ``R`` (``k = len(F) + len(J)``,
    diagonal made nonnegative, zero rows below when there are fewer than ``k`` samples) of
    the QR decomposition of the weighted ``[Phi[:, F] | Y[:, J]]``: the layout of
    :attr:`fnsysid.data.heldout.HeldOut.factor`, with the terms last. Then
    ``||y_j - Phi[:, F] t||^2 = ||R[:, f + l] - R[:, :f] t||^2`` for the group's target
    ``j = J[l]`` and every ``t`` (:func:`residual_sums`).

    Parameters
    ----------
    model : Model
        The model (its ``structure``).
    Phi : numpy.ndarray, shape (..., n, n_phi)
    Y : numpy.ndarray, shape (..., n, n_y)
    wgt : numpy.ndarray, shape (..., n)
        The 0/1 weights.

    Returns
    -------
    numpy.ndarray, shape (..., terms)
    """
    starts = factor_starts(model)
    w = np.asarray(wgt, float)[..., None]
    out = np.zeros(np.shape(Phi)[:-2] + (starts[-1],))
    for g, (F, J) in enumerate(target_groups(model)):
        A = np.concatenate([Phi[..., F], Y[..., J]], axis=-1) * w
        r = np.linalg.qr(A, mode="r")                           # (..., min(n, k), k)
        d = np.diagonal(r, axis1=-2, axis2=-1)
        r = r * np.where(d < 0, -1.0, 1.0)[..., None]           # unique: diagonal >= 0
        i, c = np.triu_indices(A.shape[-1])
        keep = i < r.shape[-2]                                  # rows below: zero
        out[..., starts[g] + np.flatnonzero(keep)] = r[..., i[keep], c[keep]]
    return out


def group_factor(model: Model, factor: np.ndarray, g: int) -> np.ndarray:
    """Group ``g``'s factors ``R`` (..., k, k) unpacked from ``factor`` (..., terms), the
    layout of :func:`training_factor` (groups of :func:`target_groups`)."""
    F, J = target_groups(model)[g]
    k = len(F) + len(J)
    a = factor_starts(model)[g]
    i, c = np.triu_indices(k)
    R = np.zeros(factor.shape[:-1] + (k, k))
    R[..., i, c] = factor[..., a:a + len(i)]
    return R


#: clients whose residual sums are made at once by :func:`residual_sums`
RESIDUAL_CLIENTS = 1 << 12


def residual_sums(model: Model, factor: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Each target's sum of squared residuals ``||y_j - Phi Theta[j]'||^2`` of each client.

    From the clients' QR factors (:func:`training_factor`): ``||R[:, f + l] - R[:, :f] t||^2``
    with ``t = Theta[j, F]``, a sum of squares of residuals that are themselves small, so it
    is exact to the rounding of the residuals (relative ~1e-16 times the ratio of the
    targets' size to the residuals'), not to ~1e-16 of ``yy`` as the expanded
    ``yy - 2 theta'b + theta'H theta`` is. A chunk of clients at a time.

    Parameters
    ----------
    model : Model
        The model (its ``structure``).
    factor : numpy.ndarray, shape (S, M, terms)
        The clients' factors (:attr:`ClientData.factor`).
    theta : numpy.ndarray, shape (S, M or 1, p)
        The parameters of each client, or one per repeat for all.

    Returns
    -------
    numpy.ndarray, shape (S, M, n_y)
    """
    S, M = factor.shape[:2]
    Th = model.theta_matrix(np.asarray(theta, float))          # (S, M or 1, n_y, n_phi)
    out = np.empty((S, M, model.structure.shape[0]))
    for lo in range(0, M, RESIDUAL_CLIENTS):
        hi = min(M, lo + RESIDUAL_CLIENTS)
        T = Th if Th.shape[1] == 1 else Th[:, lo:hi]
        for g, (F, J) in enumerate(target_groups(model)):
            f, R = len(F), group_factor(model, factor[:, lo:hi], g)
            t = T[:, :, J][..., F]                              # (S, m, q, f)
            res = R[..., f:] - R[..., :f] @ np.swapaxes(t, -1, -2)    # (S, m, k, q)
            out[:, lo:hi, J] = np.einsum("smiq,smiq->smq", res, res)
    return out


def length_classes(count: np.ndarray) -> np.ndarray:
    """Length class of segments of ``count`` samples: ``ceil(log2(count))`` (0 for one
    sample). Segments of one class differ in length by less than a factor 2, so padding them
    to their longest at most doubles their samples.

    Parameters
    ----------
    count : numpy.ndarray of int
        The segments' samples.

    Returns
    -------
    numpy.ndarray of int
        Of the shape of ``count``.
    """
    count = np.asarray(count, dtype=np.int64)
    return np.where(count > 1, np.ceil(np.log2(np.maximum(count, 1))), 0).astype(int)


def ragged_chunks(count: np.ndarray, values_per_sample: int,
                  limit: int | None = None) -> list[np.ndarray]:
    """Segments of ``count`` samples grouped for padded work: the segments of one length class
    (:func:`length_classes`), in slices holding about ``limit`` values at most (at least one
    segment each). Every segment is in exactly one chunk, in increasing order within it.

    Parameters
    ----------
    count : numpy.ndarray of int, shape (k,)
        The segments' samples.
    values_per_sample : int
        The values a sample holds in the padded work.
    limit : int or None, default=None
        The most values of a chunk; None: :data:`CHUNK_VALUES`.

    Returns
    -------
    list of numpy.ndarray of int
        The segments' indices, one array per chunk.
    """
    limit = CHUNK_VALUES if limit is None else limit
    classes = length_classes(count)
    out = []
    for k in np.unique(classes):
        ids = np.flatnonzero(classes == k)
        n_b = int(count[ids].max())
        step = max(1, limit // max(1, n_b * values_per_sample))
        out.extend(ids[lo:lo + step] for lo in range(0, len(ids), step))
    return out


def ragged_stats(model: Model, Phi: np.ndarray, Y: np.ndarray, count: np.ndarray):
    """Per-segment statistics of concatenated samples, without padding every segment to the
    longest: ``Phi`` (n, n_phi) and ``Y`` (n, n_y) hold segment 0's ``count[0]`` samples, then
    segment 1's, ...; every ``count`` > 0.

    Returns the arrays of :func:`sample_stats`, one row per segment (the same values as
    :func:`sample_stats` of the segments padded to the longest with weight 0, up to the
    order of the sums). The segments of one length class (:func:`ragged_chunks`) are padded
    to their own longest, so memory stays within twice the samples whatever the spread of
    lengths; the loop runs over a few classes (and slices of a large class), not over
    segments.

    Parameters
    ----------
    model : Model
        The model (its ``structure``).
    Phi : numpy.ndarray, shape (n, n_phi)
        The features of all segments, one after another.
    Y : numpy.ndarray, shape (n, n_y)
        The targets likewise.
    count : numpy.ndarray of int, shape (k,)
        Each segment's samples, > 0, summing to n.

    Returns
    -------
    H : numpy.ndarray, shape (k, p, p)
    b : numpy.ndarray, shape (k, p)
    yy : numpy.ndarray, shape (k)
    n : numpy.ndarray, shape (k)
    phi2max : numpy.ndarray, shape (k)
    phi_mean : numpy.ndarray, shape (k, n_phi)
    y_mean : numpy.ndarray, shape (k, n_y)
    yy_target : numpy.ndarray, shape (k, n_y)
    factor : numpy.ndarray, shape (k, terms)
    phimax : numpy.ndarray, shape (k, n_phi)
    """
    count = np.asarray(count, dtype=np.int64)
    n_seg = len(count)
    n_y, n_phi = model.structure.shape[:2]
    p = model.p
    starts = np.concatenate([[0], np.cumsum(count)[:-1]])
    H, b = np.empty((n_seg, p, p)), np.empty((n_seg, p))
    yy, n, phi2max = np.empty(n_seg), np.empty(n_seg), np.empty(n_seg)
    phi_mean, y_mean = np.empty((n_seg, n_phi)), np.empty((n_seg, n_y))
    yy_target = np.empty((n_seg, n_y))
    factor = np.empty((n_seg, factor_terms(model)))
    phimax = np.empty((n_seg, n_phi))
    for ids in ragged_chunks(count, 3 * n_phi + 3 * n_y + 3):
        n_b = int(count[ids].max())
        pos = np.arange(n_b)
        w = pos[None, :] < count[ids, None]                      # (m, n_b)
        idx = np.where(w, starts[ids, None] + pos, 0)
        P, Yb = Phi[idx], Y[idx]
        if not w.all():
            P[~w], Yb[~w] = 0.0, 0.0
        (H[ids], b[ids], yy[ids], n[ids], phi2max[ids], phi_mean[ids],
         y_mean[ids], yy_target[ids], factor[ids], phimax[ids]) = sample_stats(
            model, P, Yb, w.astype(float))
    return H, b, yy, n, phi2max, phi_mean, y_mean, yy_target, factor, phimax


def threads(n_jobs: int) -> int:
    """Threads that simulate chunks of clients at once: ``FNSYSID_THREADS`` (default: the
    number of cores), at most one per chunk.

    Parameters
    ----------
    n_jobs : int
        The chunks.

    Returns
    -------
    int
    """
    raw = os.environ.get("FNSYSID_THREADS") or str(os.cpu_count() or 1)
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"FNSYSID_THREADS={raw}; allowed: an integer >= 1")
    return min(int(raw), max(1, n_jobs))


def for_chunks(S: int, blocks: list[tuple[int, int, int]], limit: int, work) -> None:
    """Call ``work(s, chunk)`` for every repeat ``s`` and every run of consecutive blocks
    holding at most ``limit`` clients (:func:`fnsysid.dynamics.random.chunks`), on :func:`threads`
    threads (numpy releases the GIL in the array work and the random draws). Chunks write
    disjoint slices and read their own streams, so the numbers do not depend on the number of
    threads.

    Parameters
    ----------
    S : int
        The repeats.
    blocks : list of tuple of (int, int, int)
        The clients' blocks (:func:`fnsysid.dynamics.random.blocks`).
    limit : int
        The most clients of a chunk.
    work : callable
        ``work(s, chunk)``, ``chunk`` a list of blocks.
    """
    runs = rnd.chunks(blocks, limit)
    _on_threads(work, [(s, run) for s in range(S) for run in runs])


def for_slices(m: int, size: int, work) -> None:
    """Call ``work(sl)`` for consecutive slices ``sl`` of ``size`` (the last shorter) covering
    ``range(m)``, on :func:`threads` threads when there are several. Each call must write only
    its own slice of the outputs (and use its own scratch arrays), so the values do not depend
    on the number of threads.

    Parameters
    ----------
    m : int
        The length covered.
    size : int
        The slices' length.
    work : callable
        ``work(sl)``, ``sl`` a slice.
    """
    _on_threads(work, [(slice(lo, min(lo + size, m)),) for lo in range(0, m, size)])


#: the name of every thread of :func:`_pool`'s pools begins with it
POOL_PREFIX = "fnsysid-pool"


@functools.lru_cache(maxsize=None)
def _pool(n: int) -> ThreadPoolExecutor:
    """A pool of ``n`` threads kept for the process (every call of :func:`_on_threads`)."""
    return ThreadPoolExecutor(n, thread_name_prefix=POOL_PREFIX)


def _on_threads(work, jobs: list[tuple]) -> None:
    """``work(*job)`` for every job, on :func:`threads` threads when there are several (with
    the caller's floating-point error handling), else in order in this thread."""
    map_on_threads(work, jobs)


def map_on_threads(work, jobs: list[tuple]) -> list:
    """``[work(*job) for job in jobs]``, the jobs run on :func:`threads` threads when there are
    several (with the caller's floating-point error handling), else in order in this thread;
    also in order in this thread when it is itself one of the pool's threads (a job that
    maps again would otherwise wait for threads that wait for it).

    Parameters
    ----------
    work : callable
        ``work(*job)``; jobs must not write to the same arrays.
    jobs : list of tuple
        The arguments of each call.

    Returns
    -------
    list
        Each call's result, in the order of ``jobs``.
    """
    n = threads(len(jobs))
    if n == 1 or threading.current_thread().name.startswith(POOL_PREFIX):
        return [work(*job) for job in jobs]
    errors = np.geterr()

    def call(job: tuple):
        with np.errstate(**errors):
            return work(*job)

    return [f.result() for f in [_pool(n).submit(call, job) for job in jobs]]


#: about how many float64 values one chunk of simulated clients may hold (memory bound)
CHUNK_VALUES = 1 << 22


def values_per_sample(model: Model) -> int:
    """Values a simulated chunk holds per client and sample: states, inputs and noise as
    drawn, features and targets with their weighted copies.

    Parameters
    ----------
    model : Model

    Returns
    -------
    int
    """
    system = model.system
    n_y, n_phi = model.structure.shape[:2]
    return 2 * system.n_x + system.n_u + system.n_w + 3 * n_phi + 2 * n_y


def chunk_clients(model: Model, n_max: int, T: int) -> int:
    """Clients simulated together: as many as keep a chunk near ``CHUNK_VALUES``.

    Parameters
    ----------
    model : Model
    n_max : int
        The most trajectories of a client.
    T : int
        Trajectory length.

    Returns
    -------
    int
        At least 1.
    """
    return max(1, CHUNK_VALUES // (n_max * (T + 1) * values_per_sample(model)))


def draw_trajectories(system: System, seed: int, s: int, blks: list[int], n_max: int, T: int,
                      shared_noise: bool, size: int, purpose: int = rnd.TRAJECTORY):
    """Randomness of trajectories ``0..n_max-1`` of the clients of blocks ``blks`` (repeat s).

    Stream (purpose, repeat, block, trajectory) draws for its whole block (stream (repeat, 0,
    trajectory) once for every client with ``shared_noise``). The streams of blocks of one size
    are read together through one :class:`~fnsysid.dynamics.random.StreamBatch` when the system's
    noises allow it, else one after another; the numbers are the same.

    Parameters
    ----------
    system : fnsysid.dynamics.systems.System
        The system (its noises).
    seed : int
        The root seed.
    s : int
        The repeat.
    blks : list of int
        The blocks' indices.
    n_max : int
        The trajectories drawn per client.
    T : int
        Trajectory length.
    shared_noise : bool
        Every client draws the same trajectory noise.
    size : int
        The clients returned (the first ones of the blocks).
    purpose : int, default=rnd.TRAJECTORY
        The streams' purpose.

    Returns
    -------
    list of numpy.ndarray
        ``x0`` (size, n_max, n_x), ``eta`` (size, n_max, T, n_u) and ``w``
        (size, n_max, T, n_w).
    """
    if shared_noise:
        out = _draw_streams(system, seed, s, [0], 1, n_max, T, purpose)
        return [np.broadcast_to(a, (size,) + a.shape[1:]) for a in out]
    parts = [_draw_streams(system, seed, s, list(run), n_draw, n_max, T, purpose)
             for n_draw, run in itertools.groupby(blks, key=rnd.block_size)]
    if len(parts) == 1:
        return [a[:size] for a in parts[0]]
    return [np.concatenate(arrays)[:size] for arrays in zip(*parts, strict=True)]


def _draw_streams(system: System, seed: int, s: int, keys: list[int], n_draw: int, n_max: int,
                  T: int, purpose: int) -> list[np.ndarray]:
    """The draws of streams ``(purpose, s, key, j)`` for ``n_draw`` clients each, client-major:
    ``x0`` (len(keys) n_draw, n_max, n_x), ``eta`` and ``w`` (len(keys) n_draw, n_max, T, .)."""
    gens = [rnd.stream(seed, purpose, s, key, j) for key in keys for j in range(n_max)]
    # (keys, n_draw, n_max, ...): client-major, as simulated; written through views in the
    # (keys, n_max, n_draw, ...) order of the streams
    K = len(keys)
    draws = [np.empty((K, n_draw, n_max) + shape) for shape in
             ((system.n_x,), (T, system.n_u), (T, system.n_w))]
    views = [a.swapaxes(1, 2) for a in draws]
    if system.batchable:
        batch = rnd.StreamBatch(gens, reserve=int(1.01 * system.expected_draws(n_draw, T)) + 64)
        system.draw(batch, n_draw, T, out=views)
    else:
        for g, (key, j) in zip(gens, itertools.product(range(K), range(n_max)), strict=True):
            system.draw(g, n_draw, T, out=[v[key, j] for v in views])
    return [a.reshape(K * n_draw, n_max, *a.shape[3:]) for a in draws]
